"""What one learner process holds while it trains: `Learning`, everything it trains with, built
once by `start.start`, and `Counters`, what it has done so far."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

import networks
from impala import transport
from impala.configs import LearnerJobConfig
from impala.learner import allreduce, saving
from impala.learner.optimise import Trainer
from impala.learner.population import Population
from impala.learner.replay import Mixer
from impala.learner.summaries import Summaries
from impala.progress import thread_core_waits


@dataclasses.dataclass(frozen=True)
class EnvInfo:
    """What the learner read from one environment of the run's game."""

    num_actions: int
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    frames_per_step: int
    frame_pooling: str


@dataclasses.dataclass
class Counters:
    """What the learner has done so far."""

    version: int = 0
    steps: int = 0
    # Optimisation steps skipped because their loss or gradients were not finite (the same on
    # every learner: they skip together), and finished games left out of the statistics for a
    # return that is not finite or beyond `MAX_ABS_EPISODE_RETURN`.
    skipped_steps: int = 0
    episodes_ignored: int = 0
    trajectories_by_actor: Counter = dataclasses.field(default_factory=Counter)
    refusals_reported: dict[str, int] = dataclasses.field(default_factory=dict)
    # When the first step ended, and the frames then: the steady-state rate is measured from
    # there, leaving out start-up, waiting for actors and tracing the train step.
    first_step_time: float | None = None
    first_step_frames: int = 0
    last_step_time: float | None = None
    # This process's CPU seconds (all its threads: the train step's and the RPC server's) at
    # the end of the first step and of the last.
    first_step_cpu: float = 0.0
    last_step_cpu: float = 0.0
    # Each thread's nanoseconds waiting for a core (`progress.thread_core_waits`) at the end of
    # the first step and when training ended (read once each: off the per-step path); None
    # where the kernel does not say.
    first_step_core_waits: dict[str, int] | None = None
    end_core_waits: dict[str, int] | None = None
    # Where the learner's time went in the steps after the first (the steady-state window):
    # waiting for a full batch, in the optimisation steps, and everything else (gathering the
    # learners' states and games, publishing weights, checkpoints, reports).
    waiting_secs: float = 0.0
    train_secs: float = 0.0
    other_secs: float = 0.0
    # Training time before this start (from the checkpoint), and when this start began.
    earlier_training_secs: float = 0.0
    started: float = dataclasses.field(default_factory=time.monotonic)

    def training_secs(self) -> float:
        return self.earlier_training_secs + time.monotonic() - self.started

    def end_step(self, frames: int) -> None:
        """Notes when a step ended, at `frames` frames; the first step's is kept too."""
        self.last_step_time = time.monotonic()
        self.last_step_cpu = time.process_time()
        if self.first_step_time is None:
            self.first_step_time = self.last_step_time
            self.first_step_frames = frames
            self.first_step_cpu = self.last_step_cpu
            self.first_step_core_waits = thread_core_waits()

    def add_step_times(self, started: float, waited: float, trained: float) -> None:
        """Adds a step's time (begun at `started`) to the steady window's, after the first."""
        if self.steps > 1:
            self.waiting_secs += waited
            self.train_secs += trained
            self.other_secs += time.monotonic() - started - waited - trained

    def steady_rate(self, frames: int) -> float | None:
        """Frames per second (all learners) from the end of the first step to the end of the
        last, `frames` frames into the run."""
        if self.first_step_time is None or self.last_step_time == self.first_step_time:
            return None
        return (frames - self.first_step_frames) / (self.last_step_time - self.first_step_time)


@dataclasses.dataclass
class Learning:
    """Everything one learner trains with; built once by `start.start`."""

    config: LearnerJobConfig
    topology: allreduce.Topology
    agent: networks.Agent
    trainer: Trainer
    service: transport.LearnerService
    env_info: EnvInfo
    counters: Counters
    saver: saving.Saver
    report: Callable[[str], None]  # rank 0's report; other ranks' is silent
    summaries: Summaries | None  # rank 0 with a run folder only
    run_dir: str  # '' without --logdir
    start_frames: int  # the frames done when this start began (from the checkpoint)
    resumed_from: str | None  # the checkpoint this start resumed from
    mixer: Mixer | None = None  # with --replay_parameters: mixes each batch from the replays
    population: Population | None = None  # with --with_pbt: this policy's part in PBT

    @property
    def frames_per_trajectory(self) -> int:
        return self.config.learner.unroll_length * self.env_info.frames_per_step
