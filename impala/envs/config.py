"""What an actor asks of its environments and what they give back, shared by every backend.

`EnvConfig` says which level to build and how; `VectorEnvironment` (`vector.py`) returns
`StepOutput`s and `EpisodeStats`. `Backend` is the small interface every environment family
implements (`atari.py`, `gym_vector.py`, `serial.py`); `registry.py` says which backend serves
which level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

# ATARI_FRAME_SKIP: emulator frames per agent step in the DeepMind Atari setup, unless
# `EnvConfig.frame_skip` says otherwise; `num_action_repeats` multiplies it.
from impala.configs import (
    ATARI_FRAME_SKIP,
    GameConfig,
    check_frame_pooling,
    check_frame_skip,
    check_repeat_action_probability,
)

# Height, width, stacked frames: NHWC, the layout the networks expect.
ATARI_OBSERVATION_SHAPE = (84, 84, 4)
# The Atari 2600 (NTSC) draws 60 frames a second: an Atari game's real speed.
ATARI_FRAMES_PER_SECOND = 60

# ALE takes seeds and frame limits as C ints.
_MAX_C_INT = 2**31 - 1


# --------------------------------------------------------------------------- #
# Configuration.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """How an actor builds its environments.

    Attributes:
        level_name: A registered Gymnasium id with a `Discrete` action space.
            Atari ids get DeepMind preprocessing (see `atari.py`).
        num_envs: Environments stepped together in one vector.
        seed: Base seed. Environment `i` of the vector is seeded `seed + i` on the
            first `reset()`; an actor with index `a` should therefore use e.g.
            `base_seed + a * num_envs` so that no two environments share a seed.
        num_action_repeats: Times each agent action is repeated ON TOP of the
            Atari frame skip (Atari: frame skip `frame_skip * num_action_repeats`;
            other ids: a wrapper repeats the action, summing rewards and stopping
            at the end of an episode).
        episodic_life: Atari only: a lost life ends a training episode (`done`).
            Use True for training and False for evaluation. Reported scores are
            whole games either way.
        noop_max: Atari only: at most this many no-op frames start each game.
        repeat_action_probability: Atari only: ALE's sticky actions. On every emulator
            frame the game repeats its previous action instead of the agent's with this
            probability (0.25 in the Gymnasium v5 protocol; 0 in the v4 one, which
            evaluation uses). In [0, 1).
        frame_skip: Atari only: emulator frames each agent step runs, the last two
            max-pooled into the observed frame; 0 means `ATARI_FRAME_SKIP` (4,
            DeepMind's), any other value is at least 2. An odd skip alternates the
            emulator frame's parity from one step to the next, where 4 keeps a game on
            the parity its no-op start gave it. Other ids take 0 only.
        frame_pooling: Atari only: the frame a step shows, "max" (the pixel-wise maximum
            of its last two emulator frames, DeepMind's) or "last" (its last frame). Other
            ids take "max" only, which changes nothing for them.
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
    repeat_action_probability: float = 0.0
    frame_skip: int = 0
    frame_pooling: str = "max"
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
        check_repeat_action_probability(self.repeat_action_probability)
        check_frame_skip(self.frame_skip, self.num_action_repeats)
        check_frame_pooling(self.frame_pooling)
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

    @classmethod
    def for_game(cls, game: GameConfig, num_envs: int, seed: int, **options: Any) -> EnvConfig:
        """`num_envs` environments of the run's `game`, environment i seeded `seed + i` (each
        role derives its own from the run's `game.seed`); `options` sets the other fields."""
        settings = {field.name: getattr(game, field.name) for field in dataclasses.fields(game)}
        return cls(**{**settings, "num_envs": num_envs, "seed": seed, **options})

    @property
    def atari_frames_per_step(self) -> int:
        """Emulator frames an agent step runs in an Atari game: frame skip x action repeats."""
        frame_skip = self.frame_skip or ATARI_FRAME_SKIP
        return frame_skip * self.num_action_repeats


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
        start_frames: Atari: the emulator frames the game ran before the agent's first
            action (its random no-ops and FIRE). A frame skip keeps a game's frames modulo
            the skip where they began, and games that act on cycles of frames (Pong reads the
            controller on every other frame) answer the same actions differently by that
            phase, so returns grouped by it show a policy that wins one kind of game and not
            another. -1 for the families that have no such start.
    """

    env_index: int
    episode_return: float
    episode_steps: int
    episode_frames: int
    start_frames: int = -1


class _Transition(NamedTuple):
    """One step of a backend, before the shared bookkeeping; N = num_envs."""

    observation: np.ndarray  # [N, *observation_shape]
    reward: np.ndarray  # float32 [N]
    episode_end: np.ndarray  # bool [N]: game over or truncated; the env was reset.
    life_lost: np.ndarray  # bool [N]: an Atari life was lost and the game goes on.
    frames: np.ndarray  # int64 [N]: emulator frames this step ran.


class Backend(Protocol):
    """What `VectorEnvironment` needs from the backend of an environment family; N = num_envs.

    A backend steps N environments with same-step auto-reset and reports each step as a
    `_Transition`; `VectorEnvironment` adds what all families share: seeding on the first
    reset only, action checks, `done` (with `episodic_life`) and episode statistics.

    Attributes:
        num_actions: Size of the Discrete action space; actions are 0 .. num_actions - 1.
        observation_shape: Shape of ONE observation.
        observation_dtype: Dtype of the observations.
        frames_per_step: Underlying (emulator) frames one agent step runs, at most.

    The serial backend (`serial.py`) also has `render(final)` and `screen_fps`, which
    `VectorEnvironment.render` and `VectorEnvironment.screen_fps` use. The Atari backends also
    have `start_frames()`: int64 [N], the frames each env's running game began with (its
    no-ops and FIRE), as of the last `reset` or `step` (`EpisodeStats.start_frames`).
    """

    num_actions: int
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    frames_per_step: int

    def reset(self, seed: int | None) -> np.ndarray:
        """Starts new episodes; `seed`, if not None, seeds env i with seed + i. [N, ...]."""

    def step(self, actions: np.ndarray) -> _Transition:
        """Steps every env with int64 [N] actions already checked to be in range."""

    def close(self) -> None:
        """Frees the environments."""
