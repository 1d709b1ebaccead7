"""Each stage of the pipeline measured alone, on this machine: an actor's environments, the policy
on an actor's batch, the learner's train step. Flag-free, so that `benchmarks.throughput`,
`benchmarks.train_stage` and `benchmarks.scaling` share it (each defines its own flags).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import tensorflow as tf

import networks
from impala import build, configs, trajectory
from impala.learner import optimise
from impala.trajectory import Steps


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage measured alone: agent steps per second, and CPU seconds per agent step (every
    thread of this process counted)."""

    steps_per_second: float
    cpu_per_step: float


def timed(step, seconds: float, steps_per_call: float, warmup: int = 3) -> Stage:
    """`step`'s rate and CPU cost, after a few untimed calls (tracing, caches); each call does
    `steps_per_call` agent steps of work."""
    for _ in range(warmup):
        step()
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        step()
        calls += 1
    cpu_per_call = (time.process_time() - cpu) / calls
    calls_per_second = calls / (time.perf_counter() - start)
    return Stage(calls_per_second * steps_per_call, cpu_per_call / steps_per_call)


def measure_env(
    level: str,
    num_envs: int,
    num_action_repeats: int,
    seconds: float,
    repeat_action_probability: float = 0.0,
    frame_skip: int = 0,
    frame_pooling: str = "max",
):
    """One actor's environments with random actions, measured, and their specs."""
    with build.environment(
        level,
        num_envs,
        num_action_repeats=num_action_repeats,
        repeat_action_probability=repeat_action_probability,
        frame_skip=frame_skip,
        frame_pooling=frame_pooling,
    ) as env:
        env.reset()
        rng = np.random.default_rng(0)

        def step():
            env.step(rng.integers(0, env.num_actions, num_envs))

        return (
            timed(step, seconds, steps_per_call=num_envs),
            env.num_actions,
            env.observation_shape,
            env.observation_dtype,
            env.frames_per_step,
        )


def measure_inference(agent, shape, dtype, num_envs: int, seconds: float) -> Stage:
    """Observations through the policy, batched as an actor batches them."""
    inputs = networks.dummy_inputs(shape, dtype, batch_size=num_envs)
    state = agent.initial_state(num_envs)
    policy = tf.function(lambda i, s: agent(i, s))

    def step():
        output, _ = policy(inputs, state)
        output.policy_logits.numpy()

    return timed(step, seconds, steps_per_call=num_envs)


def train_batch(agent, shape, dtype, config: configs.LearnerConfig) -> trajectory.Batch:
    """A [T + 1, B] batch of random observations of `shape`, as actors send them."""
    num_steps, batch = config.unroll_length + 1, config.batch_size
    rng = np.random.default_rng(0)
    observation = rng.integers(0, 255, (num_steps, batch, *shape)).astype(dtype)
    return trajectory.Batch(
        agent_state=agent.initial_state(batch),
        steps=Steps(
            prev_action=np.zeros((num_steps, batch), np.int32),
            reward=rng.normal(size=(num_steps, batch)).astype(np.float32),
            done=np.zeros((num_steps, batch), bool),
            observation=observation,
            action=np.zeros((num_steps, batch), np.int32),
            policy_logits=np.zeros((num_steps, batch, agent.num_actions), np.float32),
        ),
    )


def measure_train(agent, shape, dtype, config: configs.LearnerConfig, seconds: float) -> Stage:
    """Agent steps of new experience the learner consumes: T x B per `learn` call, which
    takes `config.batch_reuse` passes of `config.num_batches_per_epoch` steps."""
    data = train_batch(agent, shape, dtype, config)
    trainer = optimise.Trainer(agent, config)
    return timed(
        lambda: trainer.learn(data, frames=0),
        seconds,
        steps_per_call=config.unroll_length * config.batch_size,
    )
