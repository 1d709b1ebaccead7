"""Helpers shared by several test modules."""

import os

import numpy as np
import tensorflow as tf

import networks
from impala import configs
from impala.learner import checkpoints, optimise


def save_checkpoints(
    run_dir,
    level_name="CartPole-v1",
    agent_name="MLPAgent",
    versions=(3, 7),
    shape=(4,),
    num_actions=None,
    frames_per_step=None,
    frame_pooling=None,
) -> list[list[np.ndarray]]:
    """Writes checkpoints as the learner does (weights, optimizer, counters, identity);
    returns each one's weights. Without `frames_per_step` the identity is one kept before
    frames per step were (the game's default frame skip); without `frame_pooling`, one kept
    before the frame pooling was (the maximum of a step's last two frames)."""
    dtype = "float32" if len(shape) == 1 else "uint8"
    if num_actions is None:
        num_actions = 2 if level_name == "CartPole-v1" else 4  # Breakout's
    agent = networks.make_agent(agent_name, num_actions)
    networks.build_variables(agent, shape, dtype)
    trainer = optimise.Trainer(agent, configs.LearnerConfig())
    trainer.create_optimizer_slots()
    identity = {
        "level_name": level_name,
        "agent_name": type(agent).__name__,
        "num_actions": num_actions,
        "observation_shape": list(shape),
        "observation_dtype": dtype,
        "num_action_repeats": 1,
    }
    if frames_per_step is not None:
        identity["frames_per_step"] = frames_per_step
    if frame_pooling is not None:
        identity["frame_pooling"] = frame_pooling
    saver = checkpoints.Checkpointer(
        os.path.join(run_dir, "checkpoints"), agent, trainer.optimizer, identity, keep=3
    )
    weights = []
    for version in versions:
        for variable in agent.trainable_variables:
            # Other weights for each checkpoint, still close to a fresh network's: large
            # ones would make a near-deterministic policy that may never press FIRE.
            variable.assign_add(tf.random.normal(variable.shape, stddev=0.01, seed=version))
        saver.save(frames=100 * version, version=version)
        weights.append([v.numpy() for v in agent.variables])
    return weights
