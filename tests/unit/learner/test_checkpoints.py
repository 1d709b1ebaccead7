"""Checkpoints: round trip, crash-safe "latest", refusing another run's checkpoint (a real
learner stopped and resumed is in tests/e2e/test_resume.py)."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management

import networks
from impala import configs, trajectory
from impala.learner import checkpoints, optimise
from impala.trajectory import Steps

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
