"""Replay mixing through the distributed path (run_local.py: a learner and an actor over gRPC):
Catch learned with half of each batch replayed by elite sampling; the batches' shares, the
frames counted, what the learner says about its replays."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from impala.envs import catch
from impala.launch import planning, ports
from tests.helpers import ROOT, run_local_argv

# The elite example, smaller, with the candidates of the Pong runs (2 per trajectory):
# the learner's network runs again on them.
MIX = (
    '[{"type": "custom", "capacity": 64, "sample_ratio": 0.5, "dist_function": "ln_norm",'
    ' "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 2,'
    ' "alfa_annealing_factor": 2.0},'
    ' {"type": "queue", "capacity": 1, "sample_ratio": 0.5}]'
)


FRAMES = 16_000


@pytest.mark.slow
def test_catch_is_learned_with_half_of_each_batch_replayed_counting_only_fresh_frames(tmp_path):
    runs = tmp_path / "runs"
    completed = subprocess.run(
        run_local_argv(
            runs,
            "--experiment=replay",
            "--num_actors=1",
            *catch.QUICK_LEARNING_FLAGS,  # batches of 8 unrolls of 10 steps
            f"--total_environment_frames={FRAMES}",
            f"--replay_parameters={MIX}",
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    run_dir = runs / "replay"
    summary = json.loads((run_dir / "learner_0.json").read_text())
    # 16,000 frames are 1,600 fresh trajectories of 10 frames: the first batch all 8 fresh (the
    # replay empty), then 4 fresh and 4 replayed a step, so 1 + 1,592 / 4 = 399 steps.
    assert summary["frames"] == FRAMES
    assert sum(summary["trajectories_by_actor"].values()) == 1600
    assert summary["steps"] == 399
    # Catch learned from pixels with the learning test's settings (tests/e2e/test_policies.py),
    # half of each batch replayed and corrected by V-trace: 1.0 from about 12k frames. Means over
    # 20 consecutive games: 18 catches in 20 at best, and at the end at least 10 (0.0), which a
    # random policy's 2 or 3 never reach (a learned policy's last 20 swing from run to run: 0.2
    # in one of the learning test's, two progress lines after 0.7).
    assert summary["best_mean_return"] >= 0.8 and summary["mean_return"] >= 0.0, summary
    log = (run_dir / "learners.log").read_text()
    assert (
        "replays: the queue gives 4 of each batch of 8 fresh trajectories; custom of 64 "
        "trajectories (" in log
    )
    assert re.search(r"replayed 4/8: custom 64/64 \(sampled \d+\.\dx, distance \d+\.\d{3}\)", log)
    (events,) = [name for name in os.listdir(run_dir) if name.startswith("events.")]
    tags = {
        value.tag
        for event in tf.compat.v1.train.summary_iterator(str(run_dir / events))
        for value in event.summary.value
    }
    assert {"replay/replayed_share", "replay/1_custom/fill"} <= tags
    assert {"replay/1_custom/times_sampled_mean", "replay/1_custom/distance_mean"} <= tags


def test_two_learners_on_a_host_are_refused_replays_that_fit_only_one(processes, tmp_path):
    """Each learner keeps its own replays and they check at the same time, before either fills:
    the check counts every learner of the host, not its own replays alone."""
    with open("/proc/meminfo") as meminfo:
        available = next(int(line.split()[1]) * 1024 for line in meminfo if "MemAvailable" in line)
    # An Atari trajectory of 20 steps is about 0.59 MB in a replay (566 MiB per 1,000): a
    # capacity of 0.7 of the free memory for each learner fits once, not twice.
    capacity = int(0.7 * available / 593_000)
    mix = (
        '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
        f' {{"type": "standard", "capacity": {capacity}, "sample_ratio": 0.5}}]'
    )
    # Two learners under mpirun, and no actors: the learners refuse before they serve (had
    # they not, the test's teardown kills their process group).
    hosts = [f"localhost:{port}" for port in ports.free_ports(2)]
    learner = [
        sys.executable,
        "-u",
        os.path.join(ROOT, "experiment.py"),
        "--job_name=learner",
        f"--learner_hosts={','.join(hosts)}",
        f"--logdir={tmp_path}",
        "--experiment=too-big",
        "--level_name=PongNoFrameskip-v4",
        f"--replay_parameters={mix}",
    ]
    mpirun = planning.mpirun_command(["localhost"] * 2, learner, as_root=os.geteuid() == 0)
    started = processes.start("learners", mpirun)
    assert processes.wait(started, timeout=120) != 0
    output = processes.log(started)
    refusal = re.search(
        r"--replay_parameters: the replays would hold (\d+\.\d) GiB \((\d+\.\d) GiB in each of "
        r"the 2 learners on this host\) at capacity, more than the (\d+\.\d) GiB this machine "
        r"has free; .*run fewer learners on this host",
        output,
    )
    assert refusal, output[-3000:]
    both, each, free = (float(figure) for figure in refusal.groups())
    assert each < free < both, refusal[0]  # one learner's would have fit
    assert not (tmp_path / "too-big" / "flags.json").exists()  # a refused start saves no flags
