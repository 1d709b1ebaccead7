"""The evaluation backend: one whole Gymnasium env per game, stepped in turn, with its screen.

`make_evaluation_environment(config, render=True)` builds the same games as the training
backends, but as whole Gymnasium envs stepped one by one in Python, slower but able to show
each env's screen (`VectorEnvironment.render`, for videos). For Atari that is Gymnasium's own
ALE env under `AtariPreprocessing` (`atari._make_atari_game`), arranged to give the very
observations `AtariVectorEnv` gives; any other id is built as `gym_vector._make_gym_env`
builds it.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np

from impala.envs.atari import _atari_game, _lives_lost, _make_atari_game, _to_nhwc
from impala.envs.config import (
    ATARI_FRAMES_PER_SECOND,
    ATARI_OBSERVATION_SHAPE,
    EnvConfig,
    _Transition,
)
from impala.envs.gym_vector import _discrete_actions, _make_gym_env, _observation_spec


def _check_can_render(spec: gym.envs.registration.EnvSpec) -> None:
    """A one-line ValueError unless the id has an `rgb_array` render mode."""
    creator = spec.entry_point
    if isinstance(creator, str):
        creator = gym.envs.registration.load_env_creator(creator)
    if "rgb_array" not in getattr(creator, "metadata", {}).get("render_modes", []):
        raise ValueError(
            f"--level_name {spec.id!r} cannot show its screen (it has no 'rgb_array' render "
            f"mode), so its games cannot be recorded"
        )


class _SerialBackend:
    """One Gymnasium env per game, stepped in turn in Python, each able to show its screen.

    Slower than the training backends, but every env is a whole Gymnasium env with
    `render()`. Auto-resets on the same step like them; with `render`, the last screen of
    a game that ended is kept (`render(final=True)`) before its env starts the next one.
    """

    def __init__(self, config: EnvConfig, spec: gym.envs.registration.EnvSpec, render: bool):
        self._level_name = config.level_name
        self._atari = _atari_game(spec) is not None
        if render and not self._atari:
            _check_can_render(spec)
        self._keep_screens = render
        if self._atari:
            make_env = functools.partial(_make_atari_game, config)
        else:
            make_env = functools.partial(_make_gym_env, config, "rgb_array" if render else None)
        self._envs: list[gym.Env] = []
        try:
            for _ in range(config.num_envs):
                self._envs.append(make_env())
            self._describe(config)
        except BaseException:
            self.close()
            raise
        self._lives = np.zeros(config.num_envs, np.int64)
        self._start_frames = np.zeros(config.num_envs, np.int64)
        self._final_screens: dict[int, np.ndarray] = {}

    def _describe(self, config: EnvConfig) -> None:
        env = self._envs[0]
        self.num_actions = _discrete_actions(config.level_name, env.action_space)
        if self._atari:
            self.frames_per_step = config.atari_frames_per_step
            self.observation_shape = ATARI_OBSERVATION_SHAPE
            self.observation_dtype = np.dtype(np.uint8)
            fps = ATARI_FRAMES_PER_SECOND
        else:
            self.frames_per_step = config.num_action_repeats
            self.observation_shape, self.observation_dtype = _observation_spec(
                config.level_name, env.observation_space
            )
            fps = env.metadata.get("render_fps")
        self.screen_fps = fps / self.frames_per_step if fps else None

    def reset(self, seed: int | None) -> np.ndarray:
        """Starts new games; `seed` seeds env i with seed + i."""
        observations = []
        for index, env in enumerate(self._envs):
            observation, info = env.reset(seed=None if seed is None else seed + index)
            observations.append(observation)
            self._lives[index] = info.get("lives", 0)
            self._note_start(index, env)
        self._final_screens.clear()
        return self._batch(observations)

    def step(self, actions: np.ndarray) -> _Transition:
        self._final_screens.clear()
        num_envs = len(self._envs)
        observations = []
        reward = np.zeros(num_envs, np.float32)
        episode_end = np.zeros(num_envs, bool)
        lives = np.zeros(num_envs, np.int64)
        frames = np.zeros(num_envs, np.int64)
        for index, env in enumerate(self._envs):
            observation, reward[index], terminated, truncated, info = env.step(int(actions[index]))
            episode_end[index] = terminated or truncated
            frames[index] = info["frames"]
            if episode_end[index]:
                if self._keep_screens:
                    self._final_screens[index] = self._screen(env)
                observation, info = env.reset()
                self._note_start(index, env)
            lives[index] = info.get("lives", 0)  # the new game's, where one ended
            observations.append(observation)
        life_lost = _lives_lost(lives, self._lives, episode_end)
        self._lives = lives
        return _Transition(
            observation=self._batch(observations),
            reward=reward,
            episode_end=episode_end,
            life_lost=life_lost,
            frames=frames,
        )

    def ram(self) -> np.ndarray:
        """Each console's 128 bytes of memory, uint8 [N, 128] (Atari only)."""
        return np.stack([console.getRAM() for console in self._consoles()])

    def start_frames(self) -> np.ndarray | None:
        """The no-op and FIRE frames each running game began with, int64 [N]; None for a
        game that is not Atari's."""
        return self._start_frames.copy() if self._atari else None

    def _note_start(self, index: int, env) -> None:
        if self._atari:
            self._start_frames[index] = env.unwrapped.ale.getEpisodeFrameNumber()

    def episode_frames(self) -> np.ndarray:
        """Emulator frames each console has run in its current game, int64 [N] (Atari only)."""
        return np.array([console.getEpisodeFrameNumber() for console in self._consoles()])

    def _consoles(self) -> list:
        """Each game's ALE interface; a one-line ValueError for a game that is not Atari's."""
        if not self._atari:
            raise ValueError(f"{self._level_name!r} is not an Atari game: it has no console")
        return [env.unwrapped.ale for env in self._envs]

    def render(self, final: bool) -> np.ndarray:
        """RGB screens, uint8 [N, height, width, 3]; see `VectorEnvironment.render`."""
        if not self._keep_screens:
            raise ValueError(
                f"{self._level_name!r} was built without screens: pass render=True to "
                f"make_evaluation_environment"
            )
        screens = [
            self._final_screens[index]
            if final and index in self._final_screens
            else self._screen(env)
            for index, env in enumerate(self._envs)
        ]
        return np.stack(screens)

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []

    def _screen(self, env: gym.Env) -> np.ndarray:
        try:
            return np.asarray(env.render(), np.uint8)
        except gym.error.DependencyNotInstalled as error:
            raise ValueError(
                f"--level_name {self._level_name!r} cannot show its screen: {error}"
            ) from error

    def _batch(self, observations: list[np.ndarray]) -> np.ndarray:
        if self._atari:
            return _to_nhwc(np.stack(observations))
        return np.asarray(np.stack(observations), self.observation_dtype)
