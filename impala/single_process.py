"""IMPALA in one process: one actor and one learner sharing the agent, taking turns.

The same environment, network, actor and loss code as the distributed system, with no transport in
between: useful to check a set-up quickly, to debug a network or an environment, and as the
reference the distributed path is compared with. With no policy lag the V-trace corrections are 1,
so this is synchronous advantage actor-critic with IMPALA's loss.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import networks
from impala import envs
from impala.actor.actor import Actor
from impala.build import environment_and_agent
from impala.configs import DEFAULT_AGENT_NAME, LearnerConfig, check_playing_flags
from impala.learner.optimise import Trainer
from impala.progress import Progress
from impala.trajectory import stack_unrolls


@dataclasses.dataclass(frozen=True)
class LocalConfig:
    """What a single-process training run needs besides the learner's hyperparameters."""

    level_name: str = "PongNoFrameskip-v4"
    agent_name: str = DEFAULT_AGENT_NAME
    num_action_repeats: int = 1
    repeat_action_probability: float = 0.0  # Atari's sticky actions (0: none)
    frame_skip: int = 0  # Atari's frame skip (0: 4)
    frame_pooling: str = "max"  # the frame an Atari step shows: its last two's maximum, or its last
    seed: int = 0
    log_every_secs: float = 5.0
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)

    def __post_init__(self):
        check_playing_flags(
            self.num_action_repeats,
            self.seed,
            self.repeat_action_probability,
            self.frame_skip,
            self.frame_pooling,
        )


def build(config: LocalConfig) -> tuple[envs.VectorEnvironment, networks.Agent]:
    """Creates the environments and the agent; raises ValueError naming a bad flag.

    The actor steps `batch_size` environments at once, so each unroll is one whole batch.
    """
    return environment_and_agent(
        config.level_name,
        config.agent_name,
        num_envs=config.learner.batch_size,
        seed=config.seed,
        num_action_repeats=config.num_action_repeats,
        repeat_action_probability=config.repeat_action_probability,
        frame_skip=config.frame_skip,
        frame_pooling=config.frame_pooling,
    )


def train(
    config: LocalConfig,
    env: envs.VectorEnvironment,
    agent: networks.Agent,
    report: Callable[[str], None] = logging.info,
) -> Progress:
    """Trains until the frame budget is spent; returns the final progress (frames, scores)."""
    actor = Actor(env, agent, config.learner.unroll_length, seed=config.seed)
    learner = Trainer(agent, config.learner)
    progress = Progress(config.learner.total_environment_frames)
    frames_per_batch = config.learner.unroll_length * env.num_envs * env.frames_per_step
    report(
        f"training {config.agent_name} on {config.level_name} in one process: "
        f"{frames_per_batch} emulator frames per batch "
        f"({env.frames_per_step} frames per agent step)"
    )
    next_report = time.monotonic() + config.log_every_secs
    while not progress.done:
        batch = stack_unrolls([actor.unroll()])
        learner.learn(batch, progress.frames)
        progress.add_frames(frames_per_batch)
        progress.add_episode_returns(s.episode_return for s in actor.pop_episode_stats())
        if time.monotonic() >= next_report or progress.done:
            report(progress.line())
            next_report = time.monotonic() + config.log_every_secs
    return progress
