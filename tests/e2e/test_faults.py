"""A run that survives its faults: run_local.py's actors are SIGKILLed 50 times and one of its two
learners once; the run still reaches its budget with identical learners, losing at most one
save interval. Runs `benchmarks/faults.py`, which the README's reliability figures come from."""

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def test_fifty_actor_kills_and_a_learner_kill_cost_at_most_one_save_interval(tmp_path):
    out = tmp_path / "faults.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.faults",
            "--actor_kills=50",
            "--frames=30000",
            "--save_every_secs=7",  # not in step with the 5 s progress lines
            "--timeout_secs=540",  # then it stops the run and fails, before pytest's limit
            f"--logdir={tmp_path}",
            f"--out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["actor_kills"] >= 50
    assert figures["actor_restarts"] >= 50 and figures["actors_given_up"] == 0
    assert (figures["learner_kills"], figures["learner_restarts"]) == (1, 1)
    assert figures["budget_reached"] and figures["frames"] == [figures["frames"][0]] * 2
    assert figures["learners_identical"]
    # Lost: what the learners had done since their last checkpoint (seconds are whole).
    assert 0 <= figures["training_secs_lost"] <= figures["save_every_secs"] + 1
    assert figures["frames_lost"] >= 0
    assert figures["learner_recovery_secs"] is not None
    assert len(figures["actor_recovery_secs"]) >= 40  # actors that acted again after a kill
    assert "[faults] actor kills survived: " in completed.stdout
