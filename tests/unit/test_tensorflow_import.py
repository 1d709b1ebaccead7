"""TensorFlow imported without Keras, in a fresh process (this one has TensorFlow already)."""

import os
import subprocess
import sys

from tests.helpers import ROOT

_CHECK = """
import os, sys
from impala import tensorflow_import
tf = tensorflow_import.without_keras()
print(tf.__name__, "keras" in sys.modules, os.environ.get("TF_USE_LEGACY_KERAS"))
"""


def test_tensorflow_loads_without_keras_and_the_processes_started_after_are_not_affected():
    env = {name: value for name, value in os.environ.items() if name != "TF_USE_LEGACY_KERAS"}
    completed = subprocess.run(
        [sys.executable, "-c", _CHECK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.stdout.split() == ["tensorflow", "False", "None"], completed.stderr
