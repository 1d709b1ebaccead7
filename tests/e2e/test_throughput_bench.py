"""`make bench` (benchmarks.throughput) run whole, on a cheap environment: every stage measured
before and after a real end-to-end run (run_local.py: a learner and an actor over gRPC), and
the end-to-end run's policy lag, here under synchronous collection, where it must be 0."""

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

COUNTER = "impala/Counter-v0"


@pytest.mark.slow
def test_make_bench_measures_each_stage_and_the_real_system_and_its_policy_lag():
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.throughput",
            f"--level_name={COUNTER}",
            "--agent_name=MLPAgent",
            "--unroll_length=5",
            "--batch_size=4",
            "--num_envs_per_actor=4",
            "--seconds=0.2",
            "--e2e_frames=2000",
            "--num_actors=1",
            "--col_workers_communication=synchronous",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    out = completed.stdout
    assert (
        "end to end 1 learner(s) and 1 actor(s), collection synchronous, gradients synchronous"
        in out
    )
    speeds = {}
    for name in ("env (random actions)", "inference", "train step", "ceiling 1/(sum of 1/x)"):
        (line,) = [line for line in out.splitlines() if line.strip().startswith(name)]
        # Counter's agent step is one frame: each figure twice, before and after.
        before, after = (float(v.replace(",", "")) for v in re.findall(r"([\d,]+) frames/s", line))
        assert before > 0 and after > 0, line
        speeds[name] = before
    (e2e,) = re.findall(r"end to end \(steady\) +[\d,]+ agent steps/s +([\d,]+) frames/s", out)
    assert float(e2e.replace(",", "")) > 0
    # The ceiling is below its slowest stage: the three run one after another.
    assert speeds["ceiling 1/(sum of 1/x)"] < min(
        speeds[name] for name in ("env (random actions)", "inference", "train step")
    )
    # Every unroll a learner trains on was acted with the weights it holds: lag 0.
    assert re.search(
        r"policy lag end to end +median 0\.0, p95 0\.0, max 0\.0 learner steps \(over [1-9]\d* "
        r"reported steps\); \d+ stale trajectories dropped \(rank 0\)",
        out,
    ), out
    assert re.search(r"actor 0 end to end +\d+% acting", out), out
    assert re.search(r"CPU seconds per batch +learner \d", out), out
