"""How a checkpoint's games end, environment by environment, in the environments training uses.

  python -m benchmarks.probe_games runs/pong                 # the run's latest checkpoint
  python -m benchmarks.probe_games runs/pong/checkpoints/ckpt-7813 --games_per_env=4

Plays `--num_envs` environments built as an actor builds them (`envs.make_environment`, not
the separate games of `--mode=test`), sampling actions from the policy, until each has
finished `--games_per_env` games. Prints each environment's scores in the order its games
ended, then the distribution of all of them. A mean made of two clusters (games won by a few
points and games lost by nearly 21) says the policy plays two ways; the same clusters in every
environment say no environment is at fault. A run trained with sticky actions plays as its
actors did with its `--repeat_action_probability` given here too.
"""

from __future__ import annotations

import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from absl import app, flags

from benchmarks import checkpoint_tools

FLAGS = flags.FLAGS
flags.DEFINE_integer(
    "num_envs", 16, "Environments stepped together (an actor's default).", lower_bound=1
)
flags.DEFINE_integer("games_per_env", 2, "Games each environment finishes.", lower_bound=1)
flags.DEFINE_float(
    "repeat_action_probability",
    0.0,
    "Atari's sticky actions, as the run's actors had them (its flags.json says).",
)
checkpoint_tools.require_probability("repeat_action_probability")
flags.DEFINE_integer("seed", 100, "Seeds the environments and the sampled actions.", lower_bound=0)

# Score bins for Pong-like games from -21 to 21; other games get their own range.
_PONG_BINS = (-21.5, -15.5, -10.5, -5.5, -0.5, 4.5, 9.5, 14.5, 21.5)


def play_games(
    checkpoint: str,
    num_envs: int,
    games_per_env: int,
    seed: int,
    repeat_action_probability: float = 0.0,
) -> list[list]:
    """Each environment's scores, in the order its games ended ([num_envs] lists)."""
    # The ML stack loads here, once the flags are checked (`checkpoint_tools`).
    from impala import envs
    from impala.evaluation import restore
    from impala.evaluation.play import Policy

    path, identity, agent = checkpoint_tools.restore_checkpoint(checkpoint)
    config = restore.environment_config(identity, num_envs, seed, repeat_action_probability)
    scores = collections.defaultdict(list)
    with envs.make_environment(config) as env:
        policy = Policy(agent, greedy=False, seed=seed)
        step = env.reset()
        policy.reset(num_envs, 0)
        while min(len(scores[i]) for i in range(num_envs)) < games_per_env:
            actions, _ = policy(step)
            step = env.step(actions)
            for stats in env.pop_episode_stats():
                scores[stats.env_index].append(stats.episode_return)
    print(f"{path}: {num_envs} environments, {games_per_env} games each (sampled policy)")
    return [scores[i][:games_per_env] for i in range(num_envs)]


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise app.UsageError("give one checkpoint or run folder")
    with checkpoint_tools.one_line_errors("probe_games.py"):
        by_env = play_games(
            argv[1],
            FLAGS.num_envs,
            FLAGS.games_per_env,
            FLAGS.seed,
            FLAGS.repeat_action_probability,
        )
    for index, scores in enumerate(by_env):
        print(f"  environment {index:>2}: {' '.join(f'{s:+.0f}' for s in scores)}")
    every = np.concatenate(by_env)
    bins = _PONG_BINS if every.min() >= -21 and every.max() <= 21 else 8
    counts, edges = np.histogram(every, bins=bins)
    print(f"  mean {every.mean():+.1f} over {len(every)} games; games by score:")
    for count, low, high in zip(counts, edges[:-1], edges[1:], strict=True):
        print(f"    {np.ceil(low) + 0.0:+4.0f} to {np.floor(high) + 0.0:+4.0f}: {count}")


if __name__ == "__main__":
    app.run(main)
