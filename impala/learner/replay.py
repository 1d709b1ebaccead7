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
replacement within a batch.

An `EliteReplay` (`custom` with `elite_sampling`) stores the same way and samples by how far
the learner's policy has moved from the one that acted: it draws `lambda_batch_multiplier`
times the trajectories it needs at random, runs the learner's network on them again, and
measures, per trajectory, the distance between the policy logits its actor stored (the
behaviour policy's encoding of each step, which every trajectory carries) and the network's
now (`distances`); then it picks by one of four strategies (`select`). The next batch's elite
sample is prepared in the background while the learner trains on this one ("caching"), with
the weights of that moment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import networks
from impala.configs import replay as replay_config
from impala.learner.loss import unroll
from impala.trajectory import Batch, Steps
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
    def bytes_at_capacity(capacity: int, specs) -> int:
        """What `capacity` trajectories take in memory, each of the components `specs`
        (`UnrollSpec.queue_specs()`, as the queue holds them)."""
        per_trajectory = sum(
            spec.dtype.size * int(np.prod(spec.shape, dtype=np.int64)) for spec in specs
        )
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


# Runs the learner's network on trajectories: their policy logits [T + 1, n, NUM_ACTIONS].
Encoder = Callable[[QueuedTrajectories], np.ndarray]


def make_encoder(agent: networks.Agent) -> Encoder:
    """The learner's network on stored trajectories, with its weights as they are when called."""

    @tf.function(autograph=False)
    def logits(steps: Steps, agent_state):
        # The queue holds the core state flattened (as `steps.to_batch` restores it).
        state = tf.nest.pack_sequence_as(agent.initial_state(1), agent_state)
        return unroll(agent, Batch(agent_state=state, steps=steps)).policy_logits

    return lambda queued: logits(queued.steps, list(queued.agent_state)).numpy()


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def distances(
    behaviour: np.ndarray, current: np.ndarray, dist_function: str, p: int = 2
) -> np.ndarray:
    """How far the policy `current` has moved from `behaviour` on each trajectory: logits
    [T, n, NUM_ACTIONS] each; per trajectory [n], the mean over its T steps of
      ln_norm:  the L-p norm of the logits' difference, (sum |current - behaviour|^p)^(1/p);
      cos_dist: 1 - the cosine of the angle between the two logit vectors;
      kl_div:   KL(behaviour || current) between the two softmax policies."""
    behaviour, current = behaviour.astype(np.float64), current.astype(np.float64)
    if dist_function == "ln_norm":
        per_step = (np.abs(current - behaviour) ** p).sum(axis=-1) ** (1.0 / p)
    elif dist_function == "cos_dist":
        dot = (current * behaviour).sum(axis=-1)
        norms = np.linalg.norm(current, axis=-1) * np.linalg.norm(behaviour, axis=-1)
        per_step = 1.0 - dot / np.maximum(norms, 1e-12)
    elif dist_function == "kl_div":
        log_b, log_c = _log_softmax(behaviour), _log_softmax(current)
        per_step = (np.exp(log_b) * (log_b - log_c)).sum(axis=-1)
    else:
        raise ValueError(f"unknown dist_function {dist_function!r}")
    return per_step.mean(axis=0)


def select(
    distance: np.ndarray, times_sampled: np.ndarray, count: int, strategy: str, alfa: float
) -> np.ndarray:
    """Which `count` of the candidates to replay (their indices), by `strategy`:
    strategy1: the `count` closest (lowest distance);
    strategy2: the candidates sorted by distance, split into `count` groups of consecutive
               ones, and the closest of each: close ones first, spread over the range;
    strategy3, strategy4: as 1 and 2 on a score that also prefers the least sampled,
               distance / its mean + alfa x times sampled / (its mean + 1).
    """
    score = distance
    if strategy in ("strategy3", "strategy4"):
        score = distance / max(float(distance.mean()), 1e-12) + alfa * times_sampled / (
            float(times_sampled.mean()) + 1.0
        )
    order = np.argsort(score, kind="stable")
    if strategy in ("strategy1", "strategy3"):
        return order[:count]
    return np.array([group[0] for group in np.array_split(order, count)])


class EliteReplay(StandardReplay):
    """A standard replay sampled by elite sampling (the module's docstring)."""

    def __init__(self, spec: replay_config.Replay, encode: Encoder, seed: int = 0):
        super().__init__(spec.capacity, seed)
        self._spec = spec
        self._encode = encode
        self.last_distances = np.zeros(0)  # of the trajectories the last sample took

    def sample(self, count: int) -> QueuedTrajectories:
        if not 0 < count <= self._size:
            raise ValueError(f"cannot sample {count} of {self._size} stored trajectories")
        spec = self._spec
        candidates = min(self._size, spec.lambda_batch_multiplier * count)
        slots = self._random.choice(self._size, size=candidates, replace=False)
        drawn = _queued([stored[slots] for stored in self._rows])
        current = self._encode(drawn)
        behaviour = np.asarray(drawn.steps.policy_logits)
        distance = distances(behaviour[:-1], current[:-1], spec.dist_function, spec.p)
        chosen = select(
            distance,
            self._times_sampled[slots].astype(np.float64),
            count,
            spec.elite_sampling_strategy,
            spec.alfa_annealing_factor,
        )
        picked = slots[chosen]
        self._times_sampled[picked] += 1
        self.last_distances = distance[chosen]
        return _queued([stored[picked] for stored in self._rows])


class Mixer:
    """Makes each batch from the queue's share of fresh trajectories and each replay's share.

    `replays` is `--replay_parameters` read (`impala.configs.replay.parse`), with exactly one
    queue, which is where the actors' trajectories come in.
    """

    def __init__(
        self,
        replays: tuple[replay_config.Replay, ...],
        batch_size: int,
        seed: int = 0,
        encode: Encoder | None = None,
        background: bool = True,
    ):
        """Args: encode: the learner's network on stored trajectories, which elite replays
        need (`make_encoder`); background: prepare the elite replays' next samples while the
        learner trains."""
        replay_config.check_buildable(replays)
        shares = replay_config.batch_shares(replays, batch_size)
        (queue,) = [index for index, replay in enumerate(replays) if replay.type == "queue"]
        self.queue = replays[queue]  # its entry: where the actors' trajectories come in
        self.fresh_share = shares[queue]
        self.replays: list[tuple[replay_config.Replay, int, StandardReplay]] = []
        for index, (spec, share) in enumerate(zip(replays, shares, strict=True)):
            if spec.type == "standard":
                self.replays.append((spec, share, StandardReplay(spec.capacity, seed + index)))
            elif spec.type == "custom":
                if encode is None:
                    raise ValueError("an elite replay needs the learner's network (encode)")
                self.replays.append((spec, share, EliteReplay(spec, encode, seed + index)))
        self.replayed_last = 0  # trajectories the last batch took from replays
        # Per elite replay (its index in `replays`): the distances of the trajectories the last
        # batch took from it.
        self.distances_last: dict[int, np.ndarray] = {}
        self._background = background and any(spec.type == "custom" for spec in replays)
        self._prepared: dict[int, tuple[QueuedTrajectories, np.ndarray]] = {}
        self._preparing: threading.Thread | None = None
        self._failed: BaseException | None = None  # raised in the background

    def fresh_needed(self) -> int:
        """Fresh trajectories the next batch dequeues: the queue's share, and the share of
        every replay that does not hold its share yet."""
        short = sum(share for _, share, store in self.replays if store.size < share)
        return self.fresh_share + short

    def mix(self, fresh: QueuedTrajectories) -> QueuedTrajectories:
        """The batch: `fresh` (`fresh_needed()` trajectories), then each replay's sample; then
        `fresh` is stored in every replay."""
        self.close()  # the background's sample for this batch, if one is under way
        parts = [fresh]
        for index, (_, share, store) in enumerate(self.replays):
            if index in self._prepared:
                sample, self.distances_last[index] = self._prepared.pop(index)
                parts.append(sample)
            elif store.size >= share:
                parts.append(store.sample(share))
                if isinstance(store, EliteReplay):
                    self.distances_last[index] = store.last_distances
        batch = fresh
        if len(parts) > 1:
            batch = tf.nest.map_structure(tf.convert_to_tensor, concatenate(parts))
        self.replayed_last = sum(len(np.asarray(part.actor_task)) for part in parts[1:])
        for _, _, store in self.replays:
            store.add(fresh)
        if self._background:
            self._preparing = threading.Thread(target=self._prepare, daemon=True)
            self._preparing.start()
        return batch

    def _prepare(self) -> None:
        """The elite replays' samples for the next batch, taken while the learner trains."""
        try:
            for index, (_, share, store) in enumerate(self.replays):
                if isinstance(store, EliteReplay) and store.size >= share:
                    self._prepared[index] = (store.sample(share), store.last_distances)
        except BaseException as error:  # raised again in the learner's thread, by close()
            self._failed = error

    def close(self) -> None:
        """Waits for the sample under way in the background, if any."""
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
