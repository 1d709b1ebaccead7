"""Checkpoints: round trip, crash-safe "latest", refusing another run's checkpoint, and a real
learner stopped with SIGTERM that resumes where it stopped."""

import json
import os
import signal
import subprocess
import sys

import cv2
import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, read_text, wait_until
from tensorflow.python.checkpoint import checkpoint_management

import networks
import plot
from impala import configs, trajectory
from impala.launch.single_host import free_ports
from impala.learner import checkpoints, optimise
from impala.trajectory import Steps

# Frames: one learner step is 4 trajectories x 5 agent steps x 1 frame = 20 frames.
BUDGET = 6_000
IDENTITY = {"level_name": "CartPole-v1", "agent_name": "MLPAgent", "num_actions": 2}


def _trainer(seed):
    tf.random.set_seed(seed)
    agent = networks.make_agent("MLPAgent", 2)
    networks.build_variables(agent, (4,), np.float32)
    trainer = optimise.Trainer(agent, configs.LearnerConfig())
    trainer.create_optimizer_slots()
    return agent, trainer


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _train_a_little(agent, trainer):
    rng = np.random.default_rng(0)
    batch = trajectory.Batch(
        agent_state=(),
        steps=Steps(
            prev_action=np.zeros((4, 3), np.int32),
            reward=rng.normal(size=(4, 3)).astype(np.float32),
            done=np.zeros((4, 3), bool),
            observation=rng.normal(size=(4, 3, 4)).astype(np.float32),
            action=rng.integers(0, 2, (4, 3)).astype(np.int32),
            policy_logits=np.zeros((4, 3, 2), np.float32),
        ),
    )
    trainer.step(batch, frames=0)


def test_round_trip_restores_weights_optimizer_state_and_counters(tmp_path):
    agent, trainer = _trainer(seed=0)
    _train_a_little(agent, trainer)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2)
    path = saver.save(frames=12_345, version=7)
    saved = _values(agent.variables), _values(trainer.optimizer.variables)

    fresh_agent, fresh_trainer = _trainer(seed=1)
    assert not np.allclose(_values(fresh_agent.variables)[0], saved[0][0])
    loader = checkpoints.Checkpointer(
        str(tmp_path), fresh_agent, fresh_trainer.optimizer, IDENTITY, keep=2
    )
    assert loader.restore_latest() == path
    for restored, original in zip(_values(fresh_agent.variables), saved[0], strict=True):
        np.testing.assert_array_equal(restored, original)
    for restored, original in zip(
        _values(fresh_trainer.optimizer.variables), saved[1], strict=True
    ):
        np.testing.assert_array_equal(restored, original)
    assert (int(loader.frames), int(loader.version)) == (12_345, 7)


def test_keeps_only_the_last_checkpoints(tmp_path):
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2)
    for version in range(1, 5):
        saver.save(frames=version * 100, version=version)
    indexes = sorted(name for name in os.listdir(tmp_path) if name.endswith(".index"))
    assert indexes == ["ckpt-3.index", "ckpt-4.index"]


def test_a_write_interrupted_before_it_completes_never_becomes_latest(tmp_path, monkeypatch):
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    good = saver.save(frames=100, version=1)
    good_weights = _values(agent.variables)

    _train_a_little(agent, trainer)

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash while writing a checkpoint")

    # The data files of checkpoint 2 get written; the process dies before "latest" moves.
    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        saver.save(frames=200, version=2)
    monkeypatch.undo()
    assert any(name.startswith("ckpt-2") for name in os.listdir(tmp_path))

    fresh_agent, fresh_trainer = _trainer(seed=1)
    loader = checkpoints.Checkpointer(
        str(tmp_path), fresh_agent, fresh_trainer.optimizer, IDENTITY, keep=3
    )
    assert loader.restore_latest() == good
    assert int(loader.frames) == 100
    for restored, original in zip(_values(fresh_agent.variables), good_weights, strict=True):
        np.testing.assert_array_equal(restored, original)


def test_refuses_a_checkpoint_from_another_environment_naming_both(tmp_path):
    agent, trainer = _trainer(seed=0)
    checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=1).save(1, 1)
    other = dict(IDENTITY, level_name="Acrobot-v1")
    loader = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, other, keep=1)
    with pytest.raises(
        checkpoints.CheckpointMismatchError,
        match="level_name: the checkpoint has 'CartPole-v1', this run has 'Acrobot-v1'",
    ):
        loader.restore_latest()


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
    ]
    run_dir = tmp_path / "run"
    learner_flags = ["--job_name=learner", f"--logdir={tmp_path}", "--experiment=run", *common]

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
    finished = json.loads(read_text(run_dir / "learner_0.json"))
    assert finished["frames"] >= BUDGET and not finished["stopped_early"]
    assert finished["steps"] == (BUDGET - stopped["frames"] + 19) // 20
    assert finished["weights_version"] == stopped["weights_version"] + finished["steps"]
    assert finished["training_secs"] > stopped["training_secs"] > 0
    assert processes.wait(actor, 60) == 0  # it reconnected to the restarted learner
    _check_curves_continue_across_the_resume(run_dir, stopped, finished)
    _check_plot(run_dir, tmp_path / "curves.png")


def _check_curves_continue_across_the_resume(run_dir, stopped, finished):
    """TensorBoard: one event file per start, curves over frames that go on after the resume."""
    assert len(plot.event_files(str(run_dir))) == 2
    scalars = plot.read_scalars(str(run_dir))
    for tag in (
        "loss/total",
        "loss/policy_gradient",
        "loss/baseline",
        "loss/entropy",
        "optimizer/gradient_norm",
        "optimizer/learning_rate",
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
    assert np.all((queued >= 0) & (queued <= 16))
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
