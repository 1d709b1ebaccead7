"""Playing whole games: the checkpoint's policy drives a vector of environments until each has
finished its first game."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

import networks
from impala import envs
from impala.evaluation.video import Video

# Frames per second for ids that do not say how fast they run.
_DEFAULT_VIDEO_FPS = 30.0


@dataclasses.dataclass(frozen=True)
class Game:
    """One game played to its end.

    Attributes:
      index: the game's number, from 1 (its environment was seeded `seed + index - 1`).
      score: the unclipped sum of rewards over the whole game (all lives).
      steps: agent steps in the game.
      frames: emulator frames the agent's actions ran (steps x frame skip, less at the end).
      video: the game's MP4, or None.
      start_frames: Atari: the frames the game ran before the agent's first action (its
        random no-ops and FIRE; `envs.EpisodeStats.start_frames`); -1 for other games.
    """

    index: int
    score: float
    steps: int
    frames: int
    video: str | None = None
    start_frames: int = -1


def score_text(value: float) -> str:
    """A score as a person writes it: no '.0' on whole numbers."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


class Policy:
    """Chooses actions for a batch of environments with the agent, carrying its core state.

    Drives the agent as `actor.Actor` does: each step it sees the previous action, the
    reward and `done` (an episode starts here: the agent resets its core state there)
    with the observation.
    """

    def __init__(self, agent: networks.Agent, greedy: bool, seed: int):
        """Args: greedy: take the most likely action; else sample, game k's actions from a
        numpy generator seeded (`seed`, k), however many games are played together."""
        self._agent = agent
        self._greedy = greedy
        self._seed = seed
        self._rngs: list[np.random.Generator] = []
        self._step = tf.function(agent.__call__, autograph=False)  # no tensor control flow
        self._state = None
        self._prev_action = None
        self.baseline: np.ndarray | None = None  # the last call's value estimates, float32 [B]

    def reset(self, batch_size: int, first_index: int) -> None:
        """Starts over for `batch_size` environments that all begin an episode: the games
        numbered `first_index`, `first_index + 1`..."""
        self._rngs = [
            np.random.default_rng([self._seed, first_index + i]) for i in range(batch_size)
        ]
        self._state = self._agent.initial_state(batch_size)
        self._prev_action = np.zeros(batch_size, np.int32)

    def __call__(self, step: envs.StepOutput) -> tuple[np.ndarray, np.ndarray]:
        """Actions for `step` (from the env's reset or step).

        Returns:
          (int64 [B] actions, float32 [B, num_actions] policy logits).
        """
        inputs = networks.make_input(self._prev_action, step.reward, step.done, step.observation)
        output, self._state = self._step(inputs, self._state)
        logits = output.policy_logits.numpy()
        self.baseline = output.baseline.numpy()
        actions = logits.argmax(axis=1) if self._greedy else sample_actions(logits, self._rngs)
        self._prev_action = actions.astype(np.int32)
        return actions.astype(np.int64), logits


def sample_actions(logits: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """One action per row, drawn from softmax(logits [B, A]) with row b's generator; int64 [B]."""
    logits = np.asarray(logits, np.float64)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    cumulative = np.cumsum(weights, axis=1)
    draws = np.array([[rng.random()] for rng in rngs]) * cumulative[:, -1:]
    # The first action whose cumulative weight exceeds the draw (rounding kept in range).
    return np.minimum((cumulative <= draws).sum(axis=1), logits.shape[1] - 1).astype(np.int64)


def play(
    env: envs.VectorEnvironment,
    policy: Policy,
    first_index: int,
    video_dir: str | None,
    report: Callable[[str], None],
) -> list[Game]:
    """Plays until every environment finished its first game; returns those games.

    Environment i plays game `first_index + i`. Environments whose game is over go on
    playing (the vector steps them all) until the last game ends; those later games are
    not counted.
    """
    step = env.reset()
    policy.reset(env.num_envs, first_index)
    videos = {}
    if video_dir is not None:
        fps = env.screen_fps or _DEFAULT_VIDEO_FPS
        videos = {
            i: Video(os.path.join(video_dir, f"game_{first_index + i}.mp4"), fps)
            for i in range(env.num_envs)
        }
    games: dict[int, Game] = {}
    try:
        _add_screens(env, videos, final=False)
        while len(games) < env.num_envs:
            actions, _ = policy(step)
            step = env.step(actions)
            # One step ends at most one game per environment; later games do not count.
            ended = [s for s in env.pop_episode_stats() if s.env_index not in games]
            _add_screens(env, videos, final=True)
            for stats in ended:
                video = videos.pop(stats.env_index).finish() if videos else None
                game = Game(
                    index=first_index + stats.env_index,
                    score=stats.episode_return,
                    steps=stats.episode_steps,
                    frames=stats.episode_frames,
                    video=video,
                    start_frames=stats.start_frames,
                )
                games[stats.env_index] = game
                report(_game_line(game))
    finally:
        for video in videos.values():  # Interrupted: no half-written videos are left.
            video.discard()
    return [games[i] for i in sorted(games)]


def _add_screens(env: envs.VectorEnvironment, videos: dict, final: bool) -> None:
    """Adds each recorded environment's screen to its video."""
    if not videos:
        return
    screens = env.render(final=final)
    for index, video in videos.items():
        video.add(screens[index])


def _game_line(game: Game) -> str:
    line = f"game {game.index}: score {score_text(game.score)}, {game.frames:,} frames"
    line += f" ({game.steps:,} steps)"
    if game.start_frames >= 0:
        line += f", begun on frame {game.start_frames}"
    return line + (f", video {game.video}" if game.video else "")
