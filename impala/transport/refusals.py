"""What a learner refuses, and why: the reasons, the checks that find them, and their counts.

A refused call is answered `wire.REFUSED` (or UNAUTHENTICATED, for the secret) and counted by
reason (`wire.REFUSAL_REASONS`), so that nothing an actor sends can stop the learner and the
learner can say what it refused (`LearnerService.refusals`).
"""

from __future__ import annotations

import threading

import numpy as np

from impala.trajectory import (
    MAX_ABS_CORE_STATE,
    MAX_ABS_EPISODE_RETURN,
    MAX_ABS_POLICY_LOGIT,
    MAX_ABS_REWARD,
    Steps,
)
from impala.transport.wire import REFUSAL_REASONS, UnrollSpec

# Refusal reasons, by index into `REFUSAL_REASONS`.
(
    WRONG_SECRET,
    NOT_OUR_TASK,
    MALFORMED,
    ACTION_OUT_OF_RANGE,
    NON_FINITE,
    NEGATIVE_VERSION,
    OUT_OF_BOUNDS,
    TOO_MANY_EPISODES,
) = range(len(REFUSAL_REASONS))


class RefusedError(Exception):
    """A request refused for `REFUSAL_REASONS[reason]`."""

    def __init__(self, reason: int):
        super().__init__(REFUSAL_REASONS[reason])
        self.reason = reason


class RefusalCounts:
    """Calls refused, by reason; counted from the server's threads at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = [0] * len(REFUSAL_REASONS)

    def count(self, reason: int) -> None:
        with self._lock:
            self._counts[reason] += 1

    def count_wrong_secret(self) -> None:
        self.count(WRONG_SECRET)

    def by_reason(self) -> dict[str, int]:
        with self._lock:
            return dict(zip(REFUSAL_REASONS, self._counts, strict=True))


def check_trajectories(spec: UnrollSpec, weight_version: int, steps: Steps, agent_state) -> None:
    """Raises `RefusedError` with the first reason to refuse these trajectories.

    The layout fixed their shapes; this checks what it cannot: the actions' range, `done`
    flags that are booleans, finite numbers within the bounds the loss needs
    (`impala/trajectory.py` says why each) and a weight version.
    """
    for actions in (steps.action, steps.prev_action):
        if actions.size and (actions.min() < 0 or actions.max() >= spec.num_actions):
            raise RefusedError(ACTION_OUT_OF_RANGE)
    if steps.done.size and steps.done.max() > 1:
        raise RefusedError(MALFORMED)
    bounded = [(steps.reward, MAX_ABS_REWARD), (steps.policy_logits, MAX_ABS_POLICY_LOGIT)]
    bounded += [(s, MAX_ABS_CORE_STATE) for s in agent_state if s.dtype.kind == "f"]
    if spec.observation_dtype.startswith("float"):
        bounded.append((steps.observation, np.inf))
    for values, bound in bounded:
        if not np.isfinite(values).all():
            raise RefusedError(NON_FINITE)
        if values.size and np.abs(values).max() > bound:
            raise RefusedError(OUT_OF_BOUNDS)
    if weight_version < 0:
        raise RefusedError(NEGATIVE_VERSION)


def check_episodes(returns, steps, frames, start_frames) -> None:
    """Raises `RefusedError` with the first reason to refuse these episodes' [K] fields:
    negative counts, or returns that are not finite or beyond `MAX_ABS_EPISODE_RETURN`."""
    if (steps < 0).any() or (frames < 0).any() or (start_frames < -1).any():
        raise RefusedError(MALFORMED)
    if not np.isfinite(returns).all():
        raise RefusedError(NON_FINITE)
    if np.abs(returns).max() > MAX_ABS_EPISODE_RETURN:
        raise RefusedError(OUT_OF_BOUNDS)
