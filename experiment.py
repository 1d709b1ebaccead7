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
import math
import os
import signal
import sys

# TensorFlow's C++ start-up notices (oneDNN, CPU features) are noise for users; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN's kernels for the convolutions: TensorFlow leaves them off on some CPUs (an AVX2 one
# without AVX-512, for instance), where they make the learner's train step ~1.45 times as fast.
# Every process of a run, the benchmarks' stages and the tests compute with them.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from absl import app
from absl import logging as absl_logging

from impala import configs, run_folder
from impala.flags import FLAGS, PRESETS, apply_preset, flag_values

# Each role imports its own stack when it runs: an actor or --mode=test never loads Horovod.
__all__ = ["FLAGS", "PRESETS", "apply_preset", "flag_values", "main"]


def frames_flag(name: str) -> int:
    """A frame-count flag (a float, so that 10e6 is accepted) as a whole number of frames."""
    value = FLAGS[name].value
    if not math.isfinite(value) or value != math.floor(value):
        raise ValueError(f"--{name}={value}: must be a finite, whole number of frames")
    return int(value)


def learner_config_from_flags() -> configs.LearnerConfig:
    return configs.LearnerConfig(
        batch_size=FLAGS.batch_size,
        unroll_length=FLAGS.unroll_length,
        discounting=FLAGS.discounting,
        vtrace_lambda=FLAGS.vtrace_lambda,
        normalize_advantages=FLAGS.normalize_advantages,
        policy_clip=FLAGS.policy_clip,
        policy_clip_center=FLAGS.policy_clip_center,
        baseline_cost=FLAGS.baseline_cost,
        entropy_cost=FLAGS.entropy_cost,
        entropy_cost_anneal_frames=frames_flag("entropy_cost_anneal_frames"),
        entropy_cost_final=FLAGS.entropy_cost_final,
        reward_clipping=FLAGS.reward_clipping,
        gradients_clipping=FLAGS.gradients_clipping,
        learning_rate=FLAGS.learning_rate,
        optimizer=FLAGS.optimizer,
        decay=FLAGS.decay,
        momentum=FLAGS.momentum,
        epsilon=FLAGS.epsilon,
        total_environment_frames=frames_flag("total_environment_frames"),
        learning_rate_anneal_frames=frames_flag("learning_rate_anneal_frames"),
        learning_rate_cooldown_frames=frames_flag("learning_rate_cooldown_frames"),
        learning_rate_cooldown_fraction=FLAGS.learning_rate_cooldown_fraction,
        batch_reuse=FLAGS.batch_reuse,
    )


def check_run_flags() -> None:
    """Raises the one-line error a process of the run would give for its flags, for every check
    that needs no ML stack: the hyperparameters, then the job-level flags of learners and actors
    (the roles launchers start; --mode=test checks its own). Launchers run
    it before starting anything. --level_name and --agent_name are left to the processes: only
    Gymnasium and the networks know which names exist."""
    learner = learner_config_from_flags()
    configs.check_playing_flags(
        FLAGS.num_action_repeats,
        FLAGS.seed,
        FLAGS.repeat_action_probability,
        FLAGS.frame_skip,
        FLAGS.frame_pooling,
    )
    configs.check_learner_job_flags(
        FLAGS.queue_capacity,
        learner.batch_size,
        FLAGS.keep_checkpoints,
        FLAGS.save_every_secs,
        FLAGS.keep_checkpoint_every_frames,
    )
    configs.check_actor_job_flags(
        FLAGS.num_envs_per_actor, FLAGS.connect_timeout_secs, FLAGS.actor_threads
    )


def local_config_from_flags():
    """The `single_process.LocalConfig` of --job_name=local."""
    from impala import single_process

    return single_process.LocalConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        num_action_repeats=FLAGS.num_action_repeats,
        repeat_action_probability=FLAGS.repeat_action_probability,
        frame_skip=FLAGS.frame_skip,
        frame_pooling=FLAGS.frame_pooling,
        seed=FLAGS.seed,
        learner=learner_config_from_flags(),
    )


def learner_job_config_from_flags():
    """The `learner.loop.LearnerJobConfig` of --job_name=learner."""
    from impala.learner import loop

    return loop.LearnerJobConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        learner_hosts=tuple(FLAGS.learner_hosts),
        num_action_repeats=FLAGS.num_action_repeats,
        repeat_action_probability=FLAGS.repeat_action_probability,
        frame_skip=FLAGS.frame_skip,
        frame_pooling=FLAGS.frame_pooling,
        seed=FLAGS.seed,
        learner=learner_config_from_flags(),
        queue_capacity=FLAGS.queue_capacity,
        logdir=FLAGS.logdir,
        experiment=FLAGS.experiment,
        secret_file=FLAGS.secret_file,
        transport_tls=FLAGS.transport_tls,
        private_files=FLAGS.private_run_files,
        flag_values=flag_values(),
        save_every_secs=FLAGS.save_every_secs,
        keep_checkpoints=FLAGS.keep_checkpoints,
        keep_checkpoint_every_frames=FLAGS.keep_checkpoint_every_frames,
        summary_histograms=FLAGS.summary_histograms,
    )


def evaluation_config_from_flags():
    """The `evaluation.EvalConfig` of --mode=test."""
    # Imported here: only --mode=test needs OpenCV and the rendering environments.
    from impala import evaluation

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
        frame_skip=FLAGS.frame_skip,
        frame_pooling=FLAGS.frame_pooling if FLAGS["frame_pooling"].present else None,
    )


def actor_job_config_from_flags():
    """The `actor.loop.ActorJobConfig` of --job_name=actor."""
    from impala.actor import loop

    if FLAGS.actor_hosts and not 0 <= FLAGS.task < len(FLAGS.actor_hosts):
        raise ValueError(
            f"--task={FLAGS.task}: out of range for {len(FLAGS.actor_hosts)} --actor_hosts"
        )
    learner_config_from_flags()  # validates the shared hyperparameters here too
    return loop.ActorJobConfig(
        level_name=FLAGS.level_name,
        agent_name=FLAGS.agent_name,
        task=FLAGS.task,
        learner_hosts=tuple(FLAGS.learner_hosts),
        num_envs=FLAGS.num_envs_per_actor,
        threads=FLAGS.actor_threads,
        unroll_length=FLAGS.unroll_length,
        num_action_repeats=FLAGS.num_action_repeats,
        repeat_action_probability=FLAGS.repeat_action_probability,
        frame_skip=FLAGS.frame_skip,
        frame_pooling=FLAGS.frame_pooling,
        seed=FLAGS.seed,
        connect_timeout_secs=FLAGS.connect_timeout_secs,
        secret_file=actor_secret_file(),
        transport_tls=FLAGS.transport_tls,
    )


def actor_secret_file() -> str:
    """--secret_file, or the run folder's secret when --logdir and --experiment name the run."""
    if FLAGS.secret_file or not (FLAGS.logdir and FLAGS.experiment):
        return FLAGS.secret_file
    from impala import run_secret

    return run_secret.path_in(run_folder.path(FLAGS.logdir, FLAGS.experiment))


def run_single_process() -> None:
    from impala import single_process

    config = local_config_from_flags()
    env, agent = single_process.build(config)
    with env:
        progress = single_process.train(config, env, agent)
    logging.info("done: %s", progress.summary())


def run_learner() -> int:
    # Ctrl-C, SIGTERM and SIGUSR1 ask the learners to finish their step, save a checkpoint and
    # exit. SIGUSR1 is how launchers stop learners under mpirun: mpirun passes it on to every
    # rank, whereas on SIGINT or SIGTERM it kills the ranks a moment later, saved or not.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, _request_learner_stop)
    from impala.learner import loop

    summary = loop.run(learner_job_config_from_flags())
    return 130 if summary["stopped_early"] else 0


def _request_learner_stop(signum, frame):
    from impala.learner import loop

    loop.request_stop()


def run_actor() -> None:
    from impala.actor import loop

    loop.run(actor_job_config_from_flags())


def run_test() -> None:
    from impala import evaluation

    evaluation.run(evaluation_config_from_flags())


ROLES = {"local": run_single_process, "learner": run_learner, "actor": run_actor}


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
    if FLAGS.private_run_files:
        # Before anything is written: checkpoints, events, summaries, videos.
        run_folder.keep_private()
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
