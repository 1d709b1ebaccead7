"""Vectorised environments for IMPALA actors.

One actor steps `num_envs` environments together and sends whole unrolls to a
learner. This package hides where the environments come from behind one small
interface, `VectorEnvironment`, built by `make_environment(EnvConfig(...))`:

* Atari ids (`PongNoFrameskip-v4`, `ALE/Breakout-v5`, ...) run in `ale_py.AtariVectorEnv`
  with the DeepMind preprocessing (`atari.py`).
* Any other Gymnasium id with a `Discrete` action space runs in a Gymnasium
  `SyncVectorEnv` (`gym_vector.py`).

`make_evaluation_environment(config, render=True)` builds the same games as whole
Gymnasium envs stepped one by one in Python, slower but able to show each env's
screen (`serial.py`).

All of them auto-reset on the same step, as in scalable_agent (`vector.py`); scores
reported by `VectorEnvironment.pop_episode_stats` are always whole games.

Layout: `config.py` (`EnvConfig`, outputs, the `Backend` interface), one file per
backend (`atari.py`, `gym_vector.py`, `serial.py`), `vector.py` (the facade),
`registry.py` (which backend serves which level, and the factories), and test games
(`testing.py`: `impala/Counter-v0`; `catch.py`: `impala/Catch-v0`).

To add an environment family, write its backend file and add it to `_FAMILIES` in
`registry.py`; that module's docstring says how.

Importing this package also registers `impala/Counter-v0`, a tiny deterministic
environment whose observations encode a step counter (`decode_counter`), for
fast tests of the actor/learner plumbing, and `impala/Catch-v0` (`catch.py`), a
small game drawn in the Atari observation shape, for learning tests.
"""

import os

# Gymnasium draws classic-control screens (CartPole) off-screen with pygame. SDL's dummy
# drivers need no display or sound server; without them SDL complains on headless machines.
# Set here, before any module of the package imports Gymnasium.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")

from impala.envs import catch  # noqa: F401 - registers impala/Catch-v0, a game for learning tests
from impala.envs.config import (
    ATARI_FRAME_SKIP,
    ATARI_FRAMES_PER_SECOND,
    ATARI_OBSERVATION_SHAPE,
    EnvConfig,
    EpisodeStats,
    StepOutput,
)
from impala.envs.registry import is_atari, make_environment, make_evaluation_environment
from impala.envs.testing import COUNTER_LEVEL, CounterEnv, decode_counter, decode_episode_step
from impala.envs.vector import VectorEnvironment

__all__ = [
    "ATARI_FRAMES_PER_SECOND",
    "ATARI_FRAME_SKIP",
    "ATARI_OBSERVATION_SHAPE",
    "COUNTER_LEVEL",
    "CounterEnv",
    "EnvConfig",
    "EpisodeStats",
    "StepOutput",
    "VectorEnvironment",
    "decode_counter",
    "decode_episode_step",
    "is_atari",
    "make_environment",
    "make_evaluation_environment",
]
