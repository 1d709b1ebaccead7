"""IMPALA: the one binary. Reads flags, builds configs, dispatches to a role.

python experiment.py                          # single-process training on Pong (the default)
python experiment.py --level_name=CartPole-v1 --agent_name=MLPAgent --total_environment_frames=2e5
"""

from __future__ import annotations

import logging
import os
import sys

# TensorFlow's C++ start-up notices (oneDNN, CPU features) are noise for users; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags
from absl import logging as absl_logging

import learner
import local_training

FLAGS = flags.FLAGS

flags.DEFINE_enum(
    "job_name",
    "local",
    ["local"],
    "Role of this process. local: actor and learner in this one process.",
)
flags.DEFINE_string(
    "level_name",
    "PongNoFrameskip-v4",
    "Gymnasium environment id with a discrete action space; Atari ids get "
    "DeepMind's preprocessing.",
)
flags.DEFINE_string(
    "agent_name",
    "ShallowConvNetAgent",
    "Network: SimpleConvNetAgent, ShallowConvNetAgent, ResNetAgent, "
    "ResNetLSTMAgent or MLPAgent (case-insensitive).",
)
flags.DEFINE_integer("seed", 0, "Seeds environments, action sampling and initial weights.")
flags.DEFINE_integer(
    "num_action_repeats", 1, "Times each action is repeated, on top of the Atari frame skip of 4."
)
flags.DEFINE_float(
    "total_environment_frames",
    200e6,
    "Training budget in emulator frames (agent steps x frame skip x repeats).",
)
flags.DEFINE_integer("batch_size", 32, "Trajectories per learner batch.")
flags.DEFINE_integer("unroll_length", 20, "Agent steps per trajectory.")
flags.DEFINE_float("discounting", 0.99, "Discount factor.")
flags.DEFINE_float("entropy_cost", 0.01, "Weight of the entropy bonus.")
flags.DEFINE_float("baseline_cost", 0.5, "Weight of the baseline loss.")
flags.DEFINE_enum(
    "reward_clipping",
    "abs_one",
    list(learner.REWARD_CLIPPING_CHOICES),
    "How rewards are clipped in the loss.",
)
flags.DEFINE_float(
    "gradients_clipping", 40.0, "Clip gradients to this global norm; negative turns clipping off."
)
flags.DEFINE_float(
    "learning_rate", 0.0006, "RMSProp learning rate, annealed linearly to 0 over the frame budget."
)
flags.DEFINE_float("decay", 0.99, "RMSProp decay.")
flags.DEFINE_float("momentum", 0.0, "RMSProp momentum.")
flags.DEFINE_float("epsilon", 0.01, "RMSProp epsilon.")


def learner_config_from_flags() -> learner.LearnerConfig:
    return learner.LearnerConfig(
        batch_size=FLAGS.batch_size,
        unroll_length=FLAGS.unroll_length,
        discounting=FLAGS.discounting,
        baseline_cost=FLAGS.baseline_cost,
        entropy_cost=FLAGS.entropy_cost,
        reward_clipping=FLAGS.reward_clipping,
        gradients_clipping=FLAGS.gradients_clipping,
        learning_rate=FLAGS.learning_rate,
        decay=FLAGS.decay,
        momentum=FLAGS.momentum,
        epsilon=FLAGS.epsilon,
        total_environment_frames=int(FLAGS.total_environment_frames),
    )


def local_config_from_flags() -> local_training.LocalConfig:
    return local_training.LocalConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        num_action_repeats=FLAGS.num_action_repeats,
        seed=FLAGS.seed,
        learner=learner_config_from_flags(),
    )


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    absl_logging.get_absl_handler().setFormatter(
        logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    )
    absl_logging.set_verbosity(absl_logging.INFO)
    try:
        config = local_config_from_flags()
        env, agent = local_training.build(config)
    except ValueError as error:
        # Configuration errors name the flag and value: one line, no traceback.
        print(f"experiment.py: error: {error}", file=sys.stderr)
        return 2
    try:
        with env:
            progress = local_training.train(config, env, agent)
    except KeyboardInterrupt:
        logging.info("interrupted")
        return 130
    logging.info("done: %s", progress.summary())
    return 0


if __name__ == "__main__":
    app.run(main)
