"""Evaluation (`experiment.py --mode=test`): play whole games with a checkpoint's policy.

Reports the numbers a paper reports: the real game score over all lives, unclipped, with
random no-op starts as in training (0 to 29 frames, FIRE first where the game has it), no
sticky actions, games capped at 108,000 frames and the observations preprocessed exactly as
in training (`envs.make_evaluation_environment`).

Taking the first N games to finish from a few environments favours short games. Instead
N environments, each seeded `seed + k` for game k, play exactly one game each (the first),
in rounds of at most `MAX_PARALLEL_GAMES`.

With `record_video`, each game becomes `<video_dir>/game_<k>.mp4` (k from 1): one frame per
agent step, at the game's real speed (15 frames/s for Atari), from the first screen of the
game to its last, so a game of S agent steps has S + 1 frames. A video is written under a
temporary name and renamed when its game is over: an interrupted evaluation leaves no
half-written MP4 under a final name.

The package: `restore` finds, checks and restores the checkpoint; `play` plays the games;
`video` writes them as MP4s; here are the result and `run`, which joins them. The options,
`EvalConfig`, are in `impala/configs/evaluation.py`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np

from impala import envs
from impala.configs import POLICIES, EvalConfig
from impala.evaluation.play import Game, Policy, play, sample_actions, score_text
from impala.evaluation.restore import (
    check_environment,
    check_identity,
    environment_config,
    read_counters,
    read_identity,
    resolve_checkpoint,
    restore_agent,
    run_folder_of,
)
from impala.evaluation.video import Video, make_folder

__all__ = [
    "MAX_PARALLEL_GAMES",
    "POLICIES",
    "EvalConfig",
    "EvalResult",
    "Game",
    "Policy",
    "Video",
    "check_identity",
    "environment_config",
    "play",
    "read_identity",
    "resolve_checkpoint",
    "restore_agent",
    "run",
    "run_folder_of",
    "sample_actions",
]

# Environments stepped together; more games are played in rounds.
MAX_PARALLEL_GAMES = 16


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """The games a checkpoint played, in order, and the statistics of their scores.

    `std` is the population standard deviation (0 for one game).
    """

    checkpoint: str
    policy: str
    games: tuple[Game, ...]

    @property
    def scores(self) -> tuple[float, ...]:
        return tuple(game.score for game in self.games)

    @property
    def videos(self) -> tuple[str, ...]:
        return tuple(game.video for game in self.games if game.video)

    @property
    def mean(self) -> float:
        return float(np.mean(self.scores))

    @property
    def std(self) -> float:
        return float(np.std(self.scores))

    @property
    def min(self) -> float:
        return float(np.min(self.scores))

    @property
    def max(self) -> float:
        return float(np.max(self.scores))

    @property
    def by_parity(self) -> dict[str, tuple[int, float | None]] | None:
        """Atari: {"odd": (games, mean score), "even": ...} of the games begun on an odd and on
        an even frame (a frame skip of 4 keeps that parity all game, and Pong answers the same
        actions differently by it); None where the games have no start frames."""
        if not self.games or any(game.start_frames < 0 for game in self.games):
            return None
        groups = {}
        for name, parity in (("odd", 1), ("even", 0)):
            scores = [game.score for game in self.games if game.start_frames % 2 == parity]
            groups[name] = (len(scores), float(np.mean(scores)) if scores else None)
        return groups

    def summary(self) -> str:
        """E.g. 'score over 10 games (sampled policy): mean 12.3, std 4.5, min 5, max 19', and
        for Atari '; begun on an odd frame: 4 games, mean 19.0; on an even one: 6, mean 7.7'."""
        line = (
            f"score over {len(self.games)} games ({_POLICY_WORDS[self.policy]}): mean "
            f"{self.mean:.1f}, std {self.std:.1f}, min {score_text(self.min)}, max "
            f"{score_text(self.max)}"
        )
        parity = self.by_parity
        if parity is not None:
            (odd, odd_mean), (even, even_mean) = parity["odd"], parity["even"]
            line += f"; begun on an odd frame: {odd} game{'s' * (odd != 1)}" + (
                f", mean {odd_mean:.1f}" if odd else ""
            )
            line += f"; on an even one: {even}" + (f", mean {even_mean:.1f}" if even else "")
        return line


_POLICY_WORDS = {"sample": "sampled policy", "greedy": "greedy policy"}


def run(config: EvalConfig, report: Callable[[str], None] = print) -> EvalResult:
    """Loads the checkpoint's agent and plays `config.num_episodes` whole games with it.

    Raises:
      ValueError: one line, for a checkpoint that cannot be found or read, a
        `level_name` / `agent_name` other than the checkpoint's, or a game that cannot
        be recorded.
    """
    path = resolve_checkpoint(config.checkpoint)
    identity = read_identity(path)
    check_identity(identity, config, path)
    agent = restore_agent(path, identity)
    frames, version = read_counters(path)
    report(
        f"checkpoint {path}: {identity['level_name']} with {identity['agent_name']}, "
        f"{frames:,} frames, weight version {version}"
    )
    video_dir = None
    if config.record_video:
        # One folder per checkpoint, so that evaluating another one keeps these videos.
        video_dir = config.video_dir or os.path.join(
            run_folder_of(path), "videos", os.path.basename(path)
        )
        make_folder(video_dir)
    policy = Policy(agent, greedy=config.policy == "greedy", seed=config.game.seed)
    report(
        f"playing {config.num_episodes} games ({_POLICY_WORDS[config.policy]}), "
        f"{min(config.num_episodes, MAX_PARALLEL_GAMES)} at a time"
    )
    games: list[Game] = []
    for first in range(0, config.num_episodes, MAX_PARALLEL_GAMES):
        num_games = min(MAX_PARALLEL_GAMES, config.num_episodes - first)
        env_config = environment_config(identity, num_games, seed=config.game.seed + first)
        render = video_dir is not None
        with envs.make_evaluation_environment(env_config, render=render) as env:
            check_environment(env, identity, path)
            games += play(env, policy, first_index=first + 1, video_dir=video_dir, report=report)
    result = EvalResult(checkpoint=path, policy=config.policy, games=tuple(games))
    report(result.summary())
    return result
