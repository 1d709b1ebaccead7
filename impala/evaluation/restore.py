"""The checkpoint `--checkpoint` names: finding it, reading and checking what it was trained
on, restoring its agent, and the environments that play its game."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

import networks
from impala import build, envs, run_folder, run_identity
from impala.learner import checkpoint_folder, checkpoints

if TYPE_CHECKING:
    from impala.configs import EvalConfig


def resolve_checkpoint(checkpoint: str) -> str:
    """The one checkpoint that `--checkpoint` names.

    Args:
      checkpoint: a run folder (its latest checkpoint), its `checkpoints/` folder (its
        latest) or one checkpoint's path prefix, e.g. `runs/x/checkpoints/ckpt-25`.

    Raises:
      ValueError: naming the path, if it is none of these or holds no checkpoint.
    """
    if os.path.isdir(checkpoint):
        folder = os.path.join(checkpoint, run_folder.CHECKPOINTS)
        if not os.path.isdir(folder):
            folder = checkpoint
        found, problem = checkpoints.listed(folder)
        if problem:
            print(problem)
        if not found:
            raise ValueError(f"--checkpoint={checkpoint}: no checkpoint in {folder}")
        return found[-1]
    if os.path.isfile(checkpoint + ".index"):
        return checkpoint
    raise ValueError(
        f"--checkpoint={checkpoint}: no such run folder, checkpoints folder or checkpoint "
        f"(e.g. runs/pong, runs/pong/checkpoints or runs/pong/checkpoints/ckpt-25)"
    )


def run_folder_of(path: str) -> str:
    """The run folder of checkpoint `path`: the folder that holds its `checkpoints/` folder
    (the checkpoint's own folder if that is not called so)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) == run_folder.CHECKPOINTS:
        return os.path.dirname(folder)
    return folder


def _is_number_type(name) -> bool:
    """Whether `name` names a NumPy integer or floating type (an observation's dtype)."""
    try:
        return isinstance(name, str) and np.dtype(name).kind in "iuf"
    except TypeError:
        return False


# What a checkpoint's identity holds for it to be played: each key's check and what it must be.
# Keys written later (`frames_per_step`, `frame_pooling`) may be missing.
_IDENTITY_FIELDS = {
    "level_name": (lambda v: isinstance(v, str) and v != "", "a game's name"),
    "agent_name": (lambda v: isinstance(v, str) and v != "", "a network's name"),
    "num_actions": (lambda v: type(v) is int and v > 0, "a number of actions"),
    "observation_shape": (
        lambda v: isinstance(v, list) and all(type(d) is int and d > 0 for d in v),
        "a list of sizes",
    ),
    "observation_dtype": (_is_number_type, "a numeric type's name"),
    "num_action_repeats": (lambda v: type(v) is int and v > 0, "a number of repeats"),
}
_LATER_FIELDS = {
    "frames_per_step": (lambda v: type(v) is int and v > 0, "a number of frames"),
    "frame_pooling": (lambda v: isinstance(v, str), "a frame pooling"),
}


def read_identity(path: str) -> dict[str, Any]:
    """The checkpoint's environment and network, or a one-line ValueError naming it (a
    checkpoint that cannot be read, another program's, or one without a playable identity)."""
    try:
        identity = checkpoints.read_identity(path)
    except checkpoint_folder.READ_ERRORS as error:
        message = checkpoints.first_line(error)
        raise ValueError(
            f"{path}: not a checkpoint of this project's learner ({message})"
        ) from error
    for key in _IDENTITY_FIELDS:
        if key not in identity:
            raise ValueError(
                f"{path}: not a checkpoint of this project's learner (its identity has no {key})"
            )
    for key, (usable, what) in {**_IDENTITY_FIELDS, **_LATER_FIELDS}.items():
        if key in identity and not usable(identity[key]):
            raise ValueError(
                f"{path}: not a checkpoint of this project's learner (its {key} "
                f"{identity[key]!r:.80} is not {what})"
            )
    return identity


def read_counters(path: str) -> tuple[int, int]:
    """The frames and weight version the checkpoint was written at, or a one-line ValueError
    naming it."""
    try:
        return checkpoints.read_counter(path, "frames"), checkpoints.read_counter(path, "version")
    except checkpoint_folder.READ_ERRORS as error:
        raise ValueError(
            f"{path}: its frames and weight version cannot be read "
            f"({checkpoints.first_line(error)}); name an earlier checkpoint of "
            f"{os.path.dirname(path)} with --checkpoint"
        ) from None


def check_identity(identity: dict[str, Any], config: EvalConfig, path: str) -> None:
    """Raises a one-line ValueError if an explicit --level_name, --agent_name, --frame_skip
    (other than 0) or --frame_pooling differs (`config.given` names the game's)."""
    game, given = config.game, config.given
    if "level_name" in given and game.level_name != identity["level_name"]:
        raise ValueError(
            f"--level_name={game.level_name} differs from the checkpoint's "
            f"{identity['level_name']} ({path}); leave --level_name out to play its game"
        )
    # Agent names are case-insensitive, as for training.
    if config.agent_name is not None and config.agent_name.lower() != (
        identity["agent_name"].lower()
    ):
        raise ValueError(
            f"--agent_name={config.agent_name} differs from the checkpoint's "
            f"{identity['agent_name']} ({path}); leave --agent_name out to use its network"
        )
    if "frame_skip" in given and game.frame_skip:
        trained_skip = _frame_skip(identity)
        if game.frame_skip != trained_skip:
            raise ValueError(
                f"--frame_skip={game.frame_skip} differs from the checkpoint's "
                f"{trained_skip or 'none (not an Atari id)'} ({path}); leave --frame_skip "
                f"out to play as it was trained"
            )
    trained_pooling = run_identity.frame_pooling(identity)
    if "frame_pooling" in given and game.frame_pooling != trained_pooling:
        raise ValueError(
            f"--frame_pooling={game.frame_pooling} differs from the checkpoint's "
            f"{trained_pooling} ({path}); leave --frame_pooling out to play as it was trained"
        )


def restore_agent(path: str, identity: dict[str, Any]) -> networks.Agent:
    """Builds the checkpoint's network and restores every one of its weights from `path`.

    Raises:
      ValueError: the checkpoint lacks some of the network's weights, or holds weights that
        are not finite (NaN or infinite: a learner saves none, but a file may be anyone's).
    """
    try:
        agent = build.agent_for(
            identity["agent_name"],
            identity["num_actions"],
            identity["observation_shape"],
            identity["observation_dtype"],
        )
    except (tf.errors.OpError, ValueError, TypeError) as error:
        raise ValueError(
            f"{path}: its network cannot be built ({checkpoints.first_line(error)})"
        ) from None
    try:
        status = tf.train.Checkpoint(agent=agent).read(path)
    # Truncated or corrupt (CRCs are checked), or weights of other shapes than the network's.
    except (tf.errors.OpError, IndexError, ValueError) as error:
        raise ValueError(
            f"{path}: cannot be read ({checkpoints.first_line(error)}); name an earlier "
            f"checkpoint of {os.path.dirname(path)} with --checkpoint"
        ) from None
    status.expect_partial()  # The optimizer's slots and the counters are not needed here.
    try:
        status.assert_existing_objects_matched()  # But every weight of the agent is.
    except AssertionError as error:
        raise ValueError(
            f"{path}: does not hold all weights of a {identity['agent_name']}"
        ) from error
    not_finite = [v.name for v in agent.variables if not np.isfinite(v.numpy()).all()]
    if not_finite:
        raise ValueError(
            f"{path}: {len(not_finite)} of its {len(agent.variables)} weights, such as "
            f"{not_finite[0]}, are not finite; name an earlier checkpoint of "
            f"{os.path.dirname(path)} with --checkpoint"
        )
    return agent


def environment_config(
    identity: dict[str, Any], num_games: int, seed: int, repeat_action_probability: float = 0.0
) -> envs.EnvConfig:
    """The checkpoint's game and frame skip, one environment per game, environment i seeded
    `seed + i`; without sticky actions (`--mode=test`'s protocol) unless
    `repeat_action_probability` (to play as a run's actors did)."""
    return envs.EnvConfig(
        level_name=identity["level_name"],
        num_envs=num_games,
        seed=seed,
        num_action_repeats=identity["num_action_repeats"],
        repeat_action_probability=repeat_action_probability,
        frame_skip=_frame_skip(identity),
        frame_pooling=run_identity.frame_pooling(identity),
        # As in training, a lost Atari life is a `done` for the agent (a recurrent one
        # starts afresh there); the game goes on, and the scores are of whole games.
        episodic_life=True,
    )


def check_environment(env: envs.VectorEnvironment, identity: dict, path: str) -> None:
    """The environment must still look as it did to the network in training."""
    for key, value in run_identity.environment_view(env).items():
        if identity[key] != value:
            raise ValueError(
                f"{identity['level_name']} now has {key} {value}, but the checkpoint {path} "
                f"was trained with {identity[key]}"
            )


def _frame_skip(identity: dict[str, Any]) -> int:
    """The Atari frame skip a run trained with, 0 for other ids: the frames of one step over
    the action repeats (`run_identity.frames_per_step`)."""
    if not envs.is_atari(identity["level_name"]):
        return 0
    return run_identity.frames_per_step(identity, atari=True) // identity["num_action_repeats"]
