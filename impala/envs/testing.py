"""Test environments: `impala/Counter-v0`, whose observations encode a step counter.

Importing this module registers `impala/Counter-v0` (`CounterEnv`), a tiny deterministic
environment for fast tests of the actor/learner plumbing; `decode_counter` and
`decode_episode_step` read its observations back. `catch.py` holds `impala/Catch-v0`, a
small game for learning tests.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from impala.envs.config import ATARI_OBSERVATION_SHAPE

COUNTER_LEVEL = "impala/Counter-v0"

# The counter env stores each value in 4 base-256 digits (bytes).
_COUNTER_DIGITS = 4


class CounterEnv(gym.Env):
    """A deterministic env whose observations encode a step counter.

    The observation is all zeros except its first 8 values (in C order): the
    env's global step count since creation, then the step within the episode,
    each as 4 little-endian base-256 digits (so counts above 255 survive uint8).
    `reset()` does not advance the global count, so under same-step auto-reset
    the observations an agent sees count up by exactly one per step, across
    episode boundaries (by `num_action_repeats` with action repeats). Read them
    back with `decode_counter` and `decode_episode_step`.

    Reward: 1.0 on every `reward_period`-th step of an episode, or, when
    `rewarded_action` is set, 1.0 exactly when that action is taken (a trivially
    learnable task for end-to-end tests). Episodes end after `episode_length`
    steps.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's convention.

    def __init__(
        self,
        observation_shape: tuple[int, ...] = ATARI_OBSERVATION_SHAPE,
        num_actions: int = 4,
        episode_length: int = 10,
        reward_period: int = 3,
        rewarded_action: int | None = None,
    ) -> None:
        shape = tuple(int(size) for size in observation_shape)
        if int(np.prod(shape)) < 2 * _COUNTER_DIGITS:
            raise ValueError(f"observation_shape {shape} must hold at least 8 values")
        if num_actions < 1 or episode_length < 1 or reward_period < 1:
            raise ValueError("num_actions, episode_length and reward_period must be >= 1")
        if rewarded_action is not None and not 0 <= rewarded_action < num_actions:
            raise ValueError(
                f"rewarded_action must be in [0, {num_actions}), got {rewarded_action}"
            )
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(num_actions)
        self._episode_length = episode_length
        self._reward_period = reward_period
        self._rewarded_action = rewarded_action
        self._count = 0
        self._episode_step = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._episode_step = 0
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._count += 1
        self._episode_step += 1
        if self._rewarded_action is None:
            rewarded = self._episode_step % self._reward_period == 0
        else:
            rewarded = int(action) == self._rewarded_action
        terminated = self._episode_step >= self._episode_length
        return self._observation(), float(rewarded), terminated, False, {}

    def _observation(self) -> np.ndarray:
        values = np.zeros(self.observation_space.shape, np.uint8)
        flat = values.reshape(-1)
        flat[:_COUNTER_DIGITS] = _to_digits(self._count)
        flat[_COUNTER_DIGITS : 2 * _COUNTER_DIGITS] = _to_digits(self._episode_step)
        return values


def _to_digits(value: int) -> list[int]:
    """Little-endian base-256 digits of `value` modulo 2**32."""
    return [(value >> (8 * digit)) & 0xFF for digit in range(_COUNTER_DIGITS)]


def _from_digits(observation: np.ndarray, observation_rank: int, offset: int) -> int | np.ndarray:
    """Decodes 4 base-256 digits starting at flat `offset` of each observation."""
    observation = np.asarray(observation)
    if observation.ndim < observation_rank:
        raise ValueError(
            f"observation has rank {observation.ndim}, less than observation_rank "
            f"{observation_rank}"
        )
    batch_shape = observation.shape[: observation.ndim - observation_rank]
    digits = observation.reshape(*batch_shape, -1)[..., offset : offset + _COUNTER_DIGITS]
    weights = 256 ** np.arange(_COUNTER_DIGITS, dtype=np.int64)
    values = (digits.astype(np.int64) * weights).sum(axis=-1)
    return int(values) if not batch_shape else values


def decode_counter(observation: np.ndarray, observation_rank: int = 3) -> int | np.ndarray:
    """The global step count encoded in `impala/Counter-v0` observations.

    Args:
        observation: One observation (e.g. [84, 84, 4]) or any batch of them
            (e.g. [N, 84, 84, 4] or [T, N, 84, 84, 4]).
        observation_rank: Rank of ONE observation (3 for the default shape);
            leading axes beyond it are batch axes.

    Returns:
        An int for one observation, else int64 array of the batch shape.
    """
    return _from_digits(observation, observation_rank, offset=0)


def decode_episode_step(observation: np.ndarray, observation_rank: int = 3) -> int | np.ndarray:
    """The step within the episode encoded in `impala/Counter-v0` observations.

    0 on the first observation of an episode. Arguments as `decode_counter`.
    """
    return _from_digits(observation, observation_rank, offset=_COUNTER_DIGITS)


if COUNTER_LEVEL not in gym.registry:  # Re-imports must not re-register (it warns).
    gym.register(id=COUNTER_LEVEL, entry_point=CounterEnv)
