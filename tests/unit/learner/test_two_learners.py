"""Two learners under mpirun skip a step together when one learner's batch is not finite
(`tests/two_learners_step.py` is what each rank runs)."""

import json
import os
import subprocess
import sys

import pytest

from impala.launch import planning
from tests.helpers import ROOT


@pytest.mark.slow
def test_when_one_learners_batch_is_not_finite_both_skip_the_step_and_stay_identical(tmp_path):
    """And with fp16 gradients or shuffled minibatches, sound batches keep them identical."""
    command = [sys.executable, "-u", "-m", "tests.two_learners_step", str(tmp_path)]
    argv = planning.mpirun_command(["localhost"] * 2, command, as_root=os.geteuid() == 0)
    completed = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1))
    # Rank 1 got the batch (its gradients NaN, and so the average every learner
    # applies), or a loss that alone is not finite (which only rank 1 sees, and tells rank 0):
    # both skip both of the batch's steps, their weights and optimizer state untouched.
    for scenario in ("issue", "loss_only"):
        for rank in (first, second):
            assert rank[scenario]["skipped_steps"] == 2, (scenario, rank)
            assert rank[scenario]["unchanged"] and rank[scenario]["finite"], (scenario, rank)
        assert first[scenario]["sha256"] == second[scenario]["sha256"]
    # Sound batches on both: applied on both, identically; so too with the gradients sent in
    # half precision (which changes the weights a little) and in minibatches that each learner
    # shuffles its own way (the same number of steps on every learner).
    # Asynchronous gradients (each step applies the average of the step before's, the last
    # applied at the end) keep them identical too, at weights of their own.
    for scenario in ("sound", "fp16", "minibatches", "asynchronous"):
        for rank in (first, second):
            assert rank[scenario]["skipped_steps"] == 0, (scenario, rank)
            assert not rank[scenario]["unchanged"] and rank[scenario]["finite"], (scenario, rank)
        assert first[scenario]["sha256"] == second[scenario]["sha256"], scenario
    assert first["fp16"]["sha256"] != first["sound"]["sha256"]
    assert first["asynchronous"]["sha256"] != first["sound"]["sha256"]
