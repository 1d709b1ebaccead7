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
A checkpoint is probed with its own network, on frames of its own game, frame skip and frame
pooling; `init` with --agent_name, on frames of --level_name with --frame_skip and
--frame_pooling.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from absl import app, flags

from benchmarks import checkpoint_tools
from impala import configs, envs

if TYPE_CHECKING:
    import networks

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a script: the tests import this module beside experiment.py,
    # whose --level_name, --agent_name, --seed ... are other flags.
    init = Init()
    flags.DEFINE_string("level_name", init.level_name, "`init`: the game whose frames are shown.")
    flags.DEFINE_string("agent_name", init.agent_name, "`init`: the network.")
    flags.DEFINE_integer(
        "num_envs", init.num_envs, "Games played with random actions.", lower_bound=1
    )
    flags.DEFINE_integer("seed", init.seed, "Seeds the games, their actions and an `init` network.")
    flags.DEFINE_integer(
        "frame_skip",
        init.frame_skip,
        "`init`, Atari: the frame skip of the frames shown (a run's --frame_skip); 0: the default, "
        "4.",
        lower_bound=0,
    )
    flags.DEFINE_enum(
        "frame_pooling",
        init.frame_pooling,
        list(configs.FRAME_POOLING_CHOICES),
        "`init`, Atari: the frame each step shows (a run's --frame_pooling): max, the maximum of "
        "its last two frames; last, its last frame.",
    )


@dataclasses.dataclass(frozen=True)
class Init:
    """What `init` probes, the command's flags: a fresh `agent_name` network (seeded `seed`) on
    frames of `num_envs` games of `level_name` with that frame skip and pooling. `num_envs` and
    `seed` also set the games a checkpoint is shown."""

    level_name: str = "PongNoFrameskip-v4"
    agent_name: str = configs.DEFAULT_AGENT_NAME
    num_envs: int = 8
    seed: int = 7
    frame_skip: int = 0
    frame_pooling: str = "max"


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
    import tensorflow as tf

    import networks

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
    init = Init(
        FLAGS.level_name,
        FLAGS.agent_name,
        FLAGS.num_envs,
        FLAGS.seed,
        FLAGS.frame_skip,
        FLAGS.frame_pooling,
    )
    return probe_all(argv[1:], init)


def probe_all(paths: list[str], init: Init) -> int:
    """Prints each path's figures (a checkpoint, or `init`); stops at the first that cannot be
    probed with a one-line error. Returns the command's exit status: 0, 1 for a bad checkpoint,
    2 for a bad flag for `init`."""
    shown: dict[tuple, tuple[np.ndarray, int]] = {}  # the frames of each game and frame skip
    for path in paths:
        try:
            name, config, agent = _network(path, init)
            # (A frame skip of 0 is the default 4: one key for both.)
            game = (
                config.level_name,
                config.num_action_repeats,
                config.atari_frames_per_step,
                config.frame_pooling,
            )
            if game not in shown:
                shown[game] = frames(config)
            observations, num_actions = shown[game]
            # TensorFlow loads here, once the games have checked the flags for `init`.
            import tensorflow as tf

            import networks
            from impala import build

            if agent is None:
                tf.random.set_seed(init.seed)
                agent = build.agent_for(
                    init.agent_name, num_actions, observations.shape[1:], observations.dtype
                )
            if not isinstance(agent, networks.FeedForwardAgent):
                raise ValueError(f"{path}: {type(agent).__name__}: only feed-forward agents")
        except ValueError as error:
            # A bad checkpoint is the argument's error (1); a bad flag for `init` a usage one (2).
            message = str(error).removeprefix("--checkpoint=")
            print(f"probe_network.py: error: {message}", file=sys.stderr)
            return 1 if path != "init" else 2
        figures = probe(agent, observations)
        print(
            f"{name} ({config.level_name}): {type(agent).__name__}, features alive "
            f"{figures['features_alive']}/{figures['features']}, "
            f"feature mean {figures['feature_mean']:.3f}, "
            f"feature spread {figures['feature_spread']:.3f}, "
            f"logits std {figures['logits_std']:.4f}, value std {figures['value_std']:.3f}"
        )
    return 0


def _network(path: str, init: Init) -> tuple[str, envs.EnvConfig, networks.Agent | None]:
    """The checkpoint `path` names, the games to show it and its restored network; for `init`,
    the flags' games and no network yet (built once the games tell the action count and the
    observation shape)."""
    if path == "init":
        config = envs.EnvConfig(
            init.level_name,
            num_envs=init.num_envs,
            seed=init.seed,
            frame_skip=init.frame_skip,
            frame_pooling=init.frame_pooling,
        )
        return path, config, None
    from impala.evaluation import restore

    checkpoint, identity, agent = checkpoint_tools.restore_checkpoint(path)
    return checkpoint, restore.environment_config(identity, init.num_envs, init.seed), agent


if __name__ == "__main__":
    _define_flags()
    app.run(main)
