"""IMPALA: the one binary. Reads flags, builds configs, dispatches to a role.

  # Learners under mpirun (learner rank r listens on the r-th of --learner_hosts):
  mpirun -np 2 python experiment.py --job_name=learner --learner_hosts=h1:8001,h2:8001
  # Actor i plays for learner i mod 2:
  python experiment.py --job_name=actor --task=3 --learner_hosts=h1:8001,h2:8001
  # Everything in one process, no transport:
  python experiment.py --job_name=local --level_name=CartPole-v1 --agent_name=MLPAgent
  # Play 10 games with a trained run's latest checkpoint, recording each as an MP4:
  python experiment.py --mode=test --checkpoint=runs/pong --record_video

Hyperparameter flags must be the same for every process of a run; the learner checks that its
actors play the same environment with the same network.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

# TensorFlow's C++ start-up notices (oneDNN, CPU features) are noise for users; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags
from absl import logging as absl_logging

import actor_loop
import learner
import learner_loop
import local_training
import run_folder

FLAGS = flags.FLAGS

flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "test"],
    "train: run the role given by --job_name. test: load a checkpoint (--checkpoint) and play "
    "--test_num_episodes games with it, printing statistics of the real game score.",
)
flags.DEFINE_enum(
    "job_name",
    "local",
    ["learner", "actor", "local"],
    "Role of this process. learner: trains, serving its actors (run under mpirun for "
    "several). actor: plays and streams unrolls to learner task mod L. local: actor and "
    "learner in this one process.",
)
flags.DEFINE_integer("task", 0, "Index of this actor. Learners take their rank from mpirun.")
flags.DEFINE_list("learner_hosts", ["localhost:8001"], "host:port of each learner, in rank order.")
flags.DEFINE_list(
    "actor_hosts",
    [],
    "Host of each actor, in task order (used by launchers; an actor checks its --task is in "
    "range when given).",
)
flags.DEFINE_integer("num_envs_per_actor", 16, "Environments each actor steps together.")
flags.DEFINE_integer(
    "queue_capacity", 0, "Trajectories a learner queues before actors block (0: 4 batches)."
)
flags.DEFINE_string(
    "logdir",
    "runs",
    "Holds the run folders: a run lives in <logdir>/<experiment> (its flags, TensorBoard "
    "events, checkpoints, logs). '' writes nothing, not even checkpoints.",
)
flags.DEFINE_string(
    "experiment",
    "",
    "Name of the run's folder under --logdir (default: <level_name>-<start time>). Starting "
    "again with the folder of an earlier run resumes it from its latest checkpoint.",
)
flags.DEFINE_bool(
    "summary_histograms", False, "Also write histograms of the weights to TensorBoard."
)
flags.DEFINE_float("save_every_secs", 600.0, "Rank 0 writes a checkpoint this often.")
flags.DEFINE_integer("keep_checkpoints", 3, "How many recent checkpoints to keep.")
flags.DEFINE_float(
    "connect_timeout_secs", 600.0, "How long an actor waits for its learner to come up."
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
flags.DEFINE_integer(
    "batch_reuse",
    1,
    "Optimisation steps the learner takes on each batch (more learning per frame, at the cost "
    "of learner compute; V-trace corrects for the policy having moved).",
)
flags.DEFINE_float("discounting", 0.99, "Discount factor.")
flags.DEFINE_float(
    "vtrace_lambda",
    1.0,
    "V-trace's trace decay in [0, 1], like GAE's lambda: lower bootstraps sooner, with less "
    "variance and more bias.",
)
flags.DEFINE_bool(
    "normalize_advantages",
    False,
    "Scale each batch's policy-gradient advantages to mean 0 and standard deviation 1 (as PPO "
    "does), so that the policy term's weight against the baseline and entropy terms does not "
    "depend on the scale of the returns.",
)
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
    "learning_rate", 0.0006, "Learning rate, annealed linearly to 0 over the frame budget."
)
flags.DEFINE_enum(
    "optimizer",
    "rmsprop",
    list(learner.OPTIMIZER_CHOICES),
    "rmsprop: TensorFlow 1's RMSProp (epsilon inside the square root), as in the IMPALA paper. "
    "adam: Adam (epsilon outside the square root).",
)
flags.DEFINE_float("decay", 0.99, "RMSProp decay; Adam's second-moment decay (beta2).")
flags.DEFINE_float("momentum", 0.0, "RMSProp momentum (Adam's beta1 is 0.9).")
flags.DEFINE_float("epsilon", 0.01, "The optimiser's epsilon.")
flags.DEFINE_enum(
    "preset",
    "",
    ["", "paper"],
    "A named set of hyperparameters for the flags not given explicitly. paper: the IMPALA "
    "paper's Atari values (RMSProp, batch 32, one step per batch, lambda 1).",
)
flags.DEFINE_string(
    "checkpoint",
    "",
    "--mode=test: what to load: a run folder (its latest checkpoint), its checkpoints/ folder "
    "or one checkpoint such as runs/pong/checkpoints/ckpt-5000. Default: the run folder "
    "<logdir>/<experiment>.",
)
flags.DEFINE_integer("test_num_episodes", 10, "--mode=test: games to play.")
flags.DEFINE_enum(
    "test_policy",
    "sample",
    ["sample", "greedy"],
    "--mode=test: sample actions from the policy, or take the most likely one.",
)
flags.DEFINE_bool("record_video", False, "--mode=test: write one MP4 per game.")
flags.DEFINE_string(
    "video_dir",
    "",
    "--mode=test --record_video: where the MP4s go (default: <run>/videos/<checkpoint name>).",
)


# The IMPALA paper's Atari hyperparameters (Espeholt et al. 2018, appendix D.3 and the public
# scalable_agent code): today's defaults, kept here so that they stay one flag away whatever the
# defaults become.
PRESETS: dict[str, dict[str, object]] = {
    "paper": {
        "optimizer": "rmsprop",
        "learning_rate": 0.0006,
        "decay": 0.99,
        "momentum": 0.0,
        "epsilon": 0.01,
        "batch_size": 32,
        "unroll_length": 20,
        "batch_reuse": 1,
        "vtrace_lambda": 1.0,
        "normalize_advantages": False,
        "discounting": 0.99,
        "entropy_cost": 0.01,
        "baseline_cost": 0.5,
        "gradients_clipping": 40.0,
        "reward_clipping": "abs_one",
    },
}


def apply_preset() -> None:
    """Gives the flags of `--preset` their preset values, unless given on the command line."""
    for name, value in PRESETS.get(FLAGS.preset, {}).items():
        if not FLAGS[name].present:
            FLAGS[name].value = value


def learner_config_from_flags() -> learner.LearnerConfig:
    return learner.LearnerConfig(
        batch_size=FLAGS.batch_size,
        unroll_length=FLAGS.unroll_length,
        discounting=FLAGS.discounting,
        vtrace_lambda=FLAGS.vtrace_lambda,
        normalize_advantages=FLAGS.normalize_advantages,
        baseline_cost=FLAGS.baseline_cost,
        entropy_cost=FLAGS.entropy_cost,
        reward_clipping=FLAGS.reward_clipping,
        gradients_clipping=FLAGS.gradients_clipping,
        learning_rate=FLAGS.learning_rate,
        optimizer=FLAGS.optimizer,
        decay=FLAGS.decay,
        momentum=FLAGS.momentum,
        epsilon=FLAGS.epsilon,
        total_environment_frames=int(FLAGS.total_environment_frames),
        batch_reuse=FLAGS.batch_reuse,
    )


def local_config_from_flags() -> local_training.LocalConfig:
    return local_training.LocalConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        num_action_repeats=FLAGS.num_action_repeats,
        seed=FLAGS.seed,
        learner=learner_config_from_flags(),
    )


def learner_job_config_from_flags() -> learner_loop.LearnerJobConfig:
    return learner_loop.LearnerJobConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        learner_hosts=tuple(FLAGS.learner_hosts),
        num_action_repeats=FLAGS.num_action_repeats,
        seed=FLAGS.seed,
        learner=learner_config_from_flags(),
        queue_capacity=FLAGS.queue_capacity,
        logdir=FLAGS.logdir,
        experiment=FLAGS.experiment,
        flag_values=flag_values(),
        save_every_secs=FLAGS.save_every_secs,
        keep_checkpoints=FLAGS.keep_checkpoints,
        summary_histograms=FLAGS.summary_histograms,
    )


def flag_values(only_given: bool = False) -> dict:
    """The flags this file defines, with their values: all of them (what a run folder's
    flags.json holds), or only those given on the command line (what launchers forward)."""
    return {
        flag.name: flag.value
        for flag in FLAGS.get_flags_for_module(sys.modules[__name__])
        if flag.present or not only_given
    }


def evaluation_config_from_flags():
    """The `evaluation.EvalConfig` of --mode=test."""
    # Imported here: only --mode=test needs OpenCV and the rendering environments.
    import evaluation

    checkpoint = FLAGS.checkpoint
    if not checkpoint:
        if not (FLAGS.logdir and FLAGS.experiment):
            raise ValueError(
                "--mode=test: give --checkpoint (a run folder or a checkpoint), or --logdir "
                "and --experiment naming the run"
            )
        checkpoint = run_folder.path(FLAGS.logdir, FLAGS.experiment)
    return evaluation.EvalConfig(
        checkpoint=checkpoint,
        num_episodes=FLAGS.test_num_episodes,
        policy=FLAGS.test_policy,
        record_video=FLAGS.record_video,
        video_dir=FLAGS.video_dir,
        seed=FLAGS.seed,
        # Given explicitly, they must match the checkpoint's; otherwise it says what it is.
        level_name=FLAGS.level_name if FLAGS["level_name"].present else None,
        agent_name=FLAGS.agent_name if FLAGS["agent_name"].present else None,
    )


def actor_job_config_from_flags() -> actor_loop.ActorJobConfig:
    if FLAGS.actor_hosts and not 0 <= FLAGS.task < len(FLAGS.actor_hosts):
        raise ValueError(
            f"--task={FLAGS.task}: out of range for {len(FLAGS.actor_hosts)} --actor_hosts"
        )
    learner_config_from_flags()  # validates the shared hyperparameters here too
    return actor_loop.ActorJobConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        task=FLAGS.task,
        learner_hosts=tuple(FLAGS.learner_hosts),
        num_envs=FLAGS.num_envs_per_actor,
        unroll_length=FLAGS.unroll_length,
        num_action_repeats=FLAGS.num_action_repeats,
        seed=FLAGS.seed,
        connect_timeout_secs=FLAGS.connect_timeout_secs,
    )


def run_local() -> None:
    config = local_config_from_flags()
    env, agent = local_training.build(config)
    with env:
        progress = local_training.train(config, env, agent)
    logging.info("done: %s", progress.summary())


def run_learner() -> int:
    # Ctrl-C, SIGTERM and SIGUSR1 ask the learners to finish their step, save a checkpoint and
    # exit. SIGUSR1 is how launchers stop learners under mpirun: mpirun passes it on to every
    # rank, whereas on SIGINT or SIGTERM it kills the ranks a moment later, saved or not.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, _request_learner_stop)
    summary = learner_loop.run(learner_job_config_from_flags())
    return 130 if summary["stopped_early"] else 0


def _request_learner_stop(signum, frame):
    learner_loop.request_stop()


def run_actor() -> None:
    actor_loop.run(actor_job_config_from_flags())


def run_test() -> None:
    import evaluation

    evaluation.run(evaluation_config_from_flags())


ROLES = {"local": run_local, "learner": run_learner, "actor": run_actor}


def _interrupt(signum, frame):
    # SIGTERM (from a launcher, or mpirun passing on a stop) ends a process like Ctrl-C does:
    # through the normal clean-up path.
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    absl_logging.get_absl_handler().setFormatter(
        logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S")
    )
    absl_logging.set_verbosity(absl_logging.INFO)
    # Our reports go through the root logger. TensorFlow logs its own INFO lines (checkpoint
    # sharding times and the like) through absl's logger: those are not for users.
    logging.getLogger("absl").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)
    apply_preset()
    try:
        code = run_test() if FLAGS.mode == "test" else ROLES[FLAGS.job_name]()
    except ValueError as error:
        # Bad flags, names or a mismatch between actor and learner: one line, no traceback.
        logging.debug("configuration error", exc_info=True)
        print(f"experiment.py: error: {error}", file=sys.stderr)
        return 2
    except ConnectionError as error:
        print(f"experiment.py: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        logging.info("%s stopped", FLAGS.job_name)
        return 130
    return code or 0


if __name__ == "__main__":
    app.run(main)
