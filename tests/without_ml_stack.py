"""Runs a script with the ML stack unimportable, to show that a launcher does not need it.

    python -m tests.without_ml_stack SCRIPT.py [ARGS...]
    python -m tests.without_ml_stack --refuse=horovod experiment.py --job_name=actor ...

Only this process is affected: the processes a launcher starts import what they need.
"""

import importlib.abc
import runpy
import sys

# What the frontend and run_local.py must run without (a laptop, a login node).
ML_STACK = ("tensorflow", "horovod", "sonnet", "gymnasium", "ale_py", "cv2")


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self._names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self._names:
            raise ImportError(f"{fullname} is made unimportable by tests.without_ml_stack")
        return None


def run(script: str, argv: list[str], refused=ML_STACK) -> None:
    sys.meta_path.insert(0, _Refuse(refused))
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    args = sys.argv[1:]
    refused = ML_STACK
    if args and args[0].startswith("--refuse="):
        refused = tuple(args.pop(0).removeprefix("--refuse=").split(","))
    run(args[0], args[1:], refused)
