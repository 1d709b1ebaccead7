"""How much a network's outputs depend on what it sees: a diagnostic for policies that do not learn.

  python -m benchmarks.probe_network runs/pong                  # a run's latest checkpoint
  python -m benchmarks.probe_network runs/pong/checkpoints/ckpt-2011 init   # and a fresh network

Plays `--num_envs` games with random actions, keeps 64 frames from them, and prints for each
checkpoint (a run folder, its checkpoints folder or one checkpoint) or `init` (a network as it
starts) on those frames:
  features alive   torso features (after the last ReLU) above 0 on at least one frame;
  feature mean     their mean over frames and features (their scale: a per-weight optimiser
                   step moves the logits in proportion to it);
  feature spread   the features' standard deviation across frames over their mean;
  logits std       the policy logits' standard deviation across frames (0: the same policy on
                   every frame, whatever it shows);
  value std        the baseline's standard deviation across frames.
A checkpoint is probed with its own network, on frames of its own game and frame skip; `init` with
--agent_name, on frames of --level_name with --frame_skip.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from absl import app, flags

import networks
from benchmarks import checkpoint_tools
from impala import build, configs, envs
from impala.evaluation import restore

FLAGS = flags.FLAGS
flags.DEFINE_string("level_name", "PongNoFrameskip-v4", "`init`: the game whose frames are shown.")
flags.DEFINE_string("agent_name", configs.DEFAULT_AGENT_NAME, "`init`: the network.")
flags.DEFINE_integer("num_envs", 8, "Games played with random actions.", lower_bound=1)
flags.DEFINE_integer("seed", 7, "Seeds the games, their actions and an `init` network.")
flags.DEFINE_integer(
    "frame_skip",
    0,
    "`init`, Atari: the frame skip of the frames shown (a run's --frame_skip); 0: the default, 4.",
    lower_bound=0,
)


def frames(config: envs.EnvConfig) -> tuple[np.ndarray, int]:
    """64 observations from random play (8 moments of `config.num_envs` games, seeded from
    `config.seed`), and the action count."""
    with envs.make_environment(config) as env:
        output, kept = env.reset(), []
        rng = np.random.default_rng(config.seed)
        for step in range(200):
            output = env.step(rng.integers(0, env.num_actions, config.num_envs))
            if step % 25 == 24:
                kept.append(output.observation)
        return np.concatenate(kept)[:64], env.num_actions


def probe(agent: networks.FeedForwardAgent, observations: np.ndarray) -> dict[str, float]:
    """The figures of the module docstring for `agent` on `observations` [N, ...]."""
    observations = tf.constant(observations)
    features = agent._torso(observations).numpy()
    batch = len(observations)
    inputs = networks.AgentInput(
        tf.zeros(batch, tf.int32), tf.zeros(batch), tf.zeros(batch, tf.bool), observations
    )
    output, _ = agent(inputs, ())
    return {
        "features_alive": int((features > 0).any(axis=0).sum()),
        "features": features.shape[1],
        "feature_mean": float(features.mean()),
        "feature_spread": float(features.std(axis=0).mean() / max(features.mean(), 1e-12)),
        "logits_std": float(output.policy_logits.numpy().std(axis=0).mean()),
        "value_std": float(output.baseline.numpy().std()),
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise app.UsageError("give checkpoints (runs/<name>, or one of its checkpoints) or init")
    shown: dict[tuple, tuple[np.ndarray, int]] = {}  # the frames of each game and frame skip
    for path in argv[1:]:
        try:
            config, agent = _network(path)
            game = (config.level_name, config.num_action_repeats, config.frame_skip)
            if game not in shown:
                shown[game] = frames(config)
        except ValueError as error:
            # A bad checkpoint is the argument's error; a bad flag is a usage error.
            message = str(error).removeprefix("--checkpoint=")
            print(f"probe_network.py: error: {message}", file=sys.stderr)
            return 1 if path != "init" else 2
        observations, num_actions = shown[game]
        if agent is None:
            tf.random.set_seed(FLAGS.seed)
            agent = build.agent_for(
                FLAGS.agent_name, num_actions, observations.shape[1:], observations.dtype
            )
        if not isinstance(agent, networks.FeedForwardAgent):
            raise app.UsageError(f"{path}: {type(agent).__name__}: only feed-forward agents")
        figures = probe(agent, observations)
        print(
            f"{path}: {type(agent).__name__}, features alive "
            f"{figures['features_alive']}/{figures['features']}, "
            f"feature mean {figures['feature_mean']:.3f}, "
            f"feature spread {figures['feature_spread']:.3f}, "
            f"logits std {figures['logits_std']:.4f}, value std {figures['value_std']:.3f}"
        )
    return 0


def _network(path: str) -> tuple[envs.EnvConfig, networks.Agent | None]:
    """The games to show `path` and its restored network; for `init`, the flags' games and no
    network yet (it is built once the games tell the action count and observation shape)."""
    if path == "init":
        config = envs.EnvConfig(
            FLAGS.level_name, num_envs=FLAGS.num_envs, seed=FLAGS.seed, frame_skip=FLAGS.frame_skip
        )
        return config, None
    _, identity, agent = checkpoint_tools.restore_checkpoint(path)
    config = restore.environment_config(identity, FLAGS.num_envs, FLAGS.seed)
    # Random play needs no sticky actions' absence or episodic lives to be what training had;
    # the same frames for `init` and a checkpoint of the same game make them comparable.
    config = envs.EnvConfig(
        config.level_name,
        num_envs=config.num_envs,
        seed=config.seed,
        num_action_repeats=config.num_action_repeats,
        frame_skip=config.frame_skip,
    )
    return config, agent


if __name__ == "__main__":
    app.run(main)
