"""Whether a Pong checkpoint's network can tell the games begun on odd frames from the even ones.

  python -m benchmarks.parity_probe runs/pong                   # the run's latest checkpoint
  python -m benchmarks.parity_probe runs/pong/checkpoints/ckpt-2011 runs/pong/checkpoints/ckpt-7813

Pong moves the paddle on two-frame cycles and the frame skip of 4 keeps a game's start parity
all game long, so the same action moves the paddle differently in games begun on an odd frame
and on an even one. A policy that has learned one kind of game and not the other (a run stalled
at a mean near 0, winning the games of one parity) needs features that tell them apart first.

Plays `--num_games` games with each checkpoint's sampled policy (as `--mode=test` plays them,
without sticky actions; the same starts for every checkpoint) and keeps each game's first
`--steps` steps. On those steps it fits a linear (logistic) probe from what the network computed
to the game's start parity, on three readings of each step:
  paddle cue   whether each of the stacked frames shows the agent's paddle at two heights (the
               observation is the maximum of a step's last two frames, and in games of one
               parity a moving paddle was redrawn between them; a run trained with
               `--frame_pooling=last` never shows it twice): what the input shows;
  torso        the torso's features (for recurrent agents, before the core): what the network
               computed from it;
  outputs      the policy logits and the value estimate: what the network used of it.
Each probe is fitted on about three quarters of the games and scored on the rest, four times
over, so every game is scored once by a probe that saw neither it nor any game begun on the same
frame (whose opening can look the same). Printed for each:
  steps right  held-out steps whose parity the probe told right, balanced (the mean of the
               shares right among odd games' steps and among even games' steps; 50%: chance);
  games right  held-out games whose mean probe output over their steps tells their parity.
The torso's figure says whether the network has features that tell the two kinds of game
apart. The outputs' figure is no test of a policy: one that wins both kinds of game acts on the
parity only where the ball and the paddle are placed so that it matters, which a linear probe
over all steps hardly reads (docs/learning-history.md has the figures of stalled and winning
runs).
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from absl import app, flags

from benchmarks import checkpoint_tools, pong_points

FLAGS = flags.FLAGS

FOLDS = 4  # the games are held out a quarter at a time (`folds_of`)
L2 = 1e-2  # the probe's ridge penalty, on standardised features
_NEWTON_STEPS = 50


def _define_flags() -> None:
    # Defined only when run as a script, as in pong_points.
    flags.DEFINE_integer(
        "num_games", 64, "Games played together.", lower_bound=2 * FOLDS, upper_bound=256
    )
    flags.DEFINE_integer(
        "steps", 200, "Steps kept from each game's start.", lower_bound=1, upper_bound=500
    )
    flags.DEFINE_integer(
        "seed", 100, "Seeds the games' starts and the sampled actions.", lower_bound=0
    )


def fit_probe(features: np.ndarray, labels: np.ndarray, l2: float = L2) -> np.ndarray:
    """Weights (the last one the bias) of a logistic regression from `features` [N, D] to
    boolean `labels` [N], each class weighted to half the loss, with a ridge penalty `l2` on
    the weights but not the bias; fitted by Newton's method, which the penalty keeps finite
    on separable data."""
    x = np.hstack([np.asarray(features, np.float64), np.ones((len(features), 1))])
    y = np.asarray(labels, bool)
    if y.all() or not y.any():
        raise ValueError("a probe needs examples of both classes")
    weight = np.where(y, 0.5 / y.mean(), 0.5 / (1 - y.mean())) / len(y)
    penalty = np.full(x.shape[1], l2)
    penalty[-1] = 0.0
    w = np.zeros(x.shape[1])
    for _ in range(_NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w, -30, 30)))
        gradient = x.T @ (weight * (p - y)) + penalty * w
        hessian = (x * (weight * p * (1 - p))[:, None]).T @ x + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def folds_of(start_frames: np.ndarray) -> np.ndarray:
    """Each game's fold: games that began on the same frame (whose openings can be alike) share
    one, and so do the frames 2k and 2k + 1, so that every fold holds both parities."""
    return (np.asarray(start_frames) // 2) % FOLDS


def held_out_outputs(features: np.ndarray, labels: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Each example's probe output (a logit: above 0 says odd) from a probe fitted on the
    examples of the other folds, features standardised on those."""
    features = np.asarray(features, np.float64)
    outputs = np.zeros(len(features))
    for fold in range(FOLDS):
        held = folds == fold
        if not held.any():
            continue
        train = features[~held]
        mean, spread = train.mean(axis=0), train.std(axis=0)
        spread[spread == 0] = 1.0  # a constant feature stays 0 after standardising
        w = fit_probe((train - mean) / spread, labels[~held])
        outputs[held] = ((features[held] - mean) / spread) @ w[:-1] + w[-1]
    return outputs


def balanced_accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """The mean of the shares told right among the odd (label True) and the even examples."""
    labels = np.asarray(labels, bool)
    right = (np.asarray(outputs) > 0) == labels
    return 0.5 * (right[labels].mean() + right[~labels].mean())


@dataclasses.dataclass(frozen=True)
class Score:
    steps_right: float  # balanced accuracy over held-out steps
    games_right: int  # held-out games whose mean probe output tells their parity
    games: int


def score(features: np.ndarray, start_frames: np.ndarray) -> Score:
    """How well a linear probe on `features` [games * steps, D] (each game's steps together)
    tells the start parity of games it was not fitted on."""
    start_frames = np.asarray(start_frames)
    steps = len(features) // len(start_frames)
    odd = start_frames % 2 == 1
    labels = np.repeat(odd, steps)
    outputs = held_out_outputs(features, labels, np.repeat(folds_of(start_frames), steps))
    by_game = outputs.reshape(len(start_frames), steps).mean(axis=1) > 0
    return Score(balanced_accuracy(outputs, labels), int((by_game == odd).sum()), len(odd))


def check_starts(start_frames: np.ndarray) -> None:
    """A one-line ValueError unless the games of every fold, and of the others, hold both
    parities."""
    odd = np.asarray(start_frames) % 2 == 1
    folds = folds_of(start_frames)
    for fold in range(FOLDS):
        for games in (odd[folds == fold], odd[folds != fold]):
            if games.all() or not games.any():
                raise ValueError(
                    f"{odd.sum()} of {len(odd)} games began on an odd frame, too few of one "
                    f"parity to hold out a quarter of them; raise --num_games or change --seed"
                )


def _torso_features(agent, step, prev_action: np.ndarray) -> np.ndarray:
    """The features `agent`'s torso computes for `step` (an environment step's output), before
    any core; `prev_action` is the action that led to it."""
    import tensorflow as tf

    import networks

    observation = tf.convert_to_tensor(step.observation)
    if isinstance(agent, networks.agents.ShallowConvNetLastActionAgent):
        # As the agent reads it: no action shown on a game's first step.
        shown = tf.one_hot(prev_action, agent.num_actions) * (1 - step.done[:, None]).astype("f")
        return agent._torso(observation, shown).numpy()
    return agent._torso(observation).numpy()


def play_openings(
    checkpoint: str, num_games: int, steps: int, seed: int
) -> tuple[str, dict[str, np.ndarray], np.ndarray]:
    """The checkpoint's path, each reading of the docstring as [num_games * steps, D] (game
    after game, step after step), and the frame each game's play began on."""
    from impala import envs
    from impala.evaluation import restore
    from impala.evaluation.play import Policy

    path, identity, agent = pong_points.restore_pong(checkpoint)
    config = restore.environment_config(identity, num_games, seed)
    if config.atari_frames_per_step % 2:
        raise ValueError(
            f"{path}: trained with {config.atari_frames_per_step} frames a step, so a game's "
            f"parity alternates from step to step and no game has one to probe"
        )
    readings: dict[str, list[np.ndarray]] = {"paddle cue": [], "torso": [], "outputs": []}
    with envs.make_evaluation_environment(config) as env:
        policy = Policy(agent, greedy=False, seed=seed)
        step = env.reset()
        start_frames = env.episode_frames()
        check_starts(start_frames)
        policy.reset(num_games, 0)
        actions = np.zeros(num_games, np.int64)
        for _ in range(steps):
            torso = _torso_features(agent, step, actions)
            actions, logits = policy(step)
            cue = [
                [pong_points.paddle_drawn_twice(frame[..., k]) for k in range(frame.shape[-1])]
                for frame in step.observation
            ]
            readings["paddle cue"].append(np.array(cue, np.float64))
            readings["torso"].append(torso)
            readings["outputs"].append(np.hstack([logits, policy.baseline[:, None]]))
            step = env.step(actions)
            if step.done.any():  # Pong's games last hundreds of steps, but a flag can ask more
                raise ValueError(f"--steps={steps}: a game ended within its first {steps} steps")
    # [steps, games, D] -> [games * steps, D]: each game's steps together.
    stacked = {
        name: np.stack(rows, axis=1).reshape(num_games * steps, -1)
        for name, rows in readings.items()
    }
    return path, stacked, start_frames


def report(path: str, readings: dict[str, np.ndarray], start_frames: np.ndarray) -> list[str]:
    start_frames = np.asarray(start_frames)
    steps = len(next(iter(readings.values()))) // len(start_frames)
    lines = [
        f"{path}: {len(start_frames)} games ({(start_frames % 2).sum()} from an odd frame), "
        f"their first {steps} steps; each quarter of the games held out from its probe"
    ]
    for name, features in readings.items():
        result = score(features, start_frames)
        lines.append(
            f"  {name + ' (' + str(features.shape[1]) + ')':<18} steps right "
            f"{result.steps_right:6.1%}, games right {result.games_right:>3} of {result.games}"
        )
    return lines


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise app.UsageError("give checkpoints or run folders")
    for checkpoint in argv[1:]:
        with checkpoint_tools.one_line_errors("parity_probe.py"):
            path, readings, start_frames = play_openings(
                checkpoint, FLAGS.num_games, FLAGS.steps, FLAGS.seed
            )
            lines = report(path, readings, start_frames)
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
