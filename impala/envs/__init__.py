"""Vectorised environments for IMPALA actors.

One actor steps `num_envs` environments together and sends whole unrolls to a
learner. This module hides where the environments come from behind one small
interface, `VectorEnvironment`, built by `make_environment(EnvConfig(...))`:

* Atari ids (`PongNoFrameskip-v4`, `ALE/Breakout-v5`, ...; recognised by their
  registered entry point in `ale_py`) run in `ale_py.AtariVectorEnv`, a C++
  vector environment that steps all games in native threads and applies the
  DeepMind preprocessing: up to `noop_max` no-ops and FIRE (where the game has
  it) on reset, frame skip 4 with max-pooling of the last two frames, 84x84
  greyscale, a stack of the last 4 frames, no sticky actions, the minimal
  action set and unclipped rewards (the learner clips).
* Any other Gymnasium id with a `Discrete` action space runs in a Gymnasium
  `SyncVectorEnv`.

`make_evaluation_environment(config, render=True)` builds the same games as whole
Gymnasium envs stepped one by one in Python, slower but able to show each env's
screen (`VectorEnvironment.render`, for videos). For Atari that is Gymnasium's own ALE
env under `AtariPreprocessing`, arranged to give the very observations `AtariVectorEnv`
gives.

All of them follow the IMPALA / scalable_agent convention: `StepOutput.done[i]` means
an episode ended on this step and `StepOutput.observation[i]` is already the
first observation of the next one (same-step auto-reset). With
`episodic_life`, losing an Atari life also ends a *training* episode, but the
scores reported by `pop_episode_stats` are always whole games, as in papers.

Importing this module also registers `impala/Counter-v0`, a tiny deterministic
environment whose observations encode a step counter (`decode_counter`), for
fast tests of the actor/learner plumbing, and `impala/Catch-v0` (`catch.py`), a
small game drawn in the Atari observation shape, for learning tests.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

# Gymnasium draws classic-control screens (CartPole) off-screen with pygame. SDL's dummy
# drivers need no display or sound server; without them SDL complains on headless machines.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from impala.envs import catch  # noqa: F401 - registers impala/Catch-v0, a game for learning tests

# Emulator frames per agent step in the DeepMind Atari setup; `num_action_repeats`
# multiplies it.
ATARI_FRAME_SKIP = 4
# Height, width, stacked frames: NHWC, the layout the networks expect.
ATARI_OBSERVATION_SHAPE = (84, 84, 4)
# The Atari 2600 (NTSC) draws 60 frames a second: an Atari game's real speed.
ATARI_FRAMES_PER_SECOND = 60

COUNTER_LEVEL = "impala/Counter-v0"

# ALE takes seeds and frame limits as C ints.
_MAX_C_INT = 2**31 - 1
# ALE frame counters are C ints that wrap; differences are taken modulo this.
_FRAME_COUNTER_MODULUS = 2**32
# The counter env stores each value in 4 base-256 digits (bytes).
_COUNTER_DIGITS = 4


# --------------------------------------------------------------------------- #
# Configuration.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """How an actor builds its environments.

    Attributes:
        level_name: A registered Gymnasium id with a `Discrete` action space.
            Atari ids get DeepMind preprocessing (see module docstring).
        num_envs: Environments stepped together in one vector.
        seed: Base seed. Environment `i` of the vector is seeded `seed + i` on the
            first `reset()`; an actor with index `a` should therefore use e.g.
            `base_seed + a * num_envs` so that no two environments share a seed.
        num_action_repeats: Times each agent action is repeated ON TOP of the
            Atari frame skip of 4 (Atari: frame skip `4 * num_action_repeats`;
            other ids: a wrapper repeats the action, summing rewards and stopping
            at the end of an episode).
        episodic_life: Atari only: a lost life ends a training episode (`done`).
            Use True for training and False for evaluation. Reported scores are
            whole games either way.
        noop_max: Atari only: at most this many no-op frames start each game.
        max_episode_frames: Emulator frames after which an episode is truncated
            (counted as `done`). 108,000 is Atari's usual 30 minutes. For other
            ids it caps underlying env steps on top of the id's own time limit.
        num_threads: Atari only: C++ threads stepping the games;
            0 means min(num_envs, CPUs available to this process).
        env_kwargs: Non-Atari only: keyword arguments for `gymnasium.make`, e.g.
            `{"episode_length": 5}` for `impala/Counter-v0`. Copied on creation;
            being a dict, it makes the config unhashable.
    """

    level_name: str
    num_envs: int = 1
    seed: int = 0
    num_action_repeats: int = 1
    episodic_life: bool = True
    noop_max: int = 30
    max_episode_frames: int = 108_000
    num_threads: int = 0
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.level_name, str) or not self.level_name.strip():
            raise ValueError(
                f"--level_name must be a Gymnasium id such as 'PongNoFrameskip-v4', "
                f"got {self.level_name!r}"
            )
        _check_int("num_envs", self.num_envs, minimum=1, hint="environments per actor")
        _check_int("seed", self.seed, minimum=0, hint="seeds are non-negative")
        _check_int("num_action_repeats", self.num_action_repeats, minimum=1, hint="1 = none")
        _check_int("noop_max", self.noop_max, minimum=0, hint="0 disables no-op starts")
        _check_int("max_episode_frames", self.max_episode_frames, minimum=1, hint="108000")
        _check_int("num_threads", self.num_threads, minimum=0, hint="0 = automatic")
        if not isinstance(self.episodic_life, bool):
            raise ValueError(f"--episodic_life must be True or False, got {self.episodic_life!r}")
        if self.seed + self.num_envs - 1 > _MAX_C_INT:
            raise ValueError(
                f"--seed {self.seed} + --num_envs {self.num_envs} exceeds the largest "
                f"environment seed {_MAX_C_INT}; use a smaller --seed"
            )
        if self.max_episode_frames > _MAX_C_INT:
            raise ValueError(
                f"--max_episode_frames must be at most {_MAX_C_INT}, got {self.max_episode_frames}"
            )
        if not isinstance(self.env_kwargs, Mapping) or not all(
            isinstance(key, str) for key in self.env_kwargs
        ):
            raise ValueError(
                f"--env_kwargs must map argument names (str) to values, got {self.env_kwargs!r}"
            )
        # A private copy keeps the frozen config immune to later edits by the caller.
        object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))


def _check_int(name: str, value: Any, minimum: int, hint: str) -> None:
    """Raises a one-line ValueError unless `value` is an int >= `minimum`."""
    # bool is an int subclass, but `num_envs=True` is surely a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"--{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"--{name} must be >= {minimum} ({hint}), got {value}")


# --------------------------------------------------------------------------- #
# Public outputs.
# --------------------------------------------------------------------------- #


class StepOutput(NamedTuple):
    """What the vector returns after `reset()` or `step()`; N = num_envs.

    Attributes:
        reward: float32 [N]. Raw (unclipped) reward of the transition into
            `observation`; 0 after `reset()`.
        done: bool [N]. True when an episode (a training episode: with
            `episodic_life` a lost Atari life counts) ended on this step; then
            `observation` is already the first observation of the next episode.
            All True after `reset()`, as in scalable_agent: nothing precedes the
            observation, so recurrent state should start fresh.
        observation: [N, *observation_shape] of `observation_dtype`. Atari:
            uint8 [N, 84, 84, 4] (NHWC; the last axis stacks 4 frames, oldest
            first; at the start of a game the 3 older frames are zeros).
    """

    reward: np.ndarray
    done: np.ndarray
    observation: np.ndarray


class EpisodeStats(NamedTuple):
    """One finished episode: a whole game, the number to compare with papers.

    Attributes:
        env_index: Which environment of the vector (0 <= env_index < num_envs).
        episode_return: Unclipped sum of rewards over the whole game (for Atari
            across all lives: losing a life does not finish an episode here).
        episode_steps: Agent steps (calls to `step`) in the game.
        episode_frames: Emulator frames the agent's actions ran in the game:
            `episode_steps * frames_per_step`, less any frames skipped because the
            game ended inside the last step. Atari no-op/FIRE reset frames are
            not counted, matching how `max_episode_frames` counts.
    """

    env_index: int
    episode_return: float
    episode_steps: int
    episode_frames: int


class _Transition(NamedTuple):
    """One step of a backend, before the shared bookkeeping; N = num_envs."""

    observation: np.ndarray  # [N, *observation_shape]
    reward: np.ndarray  # float32 [N]
    episode_end: np.ndarray  # bool [N]: game over or truncated; the env was reset.
    life_lost: np.ndarray  # bool [N]: an Atari life was lost and the game goes on.
    frames: np.ndarray  # int64 [N]: emulator frames this step ran.


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
        self.frames_per_step = ATARI_FRAME_SKIP * config.num_action_repeats
        self._env = ale_py.AtariVectorEnv(
            game,
            config.num_envs,
            num_threads=_resolve_num_threads(config),
            frameskip=self.frames_per_step,
            stack_num=ATARI_OBSERVATION_SHAPE[2],
            img_height=ATARI_OBSERVATION_SHAPE[0],
            img_width=ATARI_OBSERVATION_SHAPE[1],
            grayscale=True,
            maxpool=True,
            noop_max=config.noop_max,
            use_fire_reset=True,  # Presses FIRE iff FIRE is in the game's minimal action set.
            episodic_life=False,  # See the class docstring: done here, from lives.
            life_loss_info=False,
            reward_clipping=False,  # The learner clips; scores must stay raw.
            repeat_action_probability=0.0,
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

    def reset(self, seed: int | None) -> np.ndarray:
        """Starts new games; `seed` seeds env i with seed + i. Returns [N, 84, 84, 4]."""
        observation, info = self._env.reset(seed=seed)
        observation, info = self._in_env_order(observation, info)
        self._lives = info["lives"].astype(np.int64)
        self._frame_number = info["frame_number"].astype(np.int64)
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
        return _Transition(
            observation=_to_nhwc(observation),
            reward=reward.astype(np.float32),
            episode_end=episode_end.astype(bool),
            life_lost=life_lost,
            frames=frames,
        )

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
# Gymnasium backend: everything that is not Atari.
# --------------------------------------------------------------------------- #


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
    env = gym.make(config.level_name, **kwargs)
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


# --------------------------------------------------------------------------- #
# Evaluation backend: one Gymnasium env per game, with its screen.
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
        repeat_action_probability=0.0,
        full_action_space=False,
        obs_type="grayscale",  # Cheapest per frame; AtariPreprocessing reads the screen itself.
        render_mode="rgb_array",  # Only read when asked: `render()` is ALE's RGB screen.
        max_num_frames_per_episode=None,  # _AtariStart limits frames as AtariVectorEnv does.
    )
    env = _AtariStart(env, config.noop_max, config.max_episode_frames)
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=0,  # _AtariStart does them, after FIRE, as AtariVectorEnv does.
        frame_skip=ATARI_FRAME_SKIP * config.num_action_repeats,
        screen_size=ATARI_OBSERVATION_SHAPE[0],
        terminal_on_life_loss=False,
        grayscale_obs=True,
    )
    env = gym.wrappers.FrameStackObservation(env, ATARI_OBSERVATION_SHAPE[2], padding_type="zero")
    return _StepFrames(env)


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
        self._final_screens: dict[int, np.ndarray] = {}

    def _describe(self, config: EnvConfig) -> None:
        env = self._envs[0]
        self.num_actions = _discrete_actions(config.level_name, env.action_space)
        if self._atari:
            self.frames_per_step = ATARI_FRAME_SKIP * config.num_action_repeats
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


# --------------------------------------------------------------------------- #
# The vector environment and its factory.
# --------------------------------------------------------------------------- #


class VectorEnvironment:
    """`num_envs` environments stepped together, with same-step auto-reset.

    The attributes `num_envs`, `num_actions`, `observation_shape`,
    `observation_dtype` and `frames_per_step` describe what the actor produces;
    an actor sends them to the learner so both sides can check they agree.

    Use as a context manager, or call `close()`, to free threads and emulators.
    """

    def __init__(
        self, backend: _AtariBackend | _GymBackend | _SerialBackend, config: EnvConfig
    ) -> None:
        self._backend = backend
        self._config = config
        self.num_envs: int = config.num_envs
        self.num_actions: int = backend.num_actions
        self.observation_shape: tuple[int, ...] = tuple(backend.observation_shape)
        self.observation_dtype: np.dtype = np.dtype(backend.observation_dtype)
        self.frames_per_step: int = backend.frames_per_step
        self._seeded = False
        self._started = False
        self._closed = False
        self._finished: list[EpisodeStats] = []
        self._returns = np.zeros(self.num_envs, np.float64)
        self._steps = np.zeros(self.num_envs, np.int64)
        self._frames = np.zeros(self.num_envs, np.int64)

    @property
    def config(self) -> EnvConfig:
        """The configuration this vector was built from."""
        return self._config

    def reset(self) -> StepOutput:
        """Starts a new episode in every environment, dropping unfinished ones.

        The first call seeds environment i with `config.seed + i`; later calls
        continue the environments' random streams instead of replaying them.

        Returns:
            reward float32 [N] zeros, done bool [N] all True, observation [N, ...].
        """
        self._check_open()
        observation = self._backend.reset(None if self._seeded else self._config.seed)
        self._seeded = self._started = True
        self._returns[:] = 0.0
        self._steps[:] = 0
        self._frames[:] = 0
        return StepOutput(
            reward=np.zeros(self.num_envs, np.float32),
            done=np.ones(self.num_envs, bool),
            observation=observation,
        )

    def step(self, actions: np.ndarray) -> StepOutput:
        """Applies one action per environment.

        Args:
            actions: Integers in [0, num_actions), shape [N].

        Returns:
            The reward, done and next observation per environment (see StepOutput).
        """
        self._check_open()
        if not self._started:
            raise RuntimeError("VectorEnvironment.step() called before reset()")
        transition = self._backend.step(self._checked_actions(actions))
        self._record(transition)
        done = transition.episode_end
        if self._config.episodic_life:
            done = done | transition.life_lost
        return StepOutput(reward=transition.reward, done=done, observation=transition.observation)

    def render(self, final: bool = False) -> np.ndarray:
        """The screen of every environment, as a person would see it.

        Only for vectors from `make_evaluation_environment(config, render=True)`.

        Args:
            final: For the environments whose episode ended on the last `step()` (and
                that already started the next one, as their observation shows): the
                last screen of the episode that ended instead of the first of the next.

        Returns:
            uint8 [N, height, width, 3] RGB, e.g. [N, 210, 160, 3] for Atari.

        Raises:
            ValueError: The vector was built without screens, or its id cannot show one.
        """
        self._check_open()
        if not isinstance(self._backend, _SerialBackend):
            raise ValueError(
                f"{self._config.level_name!r} was built for training, without screens: use "
                f"make_evaluation_environment(config, render=True)"
            )
        return self._backend.render(final)

    @property
    def screen_fps(self) -> float | None:
        """`render()` screens per second of real time when shown once per agent step.

        Atari: the console's 60 frames/s over `frames_per_step` (15 for frame skip 4).
        Other ids: their `render_fps` over `frames_per_step`. None where unknown.
        """
        return getattr(self._backend, "screen_fps", None)

    def pop_episode_stats(self) -> list[EpisodeStats]:
        """Whole episodes (games) finished since the last call, oldest first."""
        finished, self._finished = self._finished, []
        return finished

    def close(self) -> None:
        """Frees the environments; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self) -> VectorEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("VectorEnvironment used after close()")

    def _checked_actions(self, actions: np.ndarray) -> np.ndarray:
        """Validates actions (the Atari C++ side hangs on bad ones); int64 [N]."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(
                f"actions must be integers of shape ({self.num_envs},), "
                f"got {actions.dtype} {actions.shape}"
            )
        if actions.size and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise ValueError(
                f"actions must be in [0, {self.num_actions}) for {self._config.level_name!r}, "
                f"got {actions.tolist()}"
            )
        return actions.astype(np.int64)

    def _record(self, transition: _Transition) -> None:
        """Adds the step to the running games; closes the games that ended."""
        self._returns += transition.reward
        self._steps += 1
        self._frames += transition.frames
        for index in np.flatnonzero(transition.episode_end):
            self._finished.append(
                EpisodeStats(
                    env_index=int(index),
                    episode_return=float(self._returns[index]),
                    episode_steps=int(self._steps[index]),
                    episode_frames=int(self._frames[index]),
                )
            )
        self._returns[transition.episode_end] = 0.0
        self._steps[transition.episode_end] = 0
        self._frames[transition.episode_end] = 0


def make_environment(config: EnvConfig) -> VectorEnvironment:
    """Builds the vector environment described by `config`.

    Raises:
        ValueError: `config.level_name` is not a registered id, or its action
            space is not Discrete, or `env_kwargs` are given for an Atari id.
    """
    spec = _find_spec(config.level_name)
    game = _atari_game(spec)
    if game is None:
        return VectorEnvironment(_GymBackend(config), config)
    _check_no_atari_env_kwargs(config)
    return VectorEnvironment(_AtariBackend(config, game), config)


def make_evaluation_environment(config: EnvConfig, render: bool = False) -> VectorEnvironment:
    """Builds `config`'s environments as whole Gymnasium envs, whose screens can be shown.

    The same games as `make_environment(config)`, but each env is stepped in turn in
    Python (slower) and can show its RGB screen (`VectorEnvironment.render`). Atari ids
    run Gymnasium's own ALE env (frameskip 1, no sticky actions, minimal action set)
    under `AtariPreprocessing` (frame skip 4 x repeats, max-pooling the last two frames,
    84x84 greyscale by INTER_AREA), with FIRE, no-ops and the frame limit as
    `AtariVectorEnv` does them (`_AtariStart`) and 4 stacked frames, zeros before the
    game began. With `noop_max=0` its observations, rewards and episode ends equal
    `make_environment(config)`'s exactly (tests/test_evaluation.py checks it); with
    no-op starts the two draw their number from different random generators.

    Args:
        config: As for `make_environment`.
        render: Keep screens: `render()` works, and the last screen of an episode is kept
            when its env starts the next one. Other than Atari, the id needs an
            'rgb_array' render mode (CartPole's also needs pygame).

    Raises:
        ValueError: As `make_environment`; with `render`, an id that cannot show its screen.
    """
    spec = _find_spec(config.level_name)
    if _atari_game(spec) is not None:
        _check_no_atari_env_kwargs(config)
    return VectorEnvironment(_SerialBackend(config, spec, render), config)


def _check_no_atari_env_kwargs(config: EnvConfig) -> None:
    if config.env_kwargs:
        raise ValueError(
            f"--env_kwargs {dict(config.env_kwargs)} are not supported for the Atari id "
            f"{config.level_name!r}; Atari settings come from EnvConfig fields"
        )


def _find_spec(level_name: str) -> gym.envs.registration.EnvSpec:
    """The registered spec, or a one-line ValueError suggesting close matches."""
    try:
        return gym.spec(level_name)
    except gym.error.Error as error:
        matches = difflib.get_close_matches(level_name, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(map(repr, matches))}?" if matches else ""
        raise ValueError(
            f"--level_name {level_name!r} is not a registered Gymnasium id{hint}"
        ) from error


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


# --------------------------------------------------------------------------- #
# A fake environment for fast tests: impala/Counter-v0.
# --------------------------------------------------------------------------- #


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
