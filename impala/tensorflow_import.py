"""TensorFlow without the Keras and setuptools it loads as it imports.

TensorFlow imports Keras 3 (and matplotlib with it) for Keras' users: 0.8 of the 2.8 CPU seconds
its import takes on a 2-core machine, and 65 MB. Nothing here uses Keras but Horovod's module,
which only learners of several load (`impala.learner.world`). Asking TensorFlow for the legacy
tf_keras instead, which is not installed, makes it skip the import. While the variable is set,
tf.keras (and tf.losses, tf.metrics, tf.optimizers, tf.initializers) fail with "Keras cannot be
imported": code here does not use them. A value the user set is kept.

TensorFlow also runs `import distutils` (to add `distutils.sysconfig`'s site-packages folder to
those it searches for plugins). In a virtual environment with setuptools (which building Horovod
needs), setuptools' import hook answers with its own copy, and that imports all of setuptools:
0.2 CPU seconds more. Where Python has its own distutils (3.11 and before), TensorFlow gets that
one instead: it does not load `distutils.sysconfig`, so TensorFlow searches only the folders on
`sys.path`, which hold site-packages already. Python 3.12 has none, and the hook stays.
"""

import importlib.machinery
import os
import sys

SWITCH = "TF_USE_LEGACY_KERAS"


def leave_out_keras() -> None:
    """Before TensorFlow loads: this process and the processes it starts load no Keras."""
    os.environ.setdefault(SWITCH, "1")


def without_keras():
    """TensorFlow, imported without Keras if not yet imported; the processes this one starts
    afterwards (learners of several among them) are not affected."""
    if "tensorflow" not in sys.modules:
        user_set = SWITCH in os.environ
        leave_out_keras()
        standard_distutils()
        try:
            import tensorflow  # noqa: F401
        finally:
            if not user_set:
                del os.environ[SWITCH]
    return sys.modules["tensorflow"]


def standard_distutils() -> None:
    """Before TensorFlow loads: `import distutils` finds Python's own, not setuptools' copy,
    where Python has one."""
    hook = sys.modules.get("_distutils_hack")
    if hook is None or "distutils" in sys.modules:
        return
    # Only Python's own is a top-level `distutils` on the path (setuptools' is
    # setuptools._distutils, which the hook hands out under that name).
    if importlib.machinery.PathFinder.find_spec("distutils") is not None:
        getattr(hook, "remove_shim", lambda: None)()
