"""How a run's games are played: `GameConfig`, which every role holds and builds its
environments from (`impala.envs.EnvConfig.for_game`), and the checks of its values."""

from __future__ import annotations

import numbers
from typing import Any

from impala.configs.declare import check_settings, config, non_negative, raising, rule, setting

# Emulator frames per agent step in the DeepMind Atari setup, unless --frame_skip says otherwise
# (`impala.envs` uses it; here, the checks and run identities need no environments).
ATARI_FRAME_SKIP = 4
MAX_ACTION_REPEATS = (2**31 - 1) // ATARI_FRAME_SKIP
# Atari frame skips: at least 2, since each step max-pools its last two frames; at most as many
# as keep `frame_skip * num_action_repeats` within ALE's 32-bit frame counts.
MIN_FRAME_SKIP = 2
# How an Atari step's observed frame is made from the emulator frames it ran: "max", DeepMind's,
# the pixel-wise maximum of its last two (against sprites drawn on alternate frames); "last",
# its last frame alone.
FRAME_POOLING_CHOICES = ("max", "last")


def check_repeat_action_probability(value: Any) -> None:
    """Raises the one-line error of a bad --repeat_action_probability (Atari's sticky actions)."""
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (is_number and 0 <= value < 1):  # 1 would repeat the first action for ever
        raise ValueError(
            f"--repeat_action_probability={value if is_number else repr(value)}: must be a "
            "number in [0, 1) (0: no sticky actions; 0.25: Gymnasium v5's)"
        )


def check_frame_pooling(value: Any) -> None:
    """Raises the one-line error of a bad --frame_pooling (Atari's; "max": DeepMind's)."""
    if value not in FRAME_POOLING_CHOICES:
        raise ValueError(
            f"--frame_pooling={value!r}: must be one of {', '.join(FRAME_POOLING_CHOICES)} "
            "(max: the maximum of a step's last two frames, DeepMind's; last: its last frame)"
        )


def check_frame_skip(frame_skip: Any, num_action_repeats: int = 1) -> None:
    """Raises the one-line error of a bad --frame_skip (Atari's; 0: the default, 4)."""
    is_int = isinstance(frame_skip, numbers.Integral) and not isinstance(frame_skip, bool)
    if not (is_int and (frame_skip == 0 or frame_skip >= MIN_FRAME_SKIP)):
        raise ValueError(
            f"--frame_skip={frame_skip if is_int else repr(frame_skip)}: must be 0 (the default: "
            f"4, DeepMind's) or an integer of at least {MIN_FRAME_SKIP} (each step max-pools its "
            "last two frames)"
        )
    if frame_skip * num_action_repeats > 2**31 - 1:
        raise ValueError(
            f"--frame_skip={frame_skip}: times --num_action_repeats={num_action_repeats} exceeds "
            "2**31 - 1, the largest frame count ALE keeps"
        )


def _check_num_action_repeats(name: str, value: int) -> None:
    rule(lambda v: v >= 1, "must be at least 1 (1: no repeat beyond the Atari frame skip)")(
        name, value
    )
    rule(
        lambda v: v <= MAX_ACTION_REPEATS,
        f"must be at most {MAX_ACTION_REPEATS} (x 4, Atari's frame skip is a 32-bit integer)",
    )(name, value)


def _is_level_name(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


@config
class GameConfig:
    """The settings that say how the run's games are played, the same for every process of a
    run: the learner builds an environment with them to read its specs, and refuses actors
    whose games differ (`impala/run_identity.py`)."""

    level_name: str = setting(
        "PongNoFrameskip-v4",
        "Gymnasium environment id with a discrete action space; Atari ids get DeepMind's "
        "preprocessing.",
        check=rule(_is_level_name, "must be a Gymnasium id such as PongNoFrameskip-v4"),
    )
    num_action_repeats: int = setting(
        1,
        "Times each action is repeated, on top of the Atari frame skip.",
        check=_check_num_action_repeats,
    )
    repeat_action_probability: float = setting(
        0.0,
        "Atari's sticky actions in training: on each emulator frame the game keeps its previous "
        "action instead of the agent's with this probability (0.25 in Gymnasium's v5 protocol). "
        "It decides for every Atari id, v5 ones included; other ids refuse a value above 0. "
        "--mode=test always plays without them.",
        check=raising(check_repeat_action_probability),
    )
    frame_skip: int = setting(
        0,
        "Atari only: emulator frames per agent step, the last two max-pooled; 0 for DeepMind's 4, "
        "else at least 2. An odd skip alternates the frame parity from step to step. --mode=test "
        "plays with the checkpoint's and refuses another one given here.",
        check=raising(check_frame_skip),
    )
    frame_pooling: str = setting(
        "max",
        "Atari only: the frame an agent step shows. max: the pixel-wise maximum of its last two "
        "emulator frames (DeepMind's, for sprites drawn on alternate frames). last: its last "
        "frame alone. --mode=test plays with the checkpoint's.",
        check=raising(check_frame_pooling),
        choices=FRAME_POOLING_CHOICES,
    )
    seed: int = setting(
        0, "Seeds environments, action sampling and initial weights.", check=non_negative()
    )

    def __post_init__(self):
        check_settings(self)
        check_frame_skip(self.frame_skip, self.num_action_repeats)
