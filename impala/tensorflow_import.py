"""TensorFlow without the Keras it loads as it imports.

TensorFlow imports Keras 3 (and matplotlib with it) for Keras' users: 0.8 of the 2.8 CPU seconds
its import takes on a 2-core machine, and 65 MB. Nothing here uses Keras but Horovod's module,
which only learners of several load (`impala.learner.world`). Asking TensorFlow for the legacy
tf_keras instead, which is not installed, makes it skip the import. While the variable is set,
tf.keras (and tf.losses, tf.metrics, tf.optimizers, tf.initializers) fail with "Keras cannot be
imported": code here does not use them. A value the user set is kept.
"""

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
        try:
            import tensorflow  # noqa: F401
        finally:
            if not user_set:
                del os.environ[SWITCH]
    return sys.modules["tensorflow"]
