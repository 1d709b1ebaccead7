"""Which backend serves which level, and the factories that build a `VectorEnvironment`.

`_FAMILIES` lists the environment families in order; the first whose `serves(spec)` is
True for a level's registered Gymnasium spec builds its training backend with
`make_backend(config, spec)`. Gymnasium's `SyncVectorEnv` (`gym_vector.py`) serves any id,
so it comes last.

To add an environment family (Procgen, DM Lab, ...): write one backend file next to
`atari.py`, defining a backend class that implements `config.Backend` and the module
functions `serves(spec)` and `make_backend(config, spec)`, then add one `_Family` entry to
`_FAMILIES` below, before the Gymnasium fallback. `make_evaluation_environment` plays every
level one whole Gymnasium env at a time (`serial.py`: Atari ids through
`atari._make_atari_game`, any other id through `gymnasium.make`); only a family whose envs
need more than `gymnasium.make` to be evaluated also touches `serial.py`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import NamedTuple

import gymnasium as gym

from impala.envs import atari, gym_vector
from impala.envs.atari import _atari_game, _check_no_atari_env_kwargs
from impala.envs.config import Backend, EnvConfig
from impala.envs.serial import _SerialBackend
from impala.envs.vector import VectorEnvironment


class _Family(NamedTuple):
    """One environment family: which levels it serves and how it steps them for training."""

    # Whether the family plays this level; a ValueError for a level of the family that
    # it cannot play (an Atari id without a ROM, say).
    serves: Callable[[gym.envs.registration.EnvSpec], bool]
    # Builds the training backend; a ValueError for a config the family cannot play.
    make_backend: Callable[[EnvConfig, gym.envs.registration.EnvSpec], Backend]


# First match wins. A new family goes before the Gymnasium fallback, which serves any id.
_FAMILIES = (
    _Family(serves=atari.serves, make_backend=atari.make_backend),
    _Family(serves=gym_vector.serves, make_backend=gym_vector.make_backend),
)


def make_environment(config: EnvConfig) -> VectorEnvironment:
    """Builds the vector environment described by `config`.

    Raises:
        ValueError: `config.level_name` is not a registered id, or its action
            space is not Discrete, or `env_kwargs` are given for an Atari id, or
            sticky actions or a frame skip for another.
    """
    spec = _find_spec(config.level_name)
    family = next(family for family in _FAMILIES if family.serves(spec))
    _check_family_settings(config, spec)
    return VectorEnvironment(family.make_backend(config, spec), config)


def make_evaluation_environment(config: EnvConfig, render: bool = False) -> VectorEnvironment:
    """Builds `config`'s environments as whole Gymnasium envs, whose screens can be shown.

    The same games as `make_environment(config)`, but each env is stepped in turn in
    Python (slower) and can show its RGB screen (`VectorEnvironment.render`). Atari ids
    run Gymnasium's own ALE env (frameskip 1, minimal action set, sticky actions as
    `config.repeat_action_probability` says)
    under `AtariPreprocessing` (frame skip (4 or `config.frame_skip`) x repeats, max-pooling
    the last two frames or showing the last as `config.frame_pooling` says, 84x84 greyscale by
    INTER_AREA), with FIRE, no-ops and the frame limit as
    `AtariVectorEnv` does them (`_AtariStart`) and 4 stacked frames, zeros before the
    game began. With `noop_max=0` and no sticky actions its observations, rewards and
    episode ends equal `make_environment(config)`'s exactly
    (tests/unit/evaluation/test_evaluation.py checks it); with no-op starts or sticky actions
    the two draw from different random generators.

    Args:
        config: As for `make_environment`.
        render: Keep screens: `render()` works, and the last screen of an episode is kept
            when its env starts the next one. Other than Atari, the id needs an
            'rgb_array' render mode (CartPole's also needs pygame).

    Raises:
        ValueError: As `make_environment`; with `render`, an id that cannot show its screen.
    """
    spec = _find_spec(config.level_name)
    _check_family_settings(config, spec)
    return VectorEnvironment(_SerialBackend(config, spec, render), config)


def is_atari(level_name: str) -> bool:
    """Whether `level_name` is an Atari id (one the Atari family plays); a one-line ValueError
    for an id that is not registered."""
    return atari.serves(_find_spec(level_name))


def _check_family_settings(config: EnvConfig, spec: gym.envs.registration.EnvSpec) -> None:
    """Training and evaluation alike: `env_kwargs` are for ids other than Atari ones, sticky
    actions and frame skips for Atari ids only."""
    if _atari_game(spec) is not None:
        _check_no_atari_env_kwargs(config)
    elif config.repeat_action_probability:
        raise ValueError(
            f"--repeat_action_probability={config.repeat_action_probability}: sticky actions "
            f"are an Atari setting, and {config.level_name!r} is not an Atari id; use 0"
        )
    elif config.frame_skip:
        raise ValueError(
            f"--frame_skip={config.frame_skip}: the frame skip is an Atari setting, and "
            f"{config.level_name!r} is not an Atari id; use 0 (--num_action_repeats repeats "
            f"actions of any id)"
        )
    elif config.frame_pooling != "max":
        raise ValueError(
            f"--frame_pooling={config.frame_pooling}: frame pooling is an Atari setting, and "
            f"{config.level_name!r} is not an Atari id; use max (the default)"
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
