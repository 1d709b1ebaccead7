"""The Gymnasium family: any id with a `Discrete` action space, in a `SyncVectorEnv`.

The fallback of the registry: every id that no other family serves (CartPole,
`impala/Catch-v0`, `impala/Counter-v0`, ...) runs here, with `_ActionRepeat` repeating
actions and a `TimeLimit` capping `max_episode_frames` underlying steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from impala.envs.config import EnvConfig, _Transition


class _ActionRepeat(gym.Wrapper):
    """Repeats each action `repeats` times, summing rewards, stopping at episode end.

    Adds `info["frames"]`: the underlying steps this step actually ran.
    """

    def __init__(self, env: gym.Env, repeats: int) -> None:
        super().__init__(env)
        self._repeats = repeats

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        total_reward, frames = 0.0, 0
        while frames < self._repeats:
            observation, reward, terminated, truncated, info = self.env.step(action)
            frames += 1
            total_reward += float(reward)
            if terminated or truncated:
                break
        return observation, total_reward, terminated, truncated, {**info, "frames": frames}


def _make_gym_env(config: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One non-Atari env: the id, a frame cap, then action repeats."""
    kwargs = dict(config.env_kwargs, render_mode=render_mode) if render_mode else config.env_kwargs
    try:
        env = gym.make(config.level_name, **kwargs)
    except gym.error.DependencyNotInstalled as error:
        message = str(error).strip().splitlines()[0]
        raise ValueError(
            f"--level_name {config.level_name!r} needs more packages: {message}"
        ) from None
    # Inside the repeat wrapper, so the cap counts underlying steps ("frames").
    env = gym.wrappers.TimeLimit(env, max_episode_steps=config.max_episode_frames)
    return _ActionRepeat(env, config.num_action_repeats)


class _GymBackend:
    """Steps any Discrete-action Gymnasium env in a same-step-autoreset SyncVectorEnv."""

    def __init__(self, config: EnvConfig) -> None:
        self.frames_per_step = config.num_action_repeats
        self._env = SyncVectorEnv(
            [lambda: _make_gym_env(config)] * config.num_envs,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        try:
            self.num_actions = _discrete_actions(config.level_name, self._env.single_action_space)
            self.observation_shape, self.observation_dtype = _observation_spec(
                config.level_name, self._env.single_observation_space
            )
        except ValueError:
            self._env.close()
            raise
        self._num_envs = config.num_envs

    def reset(self, seed: int | None) -> np.ndarray:
        """Starts new episodes; `seed` seeds env i with seed + i."""
        observation, _ = self._env.reset(seed=seed)
        return np.asarray(observation, self.observation_dtype)

    def step(self, actions: np.ndarray) -> _Transition:
        observation, reward, terminated, truncated, info = self._env.step(actions)
        episode_end = terminated | truncated
        return _Transition(
            observation=np.asarray(observation, self.observation_dtype),
            reward=reward.astype(np.float32),
            episode_end=episode_end,
            life_lost=np.zeros(self._num_envs, bool),
            frames=self._frames_this_step(info),
        )

    def close(self) -> None:
        self._env.close()

    def _frames_this_step(self, info: dict[str, Any]) -> np.ndarray:
        """Underlying steps run per env, from `_ActionRepeat`'s info, int64 [N]."""
        frames = np.zeros(self._num_envs, np.int64)
        # Same-step autoreset: a finished env's step info sits under "final_info",
        # the top level holds its reset info. Each key has a "_key" presence mask.
        for source in (info, info.get("final_info", {})):
            if "frames" in source:
                frames = np.where(source["_frames"], source["frames"], frames)
        return frames


def _discrete_actions(level_name: str, space: gym.Space) -> int:
    """Number of actions, or a one-line ValueError for other action spaces."""
    if not isinstance(space, gym.spaces.Discrete):
        raise ValueError(
            f"--level_name {level_name!r} has action space {space}; IMPALA here needs "
            f"a Discrete action space"
        )
    if int(space.start) != 0:
        raise ValueError(
            f"--level_name {level_name!r} has action space {space} starting at "
            f"{space.start}; actions must be numbered from 0"
        )
    return int(space.n)


def _observation_spec(level_name: str, space: gym.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Observation shape and dtype; float Boxes become float32 for the networks."""
    if isinstance(space, gym.spaces.Box):
        dtype = np.dtype(np.float32) if np.issubdtype(space.dtype, np.floating) else space.dtype
        return tuple(space.shape), dtype
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    raise ValueError(
        f"--level_name {level_name!r} has observation space {space}; only Box and "
        f"Discrete observations are supported"
    )


def serves(spec: gym.envs.registration.EnvSpec) -> bool:
    """Every registered Gymnasium id: this family comes last in the registry."""
    del spec  # Unused: any id is served.
    return True


def make_backend(config: EnvConfig, spec: gym.envs.registration.EnvSpec) -> _GymBackend:
    """The training backend for a Gymnasium id; a ValueError unless its actions are Discrete."""
    del spec  # Unused: `gymnasium.make(config.level_name)` finds it again.
    return _GymBackend(config)
