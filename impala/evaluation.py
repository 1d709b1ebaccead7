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
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np
import tensorflow as tf

import networks
from impala import envs, run_folder, run_identity
from impala.learner import checkpoints

POLICIES = ("sample", "greedy")
# Environments stepped together; more games are played in rounds.
MAX_PARALLEL_GAMES = 16
# Frames per second for ids that do not say how fast they run.
_DEFAULT_VIDEO_FPS = 30.0
_PARTIAL_VIDEO_SUFFIX = ".incomplete.mp4"  # OpenCV picks the container by the extension.


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and how.

    Attributes:
      checkpoint: a run folder (its latest checkpoint), its `checkpoints/` folder (its
        latest) or one checkpoint such as `runs/pong/checkpoints/ckpt-25`.
      num_episodes: whole games to play.
      policy: "sample" (from the policy's softmax) or "greedy" (its most likely action).
      record_video: write one MP4 per game.
      video_dir: where the MP4s go; '' for `<run folder>/videos`, the run folder being the
        one that holds the checkpoint's `checkpoints/` folder.
      seed: game k (from 0) is seeded `seed + k`; action sampling is seeded `seed`.
      level_name, agent_name: None to play what the checkpoint holds; given, they must
        match it.
    """

    checkpoint: str
    num_episodes: int = 10
    policy: str = "sample"
    record_video: bool = False
    video_dir: str = ""
    seed: int = 0
    level_name: str | None = None
    agent_name: str | None = None

    def __post_init__(self):
        if not isinstance(self.checkpoint, str) or not self.checkpoint:
            raise ValueError("--checkpoint is empty: give a run folder or a checkpoint")
        if not _is_int(self.num_episodes) or self.num_episodes < 1:
            raise ValueError(f"--test_num_episodes={self.num_episodes!r}: must be an int >= 1")
        if self.policy not in POLICIES:
            raise ValueError(f"--test_policy={self.policy!r}: must be 'sample' or 'greedy'")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"--seed={self.seed!r}: must be an int >= 0")
        if not isinstance(self.record_video, bool):
            raise ValueError(f"--record_video={self.record_video!r}: must be True or False")
        if not isinstance(self.video_dir, str):
            raise ValueError(f"--video_dir={self.video_dir!r}: must be a folder path or ''")
        for flag, value in (("level_name", self.level_name), ("agent_name", self.agent_name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"--{flag}={value!r}: must be a name, or left out")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Game:
    """One game played to its end.

    Attributes:
      index: the game's number, from 1 (its environment was seeded `seed + index - 1`).
      score: the unclipped sum of rewards over the whole game (all lives).
      steps: agent steps in the game.
      frames: emulator frames the agent's actions ran (steps x frame skip, less at the end).
      video: the game's MP4, or None.
    """

    index: int
    score: float
    steps: int
    frames: int
    video: str | None = None


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

    def summary(self) -> str:
        """E.g. 'score over 10 games (sampled policy): mean 12.3, std 4.5, min 5, max 19'."""
        return (
            f"score over {len(self.games)} games ({_POLICY_WORDS[self.policy]}): mean "
            f"{self.mean:.1f}, std {self.std:.1f}, min {_number(self.min)}, max "
            f"{_number(self.max)}"
        )


_POLICY_WORDS = {"sample": "sampled policy", "greedy": "greedy policy"}


def _number(value: float) -> str:
    """A score as a person writes it: no '.0' on whole numbers."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


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
    report(
        f"checkpoint {path}: {identity['level_name']} with {identity['agent_name']}, "
        f"{checkpoints.read_counter(path, 'frames'):,} frames, weight version "
        f"{checkpoints.read_counter(path, 'version')}"
    )
    video_dir = None
    if config.record_video:
        # One folder per checkpoint, so that evaluating another one keeps these videos.
        video_dir = config.video_dir or os.path.join(
            run_folder_of(path), "videos", os.path.basename(path)
        )
        _make_folder(video_dir)
    policy = Policy(agent, greedy=config.policy == "greedy", seed=config.seed)
    report(
        f"playing {config.num_episodes} games ({_POLICY_WORDS[config.policy]}), "
        f"{min(config.num_episodes, MAX_PARALLEL_GAMES)} at a time"
    )
    games: list[Game] = []
    for first in range(0, config.num_episodes, MAX_PARALLEL_GAMES):
        num_games = min(MAX_PARALLEL_GAMES, config.num_episodes - first)
        env_config = environment_config(identity, num_games, seed=config.seed + first)
        render = video_dir is not None
        with envs.make_evaluation_environment(env_config, render=render) as env:
            _check_environment(env, identity, path)
            games += play(env, policy, first_index=first + 1, video_dir=video_dir, report=report)
    result = EvalResult(checkpoint=path, policy=config.policy, games=tuple(games))
    report(result.summary())
    return result


# --------------------------------------------------------------------------- #
# The checkpoint.
# --------------------------------------------------------------------------- #


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
        latest = tf.train.latest_checkpoint(folder)
        if latest is None:
            raise ValueError(f"--checkpoint={checkpoint}: no checkpoint in {folder}")
        return latest
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


def read_identity(path: str) -> dict[str, Any]:
    """The checkpoint's environment and network, or a one-line ValueError naming it."""
    try:
        return checkpoints.read_identity(path)
    except (tf.errors.OpError, ValueError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{path}: not a checkpoint of this project's learner ({message})"
        ) from error


def check_identity(identity: dict[str, Any], config: EvalConfig, path: str) -> None:
    """Raises a one-line ValueError if an explicit --level_name or --agent_name differs."""
    if config.level_name is not None and config.level_name != identity["level_name"]:
        raise ValueError(
            f"--level_name={config.level_name} differs from the checkpoint's "
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


def restore_agent(path: str, identity: dict[str, Any]) -> networks.Agent:
    """Builds the checkpoint's network and restores every one of its weights from `path`.

    Raises:
      ValueError: the checkpoint lacks some of the network's weights.
    """
    agent = networks.make_agent(identity["agent_name"], identity["num_actions"])
    networks.build_variables(
        agent, tuple(identity["observation_shape"]), identity["observation_dtype"]
    )
    status = tf.train.Checkpoint(agent=agent).restore(path)
    status.expect_partial()  # The optimizer's slots and the counters are not needed here.
    try:
        status.assert_existing_objects_matched()  # But every weight of the agent is.
    except AssertionError as error:
        raise ValueError(
            f"{path}: does not hold all weights of a {identity['agent_name']}"
        ) from error
    return agent


def environment_config(identity: dict[str, Any], num_games: int, seed: int) -> envs.EnvConfig:
    """The checkpoint's game, one environment per game, environment i seeded `seed + i`."""
    return envs.EnvConfig(
        level_name=identity["level_name"],
        num_envs=num_games,
        seed=seed,
        num_action_repeats=identity["num_action_repeats"],
        # As in training, a lost Atari life is a `done` for the agent (a recurrent one
        # starts afresh there); the game goes on, and the scores are of whole games.
        episodic_life=True,
    )


def _check_environment(env: envs.VectorEnvironment, identity: dict, path: str) -> None:
    """The environment must still look as it did to the network in training."""
    for key, value in run_identity.environment_view(env).items():
        if identity[key] != value:
            raise ValueError(
                f"{identity['level_name']} now has {key} {value}, but the checkpoint {path} "
                f"was trained with {identity[key]}"
            )


# --------------------------------------------------------------------------- #
# Playing.
# --------------------------------------------------------------------------- #


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
        self._step = tf.function(agent.__call__)
        self._state = None
        self._prev_action = None

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
    line = f"game {game.index}: score {_number(game.score)}, {game.frames:,} frames"
    line += f" ({game.steps:,} steps)"
    return line + (f", video {game.video}" if game.video else "")


# --------------------------------------------------------------------------- #
# Videos.
# --------------------------------------------------------------------------- #


class Video:
    """One game's MP4 (OpenCV, codec mp4v), written under a temporary name until finished."""

    def __init__(self, path: str, fps: float):
        """Args: path: the finished video's name, ending in .mp4. fps: frames per second."""
        self.path = path
        self.partial_path = path[: -len(".mp4")] + _PARTIAL_VIDEO_SUFFIX
        self._fps = fps
        self._writer: cv2.VideoWriter | None = None

    def add(self, screen: np.ndarray) -> None:
        """Appends one RGB frame, uint8 [height, width, 3]."""
        if self._writer is None:
            height, width = screen.shape[:2]
            fourcc = cv2.VideoWriter_fourcc(*"mp4v")
            self._writer = cv2.VideoWriter(self.partial_path, fourcc, self._fps, (width, height))
            if not self._writer.isOpened():
                raise ValueError(f"--video_dir: cannot write the video {self.partial_path}")
        self._writer.write(cv2.cvtColor(screen, cv2.COLOR_RGB2BGR))

    def finish(self) -> str:
        """Completes the file and gives it its final name; returns that name."""
        self._writer.release()
        os.replace(self.partial_path, self.path)
        return self.path

    def discard(self) -> None:
        """Drops an unfinished video."""
        if self._writer is not None:
            self._writer.release()
            if os.path.exists(self.partial_path):
                os.remove(self.partial_path)


def _make_folder(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--video_dir={folder}: cannot create it ({error.strerror})") from error
