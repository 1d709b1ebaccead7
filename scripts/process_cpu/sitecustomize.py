"""Where a test run's CPU goes, process by process: with this folder on PYTHONPATH and
IMPALA_PROCESS_CPU=<file>, every Python process appends one line to <file> as it exits: its
CPU seconds, wall seconds, whether it loaded TensorFlow and Horovod, the test it ran for
(pytest's PYTEST_CURRENT_TEST, which the processes a test starts inherit) and its command line.

  PYTHONPATH=$PWD/scripts/process_cpu IMPALA_PROCESS_CPU=/tmp/processes.tsv make test

Absolute paths, so that processes started in other folders log too. A process that a signal
ends without Python's exit handlers (SIGKILL, or SIGTERM where nothing handles it) writes
nothing; the test is the one running when the process started.
"""

import atexit
import os
import resource
import sys
import time

_OUT = os.environ.get("IMPALA_PROCESS_CPU")
_STARTED = time.monotonic()


def _write() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    fields = (
        f"{usage.ru_utime + usage.ru_stime:.2f}",
        f"{time.monotonic() - _STARTED:.1f}",
        f"{int('tensorflow' in sys.modules)}{int('horovod.tensorflow' in sys.modules)}",
        os.environ.get("PYTEST_CURRENT_TEST", "-"),
        " ".join(sys.argv)[:300].replace("\t", " ").replace("\n", " "),
    )
    try:
        with open(_OUT, "a") as out:
            out.write("\t".join(fields) + "\n")
    except OSError:
        pass


if _OUT:
    atexit.register(_write)
