"""A run's identity: the settings every actor, learner and checkpoint of one run must share.

An actor says hello with it and its learner compares; a checkpoint stores it and a resume or
--mode=test compares. TensorFlow-free: it is a dictionary of plain values, kept as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from impala.configs import ATARI_FRAME_SKIP

# Every key of an identity, in the order they are described.
KEYS = (
    "level_name",
    "agent_name",
    "num_actions",
    "observation_shape",
    "observation_dtype",
    "unroll_length",
    "num_action_repeats",
    "frames_per_step",
    "frame_pooling",
)

# What a checkpoint must match to be resumed: the unroll length, the batch size and the like may
# change between the starts of a run.
CHECKPOINT_KEYS = (
    "level_name",
    "agent_name",
    "num_actions",
    "observation_shape",
    "observation_dtype",
    "num_action_repeats",
    "frames_per_step",  # The frame skip: another one is another game for the network.
    "frame_pooling",  # So is another frame shown for a step.
)

# What the environment must still show for a network trained on it to make sense.
ENVIRONMENT_KEYS = ("num_actions", "observation_shape", "observation_dtype")


def make(
    *,
    level_name: str,
    agent_name: str,
    num_actions: int,
    observation_shape: tuple[int, ...],
    observation_dtype: str,
    unroll_length: int,
    num_action_repeats: int,
    frames_per_step: int,
    frame_pooling: str,
) -> dict[str, Any]:
    """The identity of a run with these settings (JSON-ready values)."""
    return {
        "level_name": level_name,
        "agent_name": agent_name,
        "num_actions": int(num_actions),
        "observation_shape": [int(d) for d in observation_shape],
        "observation_dtype": observation_dtype,
        "unroll_length": int(unroll_length),
        "num_action_repeats": int(num_action_repeats),
        "frames_per_step": int(frames_per_step),
        "frame_pooling": str(frame_pooling),
    }


def environment_view(env) -> dict[str, Any]:
    """The `ENVIRONMENT_KEYS` of an identity, as `env` (a `VectorEnvironment`) shows them now."""
    return {
        "num_actions": int(env.num_actions),
        "observation_shape": [int(d) for d in env.observation_shape],
        "observation_dtype": env.observation_dtype.name,
    }


def encode(identity: dict[str, Any]) -> str:
    """The identity as canonical JSON: equal identities give equal strings."""
    return json.dumps(identity, sort_keys=True)


def frame_pooling(identity: dict[str, Any]) -> str:
    """The frame a run's Atari steps showed: a checkpoint written before the frame pooling could
    be chosen does not hold it, and showed the maximum of a step's last two frames, "max"
    (every family's value)."""
    return identity.get("frame_pooling", "max")


def frames_per_step(identity: dict[str, Any], atari: bool) -> int:
    """The emulator frames of one of a run's steps: a checkpoint written before the frame skip
    could be chosen does not hold them, and was trained with the default skip, 4 frames per
    action repeat in Atari games (`atari`) and 1 elsewhere."""
    if "frames_per_step" in identity:
        return identity["frames_per_step"]
    return (ATARI_FRAME_SKIP if atari else 1) * identity["num_action_repeats"]


def with_legacy_defaults(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """`saved` (a checkpoint's identity) as this version keeps it, with what a checkpoint from
    before a setting could be chosen lacks filled in (`frame_pooling`, `frames_per_step`).

    The frame skip's default depends on the game: for a checkpoint of `current`'s game it is
    filled in, the game being an Atari one exactly where `current` runs more than one frame per
    action repeat (no other family skips frames). Of another game, it is left as `saved` has
    it: the game's name differs.
    """
    if "frame_pooling" in current:
        saved = {**saved, "frame_pooling": frame_pooling(saved)}
    if "frames_per_step" not in current or saved.get("level_name") != current.get("level_name"):
        return saved
    atari = current["frames_per_step"] > current["num_action_repeats"]
    return {**saved, "frames_per_step": frames_per_step(saved, atari)}


# Keys named in `mismatch` by the flags that set them, where those are not the key itself.
_LABELS = {
    "frames_per_step": "frames_per_step (--frame_skip x --num_action_repeats)",
    "frame_pooling": "frame_pooling (--frame_pooling)",
}


def decode(encoded: str | bytes) -> dict[str, Any]:
    """The identity saved as JSON (ValueError if it is not JSON, nested too deeply included)."""
    try:
        return json.loads(encoded.decode() if isinstance(encoded, bytes) else str(encoded))
    except RecursionError:
        raise ValueError("its identity is JSON nested too deeply") from None


def mismatch(
    reference: dict, other: dict, reference_name: str = "learner", other_name: str = "actor"
) -> str:
    """One line naming every setting in which `other` (an actor, a checkpoint) differs from
    `reference` (its learner, this run), with both values, or ''."""
    differences = [
        f"{_LABELS.get(key, key)}: {other_name} has {other.get(key)!r}, "
        f"{reference_name} has {reference.get(key)!r}"
        for key in sorted(set(reference) | set(other))
        if reference.get(key) != other.get(key)
    ]
    return "; ".join(differences)
