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
        rates = (self.env, self.inference, self.train)
        return 1.0 / sum(
            1.0 / (stage.steps_per_second * (fresh if stage is self.train else 1.0))
            for stage in rates
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
