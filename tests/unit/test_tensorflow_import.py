"""TensorFlow imported without Keras and setuptools, in a fresh process (this one has TensorFlow
already)."""

import os
import subprocess
import sys

from tests.helpers import ROOT

_CHECK = """
import os, sys
from impala import tensorflow_import
tf = tensorflow_import.without_keras()
print(tf.__name__, "keras" in sys.modules, os.environ.get("TF_USE_LEGACY_KERAS"))
# TensorFlow's `import distutils` got Python's own, not setuptools' copy with all of setuptools.
print("setuptools" in sys.modules, "site-packages" in sys.modules["distutils"].__file__)
"""


def test_tensorflow_loads_without_keras_or_setuptools_and_later_processes_are_not_affected():
    env = {name: value for name, value in os.environ.items() if name != "TF_USE_LEGACY_KERAS"}
    completed = subprocess.run(
        [sys.executable, "-c", _CHECK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.stdout.split() == [
        *("tensorflow", "False", "None"),
        *("False", "False"),
    ], completed.stderr
