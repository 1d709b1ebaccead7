"""IMPALA in one process: one actor and one learner sharing the agent, taking turns.

The same environment, network, actor and loss code as the distributed system, with no transport in
between: useful to check a set-up quickly, to debug a network or an environment, and as the
reference the distributed path is compared with. Every step is decided with the weights the learner
then trains (the next unroll's first step is decided again after each update): with no policy
lag the V-trace corrections are 1 (at a batch's first pass), so this is synchronous advantage
actor-critic with IMPALA's loss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import networks
from impala import envs
from impala.actor.actor import Actor
from impala.build import environment_and_agent
from impala.configs import LocalConfig
from impala.learner.optimise import Trainer
from impala.progress import Progress
from impala.trajectory import stack_unrolls

__all__ = ["LocalConfig", "build", "train"]


def build(config: LocalConfig) -> tuple[envs.VectorEnvironment, networks.Agent]:
    """Creates the environments and the agent; raises ValueError naming a bad flag.

    The actor steps `batch_size` environments at once, so each unroll is one whole batch.
    """
    game = config.game
    return environment_and_agent(
        game, config.agent_name, config.learner.batch_size, game.seed, config.compute_dtype
    )


def train(
    config: LocalConfig,
    env: envs.VectorEnvironment,
    agent: networks.Agent,
    report: Callable[[str], None] = logging.info,
) -> Progress:
    """Trains until the frame budget is spent; returns the final progress (frames, scores)."""
    actor = Actor(env, agent, config.learner.unroll_length, seed=config.game.seed)
    learner = Trainer(agent, config.learner, seed=config.game.seed)
    progress = Progress(config.learner.total_environment_frames)
    frames_per_batch = config.learner.unroll_length * env.num_envs * env.frames_per_step
    report(
        f"training {config.agent_name} on {config.game.level_name} in one process: "
        f"{frames_per_batch} emulator frames per batch "
        f"({env.frames_per_step} frames per agent step)"
    )
    next_report = time.monotonic() + config.log_every_secs
    while not progress.done:
        batch = stack_unrolls([actor.unroll()])
        learner.learn(batch, progress.frames)
        actor.decide_first_step_again()  # the next unroll's first step too, by these weights
        progress.add_frames(frames_per_batch)
        progress.add_episode_returns(s.episode_return for s in actor.pop_episode_stats())
        if time.monotonic() >= next_report or progress.done:
            report(progress.line())
            next_report = time.monotonic() + config.log_every_secs
    return progress
