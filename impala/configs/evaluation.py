"""What --mode=test needs: `EvalConfig`, the checkpoint to play, how many games, how actions
are picked, the videos, and the game settings the command line gave."""

from __future__ import annotations

import dataclasses
from typing import Any

from impala.configs.declare import at_least, check_settings, config, rule, setting
from impala.configs.game import GameConfig

# How --mode=test picks actions: sampled from the policy, or its most likely one.
POLICIES = ("sample", "greedy")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _check_checkpoint(name: str, value: Any) -> None:
    if not _is_name(value):
        raise ValueError(f"--{name} is empty: give a run folder or a checkpoint")


def _check_num_episodes(name: str, value: Any) -> None:
    rule(_is_int, "must be an int", show=repr)(name, value)
    at_least(1)(name, value)


@config
class EvalConfig:
    """What --mode=test evaluates and how (the others are flags, whose help says what they do).

    Attributes:
      checkpoint: a run folder (its latest checkpoint), its `checkpoints/` folder (its latest)
        or one checkpoint such as `runs/pong/checkpoints/ckpt-25`.
      game: the game settings the flags give. The games are the checkpoint's; game k (from 0)
        is seeded `game.seed + k`, and action sampling `game.seed`.
      given: the names of the game settings given on the command line, which must match the
        checkpoint's: `level_name`, `frame_skip` (unless 0) and `frame_pooling`.
      agent_name: None to play with the checkpoint's network; given, it must match it.
    """

    checkpoint: str = setting(
        "",
        "--mode=test: what to load: a run folder (its latest checkpoint), its checkpoints/ "
        "folder or one checkpoint such as runs/pong/checkpoints/ckpt-5000. Default: the run "
        "folder <logdir>/<experiment>.",
        check=_check_checkpoint,
    )
    num_episodes: int = setting(
        10,
        "--mode=test: games to play.",
        check=_check_num_episodes,
        flag="test_num_episodes",
    )
    policy: str = setting(
        "sample",
        "--mode=test: sample actions from the policy, or take the most likely one.",
        check=rule(lambda value: value in POLICIES, "must be 'sample' or 'greedy'", show=repr),
        choices=POLICIES,
        flag="test_policy",
    )
    record_video: bool = setting(
        False,
        "--mode=test: write one MP4 per game.",
        check=rule(lambda value: isinstance(value, bool), "must be True or False", show=repr),
    )
    video_dir: str = setting(
        "",
        "--mode=test --record_video: where the MP4s go (default: <run>/videos/<checkpoint name>).",
        check=rule(lambda value: isinstance(value, str), "must be a folder path or ''", show=repr),
    )
    game: GameConfig = dataclasses.field(default_factory=GameConfig)
    given: tuple[str, ...] = ()
    agent_name: str | None = None

    def __post_init__(self):
        check_settings(self)
        if self.agent_name is not None and not _is_name(self.agent_name):
            raise ValueError(f"--agent_name={self.agent_name!r}: must be a name, or left out")
        game_settings = {field.name for field in dataclasses.fields(GameConfig)}
        unknown = sorted(set(self.given) - game_settings)
        if unknown:
            raise ValueError(f"given: {', '.join(unknown)} are not game settings")

    @property
    def seed(self) -> int:
        """The seed the games and the action sampling derive from (`game.seed`)."""
        return self.game.seed
