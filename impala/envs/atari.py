"""The Atari family: ale_py's C++ vector env for training, and the same games in Gymnasium.

Atari ids (`PongNoFrameskip-v4`, `ALE/Breakout-v5`, ...; recognised by their
registered entry point in `ale_py`, see `_atari_game`) run in `ale_py.AtariVectorEnv`
(`_AtariBackend`), a C++ vector environment that steps all games in native threads and
applies the DeepMind preprocessing: up to `noop_max` no-ops and FIRE (where the game has
it) on reset, frame skip 4 (or `EnvConfig.frame_skip`) with max-pooling of the last two
frames (or the last frame alone: `EnvConfig.frame_pooling`), 84x84 greyscale, a stack of the
last 4 frames, the minimal action set and unclipped rewards (the learner clips). Sticky actions
are off unless `EnvConfig.repeat_action_probability` turns them on.

For evaluation (`serial.py`), `_make_atari_game` builds one game as Gymnasium's own ALE
env under `AtariPreprocessing`, arranged to give the very observations `AtariVectorEnv`
gives.
"""

from __future__ import annotations

import os
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from impala.envs.config import ATARI_OBSERVATION_SHAPE, EnvConfig, _Transition

# ALE frame counters are C ints that wrap; differences are taken modulo this.
_FRAME_COUNTER_MODULUS = 2**32


# --------------------------------------------------------------------------- #
# Atari backend: ale_py.AtariVectorEnv.
# --------------------------------------------------------------------------- #


class _AtariBackend:
    """Steps Atari games in C++ threads with DeepMind preprocessing.

    Facts about ale_py 0.12's `AtariVectorEnv` this relies on:
    * Its own `episodic_life=True` resets the whole game on every lost life, so
      scores would never span lives. Instead it runs with episodic_life=False and
      life_loss_info=False (`terminated` = game over) and a lost life is detected
      here from `info["lives"]` dropping, as in the DeepMind/baselines wrapper.
    * In SAME_STEP autoreset mode, reward/terminated/truncated of a finishing step
      describe the finished game, while the observation and `info` (lives,
      frame numbers) already describe the new game.
    * `info["frame_number"]` counts every emulated frame of that env (reset
      frames included) and restarts only on a seeded reset;
      `info["episode_frame_number"]` restarts at each game and after a reset
      equals the no-op/FIRE frames just run.
    * Observations are uint8 [N, 4, 84, 84], oldest frame first; a new game's
      stack is zero except for its newest frame.
    * An out-of-range action makes the C++ threads hang, so actions are checked
      before they are sent.
    """

    def __init__(self, config: EnvConfig, game: str) -> None:
        self.frames_per_step = config.atari_frames_per_step
        self._env = ale_py.AtariVectorEnv(
            game,
            config.num_envs,
            num_threads=_resolve_num_threads(config),
            frameskip=self.frames_per_step,
            stack_num=ATARI_OBSERVATION_SHAPE[2],
            img_height=ATARI_OBSERVATION_SHAPE[0],
            img_width=ATARI_OBSERVATION_SHAPE[1],
            grayscale=True,
            maxpool=config.frame_pooling == "max",
            noop_max=config.noop_max,
            use_fire_reset=True,  # Presses FIRE iff FIRE is in the game's minimal action set.
            episodic_life=False,  # See the class docstring: done here, from lives.
            life_loss_info=False,
            reward_clipping=False,  # The learner clips; scores must stay raw.
            repeat_action_probability=float(config.repeat_action_probability),
            full_action_space=False,
            max_num_frames_per_episode=config.max_episode_frames,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        self.num_actions = int(self._env.single_action_space.n)
        self.observation_shape = ATARI_OBSERVATION_SHAPE
        self.observation_dtype = np.dtype(np.uint8)
        num_envs = config.num_envs
        self._env_ids = np.arange(num_envs)  # Which env each result row came from.
        self._lives = np.zeros(num_envs, np.int64)
        self._frame_number = np.zeros(num_envs, np.int64)
        self._start_frames = np.zeros(num_envs, np.int64)

    def reset(self, seed: int | None) -> np.ndarray:
        """Starts new games; `seed` seeds env i with seed + i. Returns [N, 84, 84, 4]."""
        observation, info = self._env.reset(seed=seed)
        observation, info = self._in_env_order(observation, info)
        self._lives = info["lives"].astype(np.int64)
        self._frame_number = info["frame_number"].astype(np.int64)
        self._start_frames = info["episode_frame_number"].astype(np.int64)
        return _to_nhwc(observation)

    def step(self, actions: np.ndarray) -> _Transition:
        """Sends int64 [N] actions (already range-checked) and returns the step."""
        # The C++ side routes row j of the actions to the env that produced row j
        # of the previous results, so actions follow that order.
        self._env.send(actions[self._env_ids].astype(np.int32))
        observation, reward, terminated, truncated, info = self._env.recv()
        observation, info = self._in_env_order(observation, info)
        order = self._env_ids
        reward, terminated, truncated = (
            _scatter(order, reward),
            _scatter(order, terminated),
            _scatter(order, truncated),
        )

        episode_end = terminated | truncated
        lives = info["lives"].astype(np.int64)
        life_lost = _lives_lost(lives, self._lives, episode_end)
        frames = self._frames_this_step(info, episode_end)
        self._lives = lives
        # A game that ended was replaced by one whose frames so far are its start's.
        self._start_frames = np.where(
            episode_end, info["episode_frame_number"].astype(np.int64), self._start_frames
        )
        return _Transition(
            observation=_to_nhwc(observation),
            reward=reward.astype(np.float32),
            episode_end=episode_end.astype(bool),
            life_lost=life_lost,
            frames=frames,
        )

    def start_frames(self) -> np.ndarray:
        """The no-op and FIRE frames each env's running game began with, int64 [N]."""
        return self._start_frames.copy()

    def close(self) -> None:
        # Dropping the last reference joins the C++ worker threads.
        self._env.close()
        self._env = None

    def _frames_this_step(self, info: dict[str, np.ndarray], episode_end: np.ndarray) -> np.ndarray:
        """Emulator frames the agent's action ran in each env, int64 [N]."""
        frame_number = info["frame_number"].astype(np.int64)
        elapsed = (frame_number - self._frame_number) % _FRAME_COUNTER_MODULUS
        self._frame_number = frame_number
        # After a game over the env also ran the new game's reset frames, which
        # are exactly its episode frame number so far.
        reset_frames = np.where(episode_end, info["episode_frame_number"].astype(np.int64), 0)
        # Guard against odd ROMs that end a game during the reset no-ops.
        return np.clip(elapsed - reset_frames, 1, self.frames_per_step)

    def _in_env_order(
        self, observation: np.ndarray, info: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Reorders result rows by env id and remembers the order for `send`."""
        self._env_ids = info["env_id"].astype(np.int64)
        order = self._env_ids
        info = {key: _scatter(order, value) for key, value in info.items() if key != "final_obs"}
        return _scatter(order, observation), info


def _lives_lost(
    lives: np.ndarray, previous_lives: np.ndarray, episode_end: np.ndarray
) -> np.ndarray:
    """Where an Atari life was lost and the game goes on, bool [N].

    As baselines' EpisodicLifeEnv: fewer lives, but some left. Where a game ended, `lives` is
    already the new game's count, hence the mask.
    """
    return (lives < previous_lives) & (lives > 0) & ~episode_end


def _scatter(env_ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Puts row j of `rows` at index env_ids[j] (results may come unordered)."""
    if np.array_equal(env_ids, np.arange(len(env_ids))):
        return rows  # The usual case with batch_size == num_envs: no copy.
    ordered = np.empty_like(rows)
    ordered[env_ids] = rows
    return ordered


def _to_nhwc(observation: np.ndarray) -> np.ndarray:
    """uint8 [N, 4, 84, 84] frame stack (oldest first) -> contiguous [N, 84, 84, 4]."""
    num_envs, num_frames, height, width = observation.shape
    nhwc = np.empty((num_envs, height, width, num_frames), np.uint8)
    # One strided copy per frame is ~2x faster than a generic 4-D transpose copy.
    for frame in range(num_frames):
        nhwc[..., frame] = observation[:, frame]
    return nhwc


def _resolve_num_threads(config: EnvConfig) -> int:
    """`num_threads`, with 0 meaning one per env up to the CPUs we may use."""
    if config.num_threads:
        return config.num_threads
    # sched_getaffinity respects container/taskset limits that cpu_count ignores.
    has_affinity = hasattr(os, "sched_getaffinity")  # Linux only.
    cpus = len(os.sched_getaffinity(0)) if has_affinity else (os.cpu_count() or 1)
    return max(1, min(config.num_envs, cpus))


# --------------------------------------------------------------------------- #
# Registry entry: which levels are Atari, and their training backend.
# --------------------------------------------------------------------------- #


def serves(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether `spec` is an ale_py Atari id; a ValueError for one this family cannot play."""
    return _atari_game(spec) is not None


def make_backend(config: EnvConfig, spec: gym.envs.registration.EnvSpec) -> _AtariBackend:
    """The training backend for an Atari id (`registry` has refused `env_kwargs` for it)."""
    return _AtariBackend(config, _atari_game(spec))


def _atari_game(spec: gym.envs.registration.EnvSpec) -> str | None:
    """The ALE ROM name if `spec` is an ale_py Atari env, else None."""
    entry_point = spec.entry_point
    if isinstance(entry_point, str):
        module = entry_point.split(":", 1)[0]
    else:
        module = getattr(entry_point, "__module__", "") or ""
    if module != "ale_py" and not module.startswith("ale_py."):
        return None
    game = spec.kwargs.get("game")
    if not isinstance(game, str) or ale_py.roms.get_rom_path(game) is None:
        raise ValueError(f"--level_name {spec.id!r} names no ALE ROM (game={game!r})")
    for option in ("mode", "difficulty"):
        # AtariVectorEnv has no game modes; silently playing the default would
        # make scores incomparable.
        if spec.kwargs.get(option) is not None:
            raise ValueError(
                f"--level_name {spec.id!r} sets {option}={spec.kwargs[option]!r}, which "
                f"the Atari vector environment cannot play; use an id without it"
            )
    return game


def _check_no_atari_env_kwargs(config: EnvConfig) -> None:
    if config.env_kwargs:
        raise ValueError(
            f"--env_kwargs {dict(config.env_kwargs)} are not supported for the Atari id "
            f"{config.level_name!r}; Atari settings come from EnvConfig fields"
        )


# --------------------------------------------------------------------------- #
# One game as Gymnasium plays it, for the serial (evaluation) backend.
# --------------------------------------------------------------------------- #


class _AtariStart(gym.Wrapper):
    """Starts and limits games the way `AtariVectorEnv` does, under `AtariPreprocessing`.

    Wraps a frameskip=1 ALE env, so each `step` here is one emulator frame:
    * `reset` draws d uniform in [0, noop_max), presses FIRE for one frame where the
      game's action set has it, then runs no-ops until d frames have passed (restarting
      the game if it ends meanwhile). The two draw d from their own random generators,
      so only `noop_max=0` gives both the same games.
    * A game is truncated once the agent's actions ran `max_episode_frames` frames (the
      start frames do not count; ALE's own limit would count them).
    """

    def __init__(self, env: gym.Env, noop_max: int, max_episode_frames: int) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self._fire = meanings.index("FIRE") if "FIRE" in meanings else None
        self._noop = meanings.index("NOOP")
        self._noop_max = noop_max
        self._max_episode_frames = max_episode_frames
        self._frames = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed, options=options)
        start_frames = int(self.np_random.integers(self._noop_max)) if self._noop_max else 0
        if self._fire is not None:
            observation, _, _, _, info = self.env.step(self._fire)
            start_frames -= 1
        for _ in range(start_frames):
            observation, _, terminated, _, info = self.env.step(self._noop)
            if terminated:
                observation, info = self.env.reset()
        self._frames = 0
        return observation, info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._frames += 1
        truncated = truncated or (self._frames >= self._max_episode_frames and not terminated)
        return observation, reward, terminated, truncated, info


class _LastFrame(gym.wrappers.AtariPreprocessing):
    """`AtariPreprocessing` showing a step's last frame, not the maximum of its last two.

    It keeps a step's last frame in `obs_buffer[0]` and the one before in `obs_buffer[1]`,
    and shows their maximum; with the one before cleared, that maximum is the last frame
    (the buffer is written again before the next step reads it).
    """

    def _get_obs(self) -> np.ndarray:
        self.obs_buffer[1].fill(0)
        return super()._get_obs()


class _StepFrames(gym.Wrapper):
    """Adds `info["frames"]`: the emulator frames the last step ran, from ALE's frame count."""

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        observation, info = self.env.reset(**kwargs)
        self._frame_number = int(info["episode_frame_number"])  # The start frames.
        return observation, info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        frame_number = int(info["episode_frame_number"])
        frames, self._frame_number = frame_number - self._frame_number, frame_number
        return observation, reward, terminated, truncated, {**info, "frames": frames}


def _make_atari_game(config: EnvConfig) -> gym.Env:
    """One Atari game as Gymnasium plays it, preprocessed as `AtariVectorEnv` does.

    Observations are uint8 [4, 84, 84], oldest frame first, zeros before the game began.
    """
    env = gym.make(
        config.level_name,
        frameskip=1,  # AtariPreprocessing skips frames, max-pooling the last two.
        repeat_action_probability=float(config.repeat_action_probability),
        full_action_space=False,
        obs_type="grayscale",  # Cheapest per frame; AtariPreprocessing reads the screen itself.
        render_mode="rgb_array",  # Only read when asked: `render()` is ALE's RGB screen.
        max_num_frames_per_episode=None,  # _AtariStart limits frames as AtariVectorEnv does.
    )
    env = _AtariStart(env, config.noop_max, config.max_episode_frames)
    preprocessing = gym.wrappers.AtariPreprocessing if config.frame_pooling == "max" else _LastFrame
    env = preprocessing(
        env,
        noop_max=0,  # _AtariStart does them, after FIRE, as AtariVectorEnv does.
        frame_skip=config.atari_frames_per_step,
        screen_size=ATARI_OBSERVATION_SHAPE[0],
        terminal_on_life_loss=False,
        grayscale_obs=True,
    )
    env = gym.wrappers.FrameStackObservation(env, ATARI_OBSERVATION_SHAPE[2], padding_type="zero")
    return _StepFrames(env)
