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

import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Iterable

# TensorFlow's C++ start-up notices (oneDNN, CPU features) are noise for users; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN's kernels for the convolutions: TensorFlow leaves them off on some CPUs (an AVX2 one
# without AVX-512, for instance), where they make the learner's train step ~1.45 times as fast.
# Every process of a run, the benchmarks' stages and the tests compute with them.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from absl import app
from absl import logging as absl_logging

from impala import configs, run_folder, tensorflow_import
from impala.flags import FLAGS, PRESETS, apply_preset, config_from_flags, flag_values
from impala.learner import world

# Each role imports its own stack when it runs: an actor or --mode=test never loads Horovod.
__all__ = ["FLAGS", "PRESETS", "apply_preset", "flag_values", "main"]

# The game settings --mode=test compares with the checkpoint's when they are given.
_CHECKED_BY_TEST = ("level_name", "frame_skip", "frame_pooling")
# What a launcher sets for each process itself (its address, task and run secret), in place of
# the flags' when it checks the run's flags before starting anything.
_PLACEMENT = {"learner_hosts": ("localhost:1",), "experiment": "run", "secret_file": "secret"}


def learner_config_from_flags() -> configs.LearnerConfig:
    return config_from_flags(configs.LearnerConfig)


def pbt_config_from_flags(given: Iterable[str] | None = None) -> configs.PbtConfig:
    """The `PbtConfig` of the flags; a PBT flag among those `given` (default: the command
    line's) without --with_pbt is a one-line error."""
    pbt = config_from_flags(configs.PbtConfig)
    given = flag_values(only_given=True) if given is None else given
    configs.pbt.check_given(given, pbt.with_pbt)
    return pbt


# Policy k of a run of several plays and starts from seed --seed + k x this: no two policies
# share initial weights or game streams, and runs of one policy keep theirs.
POLICY_SEED_STRIDE = 1_000_003


def game_config_from_flags() -> configs.GameConfig:
    game = config_from_flags(configs.GameConfig)  # checks --seed as given
    if FLAGS.policy > 0:
        game = dataclasses.replace(game, seed=game.seed + FLAGS.policy * POLICY_SEED_STRIDE)
    return game


def check_run_flags(given: Iterable[str] | None = None) -> None:
    """Raises the one-line error a process of the run would give for its flags, for every check
    that needs no ML stack: the hyperparameters, the game settings, then the job-level flags of
    learners and actors (the roles launchers start; --mode=test checks its own). Launchers run
    it before starting anything, with the names of the flags they forward as `given`. Which
    --level_name and --agent_name exist is left to the processes: only Gymnasium and the
    networks know."""
    learner = learner_config_from_flags()
    game = game_config_from_flags()
    config_from_flags(
        configs.LearnerJobConfig,
        game=game,
        learner=learner,
        pbt=pbt_config_from_flags(given),
        policy_hosts=("localhost:1",) * FLAGS.num_policies,
        **_PLACEMENT,
    )
    config_from_flags(
        configs.ActorJobConfig,
        game=game,
        unroll_length=learner.unroll_length,
        task=0,
        learner_hosts=_PLACEMENT["learner_hosts"],
        secret_file=_PLACEMENT["secret_file"],
    )


def local_config_from_flags() -> configs.LocalConfig:
    """The `LocalConfig` of --job_name=local."""
    return config_from_flags(
        configs.LocalConfig, game=game_config_from_flags(), learner=learner_config_from_flags()
    )


def learner_job_config_from_flags() -> configs.LearnerJobConfig:
    """The `LearnerJobConfig` of --job_name=learner."""
    return config_from_flags(
        configs.LearnerJobConfig,
        game=game_config_from_flags(),
        learner=learner_config_from_flags(),
        pbt=pbt_config_from_flags(),
        flag_values=flag_values(),
    )


def evaluation_config_from_flags() -> configs.EvalConfig:
    """The `EvalConfig` of --mode=test."""
    checkpoint = FLAGS.checkpoint
    if not checkpoint:
        if not (FLAGS.logdir and FLAGS.experiment):
            raise ValueError(
                "--mode=test: give --checkpoint (a run folder or a checkpoint), or --logdir "
                "and --experiment naming the run"
            )
        checkpoint = run_folder.path(FLAGS.logdir, FLAGS.experiment)
    checkpoint = policy_checkpoint(checkpoint, FLAGS.policy if FLAGS["policy"].present else None)
    return config_from_flags(
        configs.EvalConfig,
        checkpoint=checkpoint,
        game=game_config_from_flags(),
        # Given explicitly, they must match the checkpoint's; otherwise it says what it is.
        given=tuple(name for name in _CHECKED_BY_TEST if FLAGS[name].present),
        agent_name=FLAGS.agent_name if FLAGS["agent_name"].present else None,
    )


def policy_checkpoint(checkpoint: str, policy: int | None) -> str:
    """What --mode=test loads for `checkpoint` and --policy (None: not given): in the folder of
    a run of several policies, that policy's folder.

    Raises:
      ValueError: one line, for --policy with anything but such a run folder, a policy it does
        not hold, or such a run folder without --policy.
    """
    policies = run_folder.policies_in(checkpoint) if os.path.isdir(checkpoint) else []
    if policy is None:
        if policies and not os.path.isdir(os.path.join(checkpoint, run_folder.CHECKPOINTS)):
            raise ValueError(
                f"--checkpoint={checkpoint}: a run of {len(policies)} policies; give --policy "
                f"(one of {', '.join(map(str, policies))})"
            )
        return checkpoint
    if not policies:
        raise ValueError(
            f"--policy={policy}: {checkpoint} is not the folder of a run of several policies"
        )
    if policy not in policies:
        raise ValueError(
            f"--policy={policy}: {checkpoint} holds policies {', '.join(map(str, policies))}"
        )
    return run_folder.policy_path(checkpoint, policy)


def actor_job_config_from_flags() -> configs.ActorJobConfig:
    """The `ActorJobConfig` of --job_name=actor."""
    if FLAGS.actor_hosts and not 0 <= FLAGS.task < len(FLAGS.actor_hosts):
        raise ValueError(
            f"--task={FLAGS.task}: out of range for {len(FLAGS.actor_hosts)} --actor_hosts"
        )
    learner = learner_config_from_flags()  # validates the shared hyperparameters here too
    return config_from_flags(
        configs.ActorJobConfig,
        game=game_config_from_flags(),
        unroll_length=learner.unroll_length,
        secret_file=actor_secret_file(),
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
    # Ctrl-C, SIGTERM and SIGUSR1 ask training learners to finish their step, save a checkpoint and
    # exit. SIGUSR1 is how launchers stop learners under mpirun: mpirun passes it on to every
    # rank, whereas on SIGINT or SIGTERM it kills the ranks a moment later, saved or not.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, _request_learner_stop)
    from impala.learner import loop

    summary = loop.run(learner_job_config_from_flags())
    return 130 if summary["stopped_early"] else 0


def _request_learner_stop(signum, frame):
    # Still starting (the loop not yet imported, or not yet waiting for batches): nothing has
    # been trained since the checkpoint, so it stops at once rather than after its start-up,
    # a minute on a busy machine (a launcher killed outright, Ctrl-C while TensorFlow loads).
    loop = sys.modules.get("impala.learner.loop")
    training = getattr(loop, "training", None)
    if training is None or not training.is_set():
        _interrupt(signum, frame)
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
    # through the normal clean-up path. Once: a second signal while it stops (a launcher's
    # SIGTERM after the terminal's Ctrl-C, a scheduler signalling every process) would cut the
    # clean-up short with a second traceback. A stop that hangs is for the launcher's SIGKILL.
    for stop_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(stop_signal, signal.SIG_IGN)
    raise KeyboardInterrupt


def _leave_out_keras() -> None:
    # Every process but a learner of several, whose Horovod module needs Keras: see
    # impala/tensorflow_import.py. (No role starts processes of its own.)
    learner = FLAGS.mode == "train" and FLAGS.job_name == "learner"
    if not (learner and world.joins_others(len(FLAGS.learner_hosts))):
        tensorflow_import.leave_out_keras()


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
    # Ctrl-C too: Python's own handler would raise again at a second signal.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, _interrupt)
    if FLAGS.private_run_files:
        # Before anything is written: checkpoints, events, summaries, videos.
        run_folder.keep_private()
    apply_preset(single_process=FLAGS.mode == "train" and FLAGS.job_name == "local")
    _leave_out_keras()
    tensorflow_import.standard_distutils()
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
