"""Replay mixing (`--replay_parameters`): each batch takes its queue's share of fresh
trajectories and each replay's share of stored ones.

The actors' trajectories come in through the learner's queue (the transport's store) as
always. A batch dequeues the fresh ones it needs, samples each replay for its share, and then
stores every fresh trajectory in every replay, so that a replay holds trajectories the learner
has trained on once, and replays them later with their behaviour policy's logits: V-trace
corrects them against the learner's policy as it corrects a lagging actor's.

Until a replay holds its share, the batch takes the missing trajectories fresh from the queue,
so a batch always has `batch_size` trajectories and the first ones are all fresh.

A `StandardReplay` keeps up to `capacity` trajectories in NumPy arrays in the learner's
memory (frames stay uint8), the oldest replaced first, and samples uniformly, without
replacement within a batch. Only the learner's training thread touches it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from impala.configs import replay as replay_config
from impala.trajectory import Steps
from impala.transport import QueuedTrajectories


def _rows(queued: QueuedTrajectories) -> list[np.ndarray]:
    """A batch's components, batch-major: [B, ...] each (steps [B, T + 1, ...])."""
    steps = [np.swapaxes(np.asarray(field), 0, 1) for field in queued.steps]
    return [
        np.asarray(queued.actor_task),
        np.asarray(queued.weight_version),
        *steps,
        *(np.asarray(state) for state in queued.agent_state),
    ]


def _queued(rows: list[np.ndarray]) -> QueuedTrajectories:
    """`_rows`' inverse."""
    num_steps = len(Steps._fields)
    actor_task, weight_version, *rest = rows
    steps = Steps(*(np.swapaxes(field, 0, 1) for field in rest[:num_steps]))
    return QueuedTrajectories(actor_task, weight_version, list(rest[num_steps:]), steps)


def concatenate(parts: list[QueuedTrajectories]) -> QueuedTrajectories:
    """The trajectories of `parts`, in order, as one batch."""
    rows = [_rows(part) for part in parts]
    return _queued([np.concatenate(column) for column in zip(*rows, strict=True)])


class StandardReplay:
    """Up to `capacity` trajectories, the oldest replaced first, sampled uniformly."""

    def __init__(self, capacity: int, seed: int = 0):
        self.capacity = capacity
        self._rows: list[np.ndarray] | None = None  # allocated at the first trajectory
        self._next = 0  # the slot the next trajectory goes to
        self._size = 0
        self._times_sampled = np.zeros(capacity, np.int64)
        self._random = np.random.default_rng(seed)

    @property
    def size(self) -> int:
        return self._size

    @staticmethod
    def bytes_at_capacity(capacity: int, example: QueuedTrajectories) -> int:
        """What `capacity` trajectories like `example`'s take in memory."""
        per_trajectory = sum(row[0].nbytes for row in _rows(example))
        return capacity * per_trajectory

    def add(self, queued: QueuedTrajectories) -> None:
        """Stores the batch's trajectories, replacing the oldest when full."""
        rows = _rows(queued)
        count = len(rows[0])
        if self._rows is None:
            self._rows = [np.empty((self.capacity, *row.shape[1:]), row.dtype) for row in rows]
        slots = (self._next + np.arange(count)) % self.capacity
        for stored, row in zip(self._rows, rows, strict=True):
            stored[slots] = row
        self._times_sampled[slots] = 0
        self._next = int((self._next + count) % self.capacity)
        self._size = min(self.capacity, self._size + count)

    def sample(self, count: int) -> QueuedTrajectories:
        """`count` stored trajectories (at most `size`), drawn uniformly without replacement."""
        if not 0 < count <= self._size:
            raise ValueError(f"cannot sample {count} of {self._size} stored trajectories")
        slots = self._random.choice(self._size, size=count, replace=False)
        self._times_sampled[slots] += 1
        return _queued([stored[slots] for stored in self._rows])

    def times_sampled(self) -> np.ndarray:
        """How often each stored trajectory has been sampled, [size]."""
        return self._times_sampled[: self._size].copy()


class Mixer:
    """Makes each batch from the queue's share of fresh trajectories and each replay's share.

    `replays` is `--replay_parameters` read (`impala.configs.replay.parse`), with exactly one
    queue, which is where the actors' trajectories come in.
    """

    def __init__(self, replays: tuple[replay_config.Replay, ...], batch_size: int, seed: int = 0):
        replay_config.check_buildable(replays)
        shares = replay_config.batch_shares(replays, batch_size)
        (queue,) = [index for index, replay in enumerate(replays) if replay.type == "queue"]
        self.fresh_share = shares[queue]
        self.replays = [
            (spec, share, StandardReplay(spec.capacity, seed + index))
            for index, (spec, share) in enumerate(zip(replays, shares, strict=True))
            if spec.type != "queue"
        ]
        self.replayed_last = 0  # trajectories the last batch took from replays

    def fresh_needed(self) -> int:
        """Fresh trajectories the next batch dequeues: the queue's share, and the share of
        every replay that does not hold its share yet."""
        short = sum(share for _, share, store in self.replays if store.size < share)
        return self.fresh_share + short

    def mix(self, fresh: QueuedTrajectories) -> QueuedTrajectories:
        """The batch: `fresh` (`fresh_needed()` trajectories), then each replay's sample; then
        `fresh` is stored in every replay."""
        parts = [fresh]
        for _, share, store in self.replays:
            if store.size >= share:
                parts.append(store.sample(share))
        batch = fresh
        if len(parts) > 1:
            batch = tf.nest.map_structure(tf.convert_to_tensor, concatenate(parts))
        self.replayed_last = sum(len(np.asarray(part.actor_task)) for part in parts[1:])
        for _, _, store in self.replays:
            store.add(fresh)
        return batch
