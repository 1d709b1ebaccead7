"""Point by point, how a Pong checkpoint wins and loses, read from the emulator's memory.

  python -m benchmarks.pong_points runs/pong                  # the run's latest checkpoint
  python -m benchmarks.pong_points runs/pong/checkpoints/ckpt-7813 --num_games=16

Plays `--num_games` games at once with the sampled policy, in the evaluation environments
(Gymnasium's ALE, one per game, whose memory can be read), and reads the ball's position from
the console's RAM at every step. Prints each game's score, the frame its play began on (after
the random no-ops) and its points in order (W won, l lost); the games that began on an odd
frame and on an even one apart (Pong moves the paddle on two-frame cycles and the frame skip
of 4 keeps a game's parity, so a policy can play one kind well and the other badly), each with
two figures that say whether the network can tell the two apart:
  * the share of steps whose observation shows the agent's paddle at two heights: the paddle
    is redrawn on even frames and the observation is the maximum of a step's last two frames
    (`--frame_pooling=max`, the default), one odd and one even, so in games of one parity a
    moving paddle was redrawn between those two frames and shows twice, in the other it shows
    once whatever it does (with `--frame_pooling=last`, once in both);
  * the network's value estimate over each game's first 50 steps, before the first point: a
    network that sees the parity expects less of the parity it loses.
Then the games by their first frame modulo 4, which the frame skip keeps all game long too:
a policy can also win the games of one phase and lose those of the other phase of the same
parity.
Then, for the games won and the games lost apart:
  * the points lost without the agent's paddle touching the ball (a policy that misses the
    ball) against all points lost (a policy that returns it and loses the rally);
  * the share won of each game's first point, played from the position every game starts
    in, and how many of those lost the paddle never touched;
  * the share won of the points served to the agent (the serve goes to the loser of the
    previous point) and of those served to the computer, each by the serve's vertical
    direction: a policy that has found a winning return of one kind of serve wins nearly all
    of those and few of the rest.
The games are played as `--mode=test` plays them, without sticky actions; with
`--repeat_action_probability=0.25` they are played as actors with sticky actions play theirs
(a press then takes effect a frame late now and then, so a game's parity no longer fixes how
the paddle answers every press). A checkpoint trained with an odd `--frame_skip` is played
with it, and its games' parity then alternates from step to step, whatever the start.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from absl import app, flags

from benchmarks import checkpoint_tools

if TYPE_CHECKING:
    import networks

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a script: the tests import this module beside experiment.py,
    # whose --seed is another flag.
    flags.DEFINE_integer("num_games", 16, "Games played together.", lower_bound=1, upper_bound=256)
    flags.DEFINE_integer("seed", 100, "Seeds the games and the sampled actions.", lower_bound=0)
    flags.DEFINE_float(
        "repeat_action_probability",
        0.0,
        "Atari's sticky actions (0: as --mode=test plays; the run's value: as its actors did).",
    )
    checkpoint_tools.require_probability("repeat_action_probability")


# Pong's RAM: the ball's x (the agent's paddle is on the right, the computer's on the left) and
# y (down the screen). The ball rests at one of these x values between points.
BALL_X, BALL_Y = 49, 54
MIDLINE_X = 128
_CENTRE = 8  # a served ball appears within this of the midline
_SERVE_JUMP = 16  # ... coming from further than the fastest ball moves in a step
# ... of at most this many frames (measured at 4; random play at 2 and 3 finds every serve too).
MAX_FRAMES_PER_STEP = 4

# The agent's paddle in the 84x84 observation: the column it is drawn in, the rows of the field
# between the walls, its grey (the field's is 87) and the most rows it covers when drawn once
# (16 of 210 screen lines; measured on a checkpoint's games, where a paddle drawn twice covered
# 7 to 11).
PADDLE_COLUMN = 74
FIELD_ROWS = slice(14, 78)
PADDLE_GREY = 140
PADDLE_ROWS = 6
OPENING_STEPS = 50  # the steps whose value estimates are averaged, from each game's first


def paddle_drawn_twice(frame: np.ndarray) -> bool:
    """Whether an 84x84 observation frame shows the agent's paddle at two heights at once."""
    longest = run = 0
    for lit in frame[FIELD_ROWS, PADDLE_COLUMN] >= PADDLE_GREY:
        run = run + 1 if lit else 0
        longest = max(longest, run)
    return longest > PADDLE_ROWS


@dataclasses.dataclass(frozen=True)
class Sight:
    """What the network saw and expected in one game."""

    steps: int
    paddle_twice: int  # steps whose newest frame showed the paddle at two heights
    opening_value: float  # the mean value estimate over the first OPENING_STEPS steps


@dataclasses.dataclass(frozen=True)
class Point:
    won: bool
    touches: int  # times the agent's paddle sent the ball back
    served_to_agent: bool | None  # None: the ball never moved (the game ended first)
    served_down: bool | None


def point_of(ball_x: np.ndarray, ball_y: np.ndarray, reward: float) -> Point:
    """What happened in one point from the ball's positions at each of its steps."""
    ball_x = np.asarray(ball_x, np.int64)
    ball_y = np.asarray(ball_y, np.int64)
    served_to_agent = served_down = None
    # The serve: the ball appears at the centre (a jump from where it rested) and moves on.
    appears = np.flatnonzero(
        (np.abs(np.diff(ball_x)) > _SERVE_JUMP) & (np.abs(ball_x[1:] - MIDLINE_X) <= _CENTRE)
    )
    if len(appears) and appears[0] + 2 < len(ball_x):
        serve = appears[0] + 1
        served_to_agent = bool(ball_x[serve + 1] > ball_x[serve])
        served_down = bool(ball_y[serve + 1] > ball_y[serve])
    dx = np.diff(ball_x)
    # The agent sends the ball back: moving right, then left (not reappearing at the centre),
    # on its half of the court.
    turns = (dx[:-1] > 0) & (dx[1:] < 0) & (dx[1:] >= -_SERVE_JUMP) & (ball_x[1:-1] > MIDLINE_X)
    return Point(reward > 0, int(turns.sum()), served_to_agent, served_down)


def split_points(ball_x, ball_y, rewards) -> list[Point]:
    """A game's points from its per-step ball positions and rewards (a point ends at a reward)."""
    points, start = [], 0
    for end in np.flatnonzero(np.asarray(rewards) != 0):
        points.append(point_of(ball_x[start : end + 1], ball_y[start : end + 1], rewards[end]))
        start = end + 1
    return points


def restore_pong(checkpoint: str) -> tuple[str, dict[str, Any], networks.Agent]:
    """As `checkpoint_tools.restore_checkpoint`, and a one-line ValueError for a checkpoint
    trained on another game than Pong."""
    path, identity, agent = checkpoint_tools.restore_checkpoint(checkpoint)
    if "Pong" not in str(identity.get("level_name")):
        raise ValueError(f"{path}: trained on {identity.get('level_name')!r}, not Pong")
    return path, identity, agent


def play_games(
    checkpoint: str, num_games: int, seed: int, repeat_action_probability: float = 0.0
) -> tuple[str, list[list[Point]], np.ndarray, list[Sight]]:
    """The checkpoint's path, the points of each of `num_games` games, the emulator frames
    (no-ops and FIRE) each game started with, and what the network saw and expected in each."""
    # The ML stack loads here, once the flags are checked (`checkpoint_tools`).
    from impala import envs
    from impala.evaluation import restore
    from impala.evaluation.play import Policy

    path, identity, agent = restore_pong(checkpoint)
    config = restore.environment_config(identity, num_games, seed, repeat_action_probability)
    if config.atari_frames_per_step > MAX_FRAMES_PER_STEP:
        raise ValueError(
            f"{path}: trained with {config.atari_frames_per_step} frames a step; the ball's "
            f"serves and returns are read for at most {MAX_FRAMES_PER_STEP}"
        )
    traces = [([], [], []) for _ in range(num_games)]
    twice = [0] * num_games
    values: list[list[float]] = [[] for _ in range(num_games)]
    games: list[list[Point] | None] = [None] * num_games
    with envs.make_evaluation_environment(config) as env:
        policy = Policy(agent, greedy=False, seed=seed)
        step = env.reset()
        start_frames = env.episode_frames()
        policy.reset(num_games, 0)
        while any(game is None for game in games):
            actions, _ = policy(step)
            rams = env.ram()  # the ball where the agent chose its action
            for index in range(num_games):
                if games[index] is None:
                    twice[index] += paddle_drawn_twice(step.observation[index, ..., -1])
                    values[index].append(float(policy.baseline[index]))
            step = env.step(actions)
            for index, (xs, ys, rewards) in enumerate(traces):
                if games[index] is not None:
                    continue
                xs.append(rams[index][BALL_X])
                ys.append(rams[index][BALL_Y])
                rewards.append(step.reward[index])
                if step.done[index]:
                    games[index] = split_points(np.array(xs), np.array(ys), np.array(rewards))
    sights = [
        Sight(len(v), t, float(np.mean(v[:OPENING_STEPS])))
        for v, t in zip(values, twice, strict=True)
    ]
    return path, games, start_frames, sights


def _share(points: list[Point]) -> str:
    if not points:
        return "-"
    return f"{sum(p.won for p in points) / len(points):.0%} of {len(points)}"


def _serve(point: Point) -> str:
    if point.served_to_agent is None:
        return "never"
    whom = "agent" if point.served_to_agent else "computer"
    return f"to the {whom} going {'down' if point.served_down else 'up'}"


def _score(points: list[Point]) -> int:
    return sum(1 if p.won else -1 for p in points)


def _tally(games: list[list[Point]]) -> str:
    """How many games, their mean score and how many were won, e.g. "4 (mean +2.0, 3 won)"."""
    scores = [_score(points) for points in games]
    mean = f"mean {np.mean(scores):+.1f}, " if scores else ""
    return f"{len(scores)} ({mean}{sum(score > 0 for score in scores)} won)"


def report(
    path: str, games: list[list[Point]], start_frames, sights: list[Sight] | None = None
) -> list[str]:
    lines = [f"{path}: {len(games)} games (sampled policy)"]
    for index, (points, start) in enumerate(zip(games, start_frames, strict=True)):
        outcomes = "".join("W" if p.won else "l" for p in points)
        lines.append(f"  game {index:>3}: {_score(points):+3d} (from frame {start:>2})  {outcomes}")
    # Frame skip 4 keeps the start's parity all game long, and Pong moves the paddle on
    # two-frame cycles: the same action moves it differently in odd and even games.
    for parity, name in ((1, "odd"), (0, "even")):
        chosen = [i for i, frame in enumerate(start_frames) if frame % 2 == parity]
        line = f"  games from an {name} frame: {_tally([games[i] for i in chosen])}"
        if sights and chosen:
            steps = sum(sights[i].steps for i in chosen)
            paddle_twice = sum(sights[i].paddle_twice for i in chosen) / steps
            opening = np.mean([sights[i].opening_value for i in chosen])
            line += (
                f"; paddle shown at two heights in {paddle_twice:.1%} of steps; value over "
                f"the first {OPENING_STEPS} steps {opening:+.3f}"
            )
        lines.append(line)
    # Within a parity, a game's start frame modulo 4 is also kept all game long (each step is
    # 4 frames): a policy can win the games of one such phase and lose those of its twin.
    phases = []
    for phase in range(4):
        chosen = [g for g, frame in zip(games, start_frames, strict=True) if frame % 4 == phase]
        if chosen:
            phases.append(f"{phase}: {_tally(chosen)}")
    lines.append("  games by their first frame modulo 4: " + "; ".join(phases))
    for name, chosen in (
        ("games won", [g for g in games if _score(g) > 0]),
        ("games lost", [g for g in games if _score(g) <= 0]),
    ):
        points = [p for g in chosen for p in g]
        lost = [p for p in points if not p.won]
        lines.append(f"  {name} ({len(chosen)}):")
        if not chosen:
            continue
        untouched = sum(p.touches == 0 for p in lost)
        lines.append(f"    points lost without touching the ball: {untouched} of {len(lost)}")
        firsts = [g[0] for g in chosen if g]
        missed = sum(not p.won and p.touches == 0 for p in firsts)
        serves = collections.Counter(_serve(p) for p in firsts)
        lines.append(
            f"    won, each game's first point: {_share(firsts)} "
            f"({missed} lost without touching the ball; served "
            + ", ".join(f"{where} in {count}" for where, count in sorted(serves.items()))
            + ")"
        )
        for to_agent, whom in ((True, "agent"), (False, "computer")):
            for down, where in ((True, "down"), (False, "up")):
                served = [
                    p for p in points if (p.served_to_agent, p.served_down) == (to_agent, down)
                ]
                lines.append(f"    won, served to the {whom} going {where}: {_share(served)}")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise app.UsageError("give one checkpoint or run folder")
    with checkpoint_tools.one_line_errors("pong_points.py"):
        path, games, start_frames, sights = play_games(
            argv[1], FLAGS.num_games, FLAGS.seed, FLAGS.repeat_action_probability
        )
    print("\n".join(report(path, games, start_frames, sights)))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
