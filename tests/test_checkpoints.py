"""Checkpoints: round trip, crash-safe "latest", refusing another run's checkpoint, and a real
learner stopped with SIGTERM that resumes where it stopped."""

import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
from conftest import read_text, wait_until
from tensorflow.python.checkpoint import checkpoint_management

import checkpoints
import learner
import networks
from actor import Steps
from run_local import free_ports

# Frames: one learner step is 4 trajectories x 5 agent steps x 1 frame = 20 frames.
BUDGET = 6_000
IDENTITY = {"level_name": "CartPole-v1", "agent_name": "MLPAgent", "num_actions": 2}


def _trainer(seed):
    tf.random.set_seed(seed)
    agent = networks.make_agent("MLPAgent", 2)
    networks.build_variables(agent, (4,), np.float32)
    trainer = learner.Learner(agent, learner.LearnerConfig())
    trainer.create_optimizer_slots()
    return agent, trainer


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _train_a_little(agent, trainer):
    rng = np.random.default_rng(0)
    batch = learner.Batch(
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
    learner_flags = ["--job_name=learner", f"--logdir={run_dir}", *common]

    first = processes.experiment("learner_1", *learner_flags)
    actor = processes.experiment("actor", "--job_name=actor", "--task=0", *common)
    wait_until(lambda: "  step " in processes.log(first), 120, lambda: processes.log(first))
    first.send_signal(signal.SIGTERM)
    assert processes.wait(first, 60) == 130, processes.log(first)
    stopped = json.loads(read_text(run_dir / "learner_0.json"))
    assert stopped["stopped_early"] and 0 < stopped["frames"] < BUDGET
    assert f"at {stopped['frames']} frames, weight version {stopped['weights_version']}" in (
        processes.log(first)
    )

    second = processes.experiment("learner_2", *learner_flags)
    assert processes.wait(second, 300) == 0, processes.log(second)
    log = processes.log(second)
    assert (
        f"{stopped['frames']} frames done, weight version {stopped['weights_version']}, "
        f"weights sha256 {stopped['weights_sha256']}" in log
    )
    finished = json.loads(read_text(run_dir / "learner_0.json"))
    assert finished["frames"] >= BUDGET and not finished["stopped_early"]
    assert finished["steps"] == (BUDGET - stopped["frames"] + 19) // 20
    assert finished["weights_version"] == stopped["weights_version"] + finished["steps"]
    assert processes.wait(actor, 60) == 0  # it reconnected to the restarted learner
