"""How much a network's outputs depend on what it sees: a diagnostic for policies that do not learn.

  python -m benchmarks.probe_network runs/pong/checkpoints/ckpt-2011   # a trained checkpoint
  python -m benchmarks.probe_network init --agent_name=SimpleConvNetAgent  # freshly initialised

Plays `--num_envs` games with random actions, keeps 64 frames from them, and prints for each
checkpoint (or `init`, a network as it starts) on those frames:
  features alive   torso features (after the last ReLU) above 0 on at least one frame;
  feature mean     their mean over frames and features (their scale: a per-weight optimiser
                   step moves the logits in proportion to it);
  feature spread   the features' standard deviation across frames over their mean;
  logits std       the policy logits' standard deviation across frames (0: the same policy on
                   every frame, whatever it shows);
  value std        the baseline's standard deviation across frames.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from absl import app, flags

import networks
from impala import build, configs, envs

FLAGS = flags.FLAGS
flags.DEFINE_string("level_name", "PongNoFrameskip-v4", "The game whose frames are shown.")
flags.DEFINE_string("agent_name", configs.DEFAULT_AGENT_NAME, "The checkpoints' network.")
flags.DEFINE_integer("num_envs", 8, "Games played with random actions.", lower_bound=1)
flags.DEFINE_integer("seed", 7, "Seeds the games, their actions and an `init` network.")
flags.DEFINE_integer(
    "frame_skip",
    0,
    "Atari: the frame skip the checkpoints trained with (their run's --frame_skip); 0: the "
    "default, 4.",
    lower_bound=0,
)


def frames(
    level_name: str, num_envs: int, seed: int, frame_skip: int = 0
) -> tuple[np.ndarray, int]:
    """64 observations from random play (8 moments of `num_envs` games), and the action count."""
    config = envs.EnvConfig(level_name, num_envs=num_envs, seed=seed, frame_skip=frame_skip)
    with envs.make_environment(config) as env:
        output, kept = env.reset(), []
        rng = np.random.default_rng(seed)
        for step in range(200):
            output = env.step(rng.integers(0, env.num_actions, num_envs))
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
        raise app.UsageError("give checkpoints (runs/<name>/checkpoints/ckpt-N) or init")
    try:
        observations, num_actions = frames(
            FLAGS.level_name, FLAGS.num_envs, FLAGS.seed, FLAGS.frame_skip
        )
    except ValueError as error:
        print(f"probe_network.py: error: {error}", file=sys.stderr)
        return 2
    for path in argv[1:]:
        tf.random.set_seed(FLAGS.seed)
        agent = build.agent_for(
            FLAGS.agent_name, num_actions, observations.shape[1:], observations.dtype
        )
        if not isinstance(agent, networks.FeedForwardAgent):
            raise app.UsageError(f"--agent_name={FLAGS.agent_name}: only feed-forward agents")
        if path != "init":
            try:
                tf.train.Checkpoint(agent=agent).restore(path).expect_partial()
            except (tf.errors.OpError, ValueError) as error:
                message = str(error).splitlines()[0]
                print(f"probe_network.py: error: cannot restore {path}: {message}", file=sys.stderr)
                return 1
        figures = probe(agent, observations)
        print(
            f"{path}: features alive {figures['features_alive']}/{figures['features']}, "
            f"feature mean {figures['feature_mean']:.3f}, "
            f"feature spread {figures['feature_spread']:.3f}, "
            f"logits std {figures['logits_std']:.4f}, value std {figures['value_std']:.3f}"
        )
    return 0


if __name__ == "__main__":
    app.run(main)
