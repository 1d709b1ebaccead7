"""A run stopped and started again: a learner stopped with SIGTERM resumes where it stopped,
with its curves going on and its files its owner's only; a start that fails leaves the run's
saved flags alone; a resume with another preset is refused."""

import json
import os
import re
import signal
import stat
import subprocess
import sys

import cv2
import numpy as np
import pytest

from impala import curves, run_folder
from impala.launch.ports import free_ports
from impala.learner import checkpoints
from tests.helpers import ROOT, read_text, wait_until

# Frames: a learner step takes 4 trajectories x 5 agent steps x 1 frame = 20 fresh frames when
# its replay is empty (a start's first step), then 2 fresh and 2 replayed: 10 (the default mix).
BUDGET = 2_000


@pytest.mark.slow
def test_learner_stopped_by_sigterm_resumes_where_it_stopped(processes, tmp_path):
    (port,) = free_ports(1)
    common = [
        f"--learner_hosts=localhost:{port}",
        "--level_name=impala/Counter-v0",
        "--agent_name=MLPAgent",
        "--unroll_length=5",
        "--batch_size=4",
        "--num_envs_per_actor=2",
        f"--total_environment_frames={BUDGET}",
        # Annealed from the start over the budget: the rate falls in a visible way.
        "--learning_rate_anneal_frames=0",
        "--learning_rate_cooldown_fraction=0",
    ]
    run_dir = tmp_path / "run"
    # A run folder as runs made them before they were private: the learner makes it its own.
    run_dir.mkdir()
    os.chmod(run_dir, 0o755)
    # One recent checkpoint, and one past every 1000 frames: the stop's is kept after the end's.
    learner_flags = [
        "--job_name=learner",
        f"--logdir={tmp_path}",
        "--experiment=run",
        "--keep_checkpoints=1",
        "--keep_checkpoint_every_frames=1000",
        *common,
    ]

    first = processes.experiment("learner_1", *learner_flags)
    actor = processes.experiment("actor", "--job_name=actor", "--task=0", *common)
    wait_until(lambda: "  step " in processes.log(first), 120, lambda: processes.log(first))
    # No more trajectories: the learner cannot reach its budget before the signal, however
    # fast this machine (it can still train on what is queued, a few steps).
    actor.send_signal(signal.SIGSTOP)
    first.send_signal(signal.SIGTERM)
    assert processes.wait(first, 60) == 130, processes.log(first)
    actor.send_signal(signal.SIGCONT)
    stopped = json.loads(read_text(run_dir / "learner_0.json"))
    assert stopped["stopped_early"] and 0 < stopped["frames"] < BUDGET
    assert f"at {stopped['frames']} frames, weight version {stopped['weights_version']}" in (
        processes.log(first)
    )

    saved_flags = json.loads(read_text(run_dir / "flags.json"))
    assert saved_flags["experiment"] == "run" and saved_flags["batch_size"] == 4

    # The second start changes one flag that does not affect what a checkpoint holds.
    second = processes.experiment("learner_2", *learner_flags, "--entropy_cost=0.02")
    assert processes.wait(second, 300) == 0, processes.log(second)
    log = processes.log(second)
    assert "exists: resuming it, with changed flags: --entropy_cost: 0.01 -> 0.02" in log
    assert (
        f"{stopped['frames']} frames done, weight version {stopped['weights_version']}, "
        f"weights sha256 {stopped['weights_sha256']}" in log
    )
    # The progress lines count steps since the run began: the first one after the resume
    # goes on from where the first start stopped.
    assert re.findall(r"^\S+   step (\d+) \|", log, re.M)[0] == str(stopped["weights_version"] + 1)
    finished = json.loads(read_text(run_dir / "learner_0.json"))
    assert finished["frames"] >= BUDGET and not finished["stopped_early"]
    # The replay starts empty again on the resume: 20 fresh frames, then 10 a step.
    assert finished["steps"] == 1 + (BUDGET - stopped["frames"] - 20 + 9) // 10
    assert finished["weights_version"] == stopped["weights_version"] + finished["steps"]
    assert finished["training_secs"] > stopped["training_secs"] > 0
    kept, _ = checkpoints.listed(str(run_dir / "checkpoints"))
    assert [os.path.basename(path) for path in kept] == [
        f"ckpt-{stopped['weights_version']}",
        f"ckpt-{finished['weights_version']}",
    ]
    # Nothing was skipped or left out; versions go on from the stop's (it was a clean one), and
    # the record of those published says where the run ended.
    assert (finished["skipped_steps"], finished["episodes_ignored"]) == (0, 0)
    published = run_dir / "checkpoints" / checkpoints.VERSIONS_FILE
    assert int(published.read_text()) == finished["weights_version"]
    assert curves.events.event_files(str(run_dir)) and os.listdir(run_dir / "checkpoints")
    _check_owner_only(run_dir)
    assert processes.wait(actor, 60) == 0  # it reconnected to the restarted learner
    # ... and said hello to it, so that the restarted learner checked it and counts it (the RPC
    # layer alone would have reconnected it unchecked, had the restart been quick).
    assert "reconnecting" in processes.log(actor)
    assert re.search(r"^\S+   step \d+ .*\| actors 1 \(back 0x\)$", log, re.M), log
    _check_curves_continue_across_the_resume(run_dir, stopped, finished)
    _check_plot(run_dir, tmp_path / "curves.png")


def _check_owner_only(run_dir):
    """Folders 0700 and files 0600: checkpoints, events, summaries, flags, the run folder."""
    modes = {}
    for folder, _, names in os.walk(run_dir):
        modes[folder] = stat.S_IMODE(os.stat(folder).st_mode)
        for name in names:
            modes[os.path.join(folder, name)] = stat.S_IMODE(
                os.stat(os.path.join(folder, name)).st_mode
            )
    expected = {path: 0o700 if os.path.isdir(path) else 0o600 for path in modes}
    assert modes == expected


def _check_curves_continue_across_the_resume(run_dir, stopped, finished):
    """TensorBoard: one event file per start, curves over frames that go on after the resume."""
    assert len(curves.events.event_files(str(run_dir))) == 2
    scalars = curves.events.read_scalars(str(run_dir))
    for tag in (
        "loss/total",
        "loss/policy_gradient",
        "loss/baseline",
        "loss/entropy",
        "optimizer/gradient_norm",
        "optimizer/learning_rate",
        "policy/clipped_fraction",
        "optimizer/skipped_steps",
        "progress/frames_per_sec",
        "actors/policy_lag",
        "learner_0/queue_fill",
        "learner_0/frames_received",
        "episode/length_frames",
    ):
        assert tag in scalars, sorted(scalars)
    # Counter episodes: 10 steps, rewarded on steps 3, 6 and 9.
    frames, returns = scalars["episode/return"]
    assert set(returns) == {3.0} and frames.max() <= finished["frames"]
    assert frames.min() <= stopped["frames"] < frames.max()  # points before and after the stop
    assert set(scalars["episode/length_frames"][1]) == {10.0}
    # Training time goes on from where it stopped, not from 0.
    steps, seconds = scalars["time/training_secs"]
    assert np.all(np.diff(seconds[np.argsort(steps, kind="stable")]) >= 0)
    assert seconds.max() <= finished["training_secs"]
    # The fill is trajectories queued / capacity (4 x the batch of 4 by default): a whole number
    # of trajectories out of 16, not a count, a byte size or a rate.
    queued = scalars["learner_0/queue_fill"][1] * 16
    np.testing.assert_allclose(queued, np.round(queued), atol=1e-4)
    # A chunk is let in while the queue is not full: up to one actor's 2 trajectories past it.
    assert np.all((queued >= 0) & (queued <= 16 + 2))
    learning_rates = scalars["optimizer/learning_rate"][1]
    assert np.all(np.diff(learning_rates) <= 0) and learning_rates[0] <= np.float32(
        6e-4
    )  # annealed


def _check_plot(run_dir, out):
    """The learning-curve command on this real run folder writes a PNG."""
    completed = subprocess.run(
        [sys.executable, "plot.py", str(run_dir), f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    image = cv2.imread(str(out))
    assert image is not None and image.shape[0] > 200 and image.shape[1] > 400
    assert str(out) in completed.stdout


def test_a_start_that_fails_leaves_the_runs_saved_flags_alone(processes, tmp_path):
    run_folder.write_flags(str(tmp_path / "run"), {"level_name": "PongNoFrameskip-v4"})
    (port,) = free_ports(1)
    learner = processes.experiment(
        "learner",
        "--job_name=learner",
        f"--learner_hosts=localhost:{port}",
        f"--logdir={tmp_path}",
        "--experiment=run",
        "--level_name=PongNoFrameskip-v5",  # a typo
    )
    assert processes.wait(learner, 120) == 2
    assert "'PongNoFrameskip-v5' is not a registered Gymnasium id" in processes.log(learner)
    assert run_folder.read_flags(str(tmp_path / "run")) == {"level_name": "PongNoFrameskip-v4"}


def test_run_locals_run_folder_and_logs_are_owner_only(tmp_path):
    """run_local.py's own files (the run folder, the secret, each process's log), and what its
    processes write, whatever umask it was started with."""
    completed = subprocess.run(
        [
            sys.executable,
            "run_local.py",
            f"--logdir={tmp_path}",
            "--experiment=run",
            "--num_actors=1",
            "--level_name=PongNoFrameskip-v5",  # a typo: every process stops at once
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        umask=0o002,
    )
    assert completed.returncode != 0, completed.stdout + completed.stderr
    run_dir = tmp_path / "run"
    assert sorted(os.listdir(run_dir)) == ["actor_0.log", "learners.log", "secret"]
    assert "not a registered Gymnasium id" in (run_dir / "learners.log").read_text()
    _check_owner_only(run_dir)


def test_resuming_with_another_preset_is_refused_in_one_line(tmp_path):
    run_folder.write_flags(str(tmp_path / "run"), {"preset": "", "batch_size": 16})
    completed = subprocess.run(
        [
            sys.executable,
            "run_local.py",
            f"--logdir={tmp_path}",
            "--experiment=run",
            "--preset=paper",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        f"run_local.py: error: --preset=paper: {tmp_path / 'run'} was started with --preset=; "
        "resume it without --preset (its flags are kept), or start a new run"
    )
