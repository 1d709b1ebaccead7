"""The episodes actors report, waiting for the learner to read them.

Bounded in count and in rate, so that no caller makes the learner's bookkeeping stall it: a
report that would pass either bound is refused whole (`refusals.TOO_MANY_EPISODES`).
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

import numpy as np

from impala.transport.refusals import TOO_MANY_EPISODES, RefusedError

# Episodes waiting for the learner to read them; episodes are also accepted at most at this
# rate (a burst of the waiting bound).
MAX_WAITING_EPISODES = 10_000
MAX_EPISODES_PER_SEC = 2_000.0


class EpisodeBatch(NamedTuple):
    """Episodes reported by actors: [K] arrays of real game returns, agent steps, frames and
    the frames each game began with (`envs.EpisodeStats.start_frames`, -1 where none)."""

    actor_task: np.ndarray
    episode_return: np.ndarray
    episode_steps: np.ndarray
    episode_frames: np.ndarray
    start_frames: np.ndarray


_EMPTY = EpisodeBatch(
    np.zeros([0], np.int32),
    np.zeros([0], np.float32),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
)


class EpisodeInbox:
    """Reports put by the server's threads, popped by the learner; safe from several threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._episodes: list[tuple] = []
        self._waiting = 0
        self._tokens = _TokenBucket(MAX_EPISODES_PER_SEC, MAX_WAITING_EPISODES)

    def put(self, actor_task: int, returns, steps, frames, start_frames) -> None:
        """Keeps one report's episodes ([K] fields, checked) until `pop`.

        Raises:
          RefusedError: TOO_MANY_EPISODES, if they would pass the count or the rate bound.
        """
        count = len(returns)
        with self._lock:
            if self._waiting + count > MAX_WAITING_EPISODES:
                raise RefusedError(TOO_MANY_EPISODES)
            if not self._tokens.take(count):
                raise RefusedError(TOO_MANY_EPISODES)
            task = np.full(count, actor_task, np.int32)
            self._episodes.append((task, returns, steps, frames, start_frames))
            self._waiting += count

    def pop(self) -> EpisodeBatch:
        """Episodes put since the last call (never blocks)."""
        with self._lock:
            episodes, self._episodes, self._waiting = self._episodes, [], 0
        fields = zip(*episodes, strict=True) if episodes else [[e] for e in _EMPTY]
        return EpisodeBatch(
            *(
                np.concatenate(field).astype(empty.dtype)
                for field, empty in zip(fields, _EMPTY, strict=True)
            )
        )


class _TokenBucket:
    """Allows `rate` units a second, in bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float):
        self._rate, self._burst = rate, burst
        self._tokens, self._when = burst, time.monotonic()

    def take(self, units: float) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._when) * self._rate)
        self._when = now
        if units > self._tokens:
            return False
        self._tokens -= units
        return True
