"""The compute-bound ceiling of the three stages measured alone (`benchmarks.stages`), for
`benchmarks.throughput`. Flag-free and TensorFlow-free, so that tests import it beside
experiment.py's flags."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from impala.configs import replay as replay_config

if TYPE_CHECKING:
    from benchmarks.stages import Stage


@dataclasses.dataclass(frozen=True)
class Stages:
    """The three stages, each measured alone."""

    env: Stage
    inference: Stage
    train: Stage

    def ceiling_fresh(self, fresh: float = 1.0) -> float:
        """Agent steps/s of a pipeline doing the three one after another, when a `fresh`
        fraction of each batch is new experience (the rest replayed)."""
        return 1.0 / (
            1.0 / self.env.steps_per_second
            + 1.0 / self.inference.steps_per_second
            + 1.0 / (self.train.steps_per_second * fresh)
        )


def fresh_fraction(replay_parameters: str, batch_size: int) -> float:
    """The share of a batch the actors' new trajectories make: 1, or with
    `--replay_parameters` the queue's share (`impala.configs.replay.batch_shares`)."""
    replays = replay_config.parse(replay_parameters)
    if not replays:
        return 1.0
    shares = replay_config.batch_shares(replays, batch_size)
    (fresh,) = [s for r, s in zip(replays, shares, strict=True) if r.type == "queue"]
    return fresh / batch_size


@dataclasses.dataclass(frozen=True)
class PerBatch:
    """One learner batch end to end, as `progress.cpu_line` takes it.

    Attributes:
      stage_cpu: CPU seconds of the stages alone for the batch: "train" (the whole batch) and
        "play" (the env and inference stages, for its fresh trajectories only: the actors
        play no replayed one).
      unrolls: the actors' unrolls the batch takes (its fresh trajectories / environments per
        actor).
      seconds: wall-clock seconds per batch at the end-to-end speed, which counts fresh
        steps only.
    """

    stage_cpu: dict[str, float]
    unrolls: float
    seconds: float


def per_batch(
    unroll_length: int,
    batch_size: int,
    fresh: float,
    num_envs_per_actor: int,
    end_to_end: float,
    train_cpu_per_step: float,
    play_cpu_per_step: float,
) -> PerBatch:
    """A batch of `batch_size` trajectories of `unroll_length` steps, a `fresh` share of them
    new, at `end_to_end` fresh agent steps/s; the stages' CPU seconds per agent step."""
    batch_steps = unroll_length * batch_size
    fresh_steps = batch_steps * fresh
    return PerBatch(
        stage_cpu={
            "train": train_cpu_per_step * batch_steps,
            "play": play_cpu_per_step * fresh_steps,
        },
        unrolls=batch_size * fresh / num_envs_per_actor,
        seconds=fresh_steps / end_to_end,
    )
