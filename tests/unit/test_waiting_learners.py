"""benchmarks.waiting_learners' parts that need no learner: its one-line flag errors, and how it
finds the learners of a run (benchmarks.run_processes) and reads their CPU. (Its real run, two
learners under mpirun, is its command's: docs/throughput-history.md has the figures.)"""

import subprocess
import sys

import pytest

from benchmarks import run_processes, waiting_learners
from tests.helpers import ROOT, wait_until


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_learners=1"], "flag --num_learners=1: 1 is not integer >= 2"),
        (["--seconds=0"], "flag --seconds=0: 0.0 is not number >= 0.1"),
        (["now"], "unexpected arguments: now"),
    ],
)
def test_bad_flags_are_one_line_errors(argv, message):
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.waiting_learners", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert completed.stderr == f"waiting_learners.py: error: {message}\n"


def test_the_learners_of_a_run_are_found_by_their_command_line_and_their_cpu_read(tmp_path):
    logdir = str(tmp_path)
    script = tmp_path / "experiment.py"
    script.write_text("import time\nend = time.time() + 30\nwhile time.time() < end: pass\n")
    argv = [sys.executable, "-u", str(script), "--job_name=learner", f"--logdir={logdir}"]
    learner = subprocess.Popen(argv)
    other = subprocess.Popen([*argv[:3], "--job_name=actor", f"--logdir={logdir}"])
    # What mpirun's own command line looks like: it holds the learners'.
    launcher = subprocess.Popen(["sleep", "30", *argv])
    try:
        assert run_processes.experiment_pids("learner", f"--logdir={logdir}") == [learner.pid]
        assert run_processes.experiment_pids("learner", f"--logdir={logdir}x") == []
        # It spins: its CPU seconds grow.
        before = waiting_learners._cpu_seconds(learner.pid)
        wait_until(
            lambda: waiting_learners._cpu_seconds(learner.pid) >= before + 0.05, 10, "no CPU read"
        )
    finally:
        for process in (learner, other, launcher):
            process.kill()
            process.wait()
    assert waiting_learners._cpu_seconds(learner.pid) == 0.0  # gone
