"""Fixtures for tests that start real processes (the shared helpers are in tests/helpers.py)."""

import os
import resource
import shutil
import subprocess
import uuid

import pytest

# TensorFlow's C++ info logs (oneDNN notices, RPC servers shutting down) would bury test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # computed as experiment.py's processes do

from tests.fake_runs import save_checkpoints
from tests.helpers import ROOT, Processes

# IMPALA_TEST_CPU=<file>: each test's CPU seconds, its own and those of the child processes it
# waited for (processes in tmux sessions are not its children), appended to <file>: where the
# suite's time goes on a machine of few cores. A module fixture counts with its first test.
_CPU_LOG = os.environ.get("IMPALA_TEST_CPU")


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before = _cpu_seconds()
        yield
        with open(_CPU_LOG, "a") as log:
            log.write(f"{_cpu_seconds() - before:.2f} {item.nodeid}\n")


# The longest test files, with their seconds in an idle `make test` (2026-12-06, 17:27 UTC,
# rounded to 5).
# pytest-xdist's loadfile gives a worker the next file in collection order whenever it is down
# to its last two tests (with --no-loadscope-reorder, as `make test` runs it; by default it
# puts the files with the most tests first, which left the long end-to-end files, few tests
# each, to start near the end). Collected longest first, no long file starts near the end and
# the short ones fill the gaps.
LONG_FILES = {
    "tests/e2e/test_benchmarks.py": 215,
    "tests/e2e/test_distributed.py": 145,
    "tests/e2e/test_faults.py": 120,
    "tests/e2e/test_policies.py": 120,
    "tests/e2e/test_frontend_ssh.py": 85,
    "tests/e2e/test_scaling.py": 70,
    "tests/e2e/test_replay.py": 55,
    "tests/e2e/test_resume.py": 50,
    "tests/e2e/test_frontend_local.py": 45,
    "tests/e2e/test_attacks.py": 35,
    "tests/e2e/test_throughput_bench.py": 30,
    "tests/unit/transport/test_transport.py": 30,
    "tests/unit/learner/test_learner.py": 25,
    "tests/e2e/test_mode_test.py": 25,
    "tests/unit/learner/test_checkpoints.py": 20,
    "tests/unit/evaluation/test_evaluation.py": 20,
}


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONG_FILES), every file's tests in their own order."""
    items.sort(key=lambda item: -LONG_FILES.get(item.nodeid.split("::")[0], 0))


@pytest.fixture
def processes(tmp_path):
    started = Processes(str(tmp_path))
    yield started
    started.kill_all()


@pytest.fixture
def run_name():
    """A fresh run name for the CSV frontend; the run's folder and tmux sessions (named after
    it) are removed afterwards, whatever a failed test left."""
    name = f"test_{uuid.uuid4().hex[:8]}"
    yield name
    shutil.rmtree(os.path.join(ROOT, "runs", name), ignore_errors=True)
    subprocess.run(
        [
            "bash",
            "-c",
            f"tmux ls -F '#S' 2>/dev/null | grep {name} | xargs -r -n1 tmux kill-session -t",
        ],
        check=False,
    )


@pytest.fixture
def cartpole_run(tmp_path):
    """A run folder with two CartPole checkpoints as a learner writes them, and their weights."""
    run_dir = str(tmp_path / "run")
    return run_dir, save_checkpoints(run_dir)
