"""Train on this machine through the real distributed path: learners under mpirun, actor processes.

  python run_local.py                                  # 1 learner, 2 actors, Pong (make train)
  python run_local.py --num_learners=2 --num_actors=4 --level_name=BreakoutNoFrameskip-v4
  python run_local.py --experiment=PongNoFrameskip-v4-20261122-101500   # resume that run

Every experiment.py flag given here is passed to every process. The run lives in
<logdir>/<experiment> (see `impala/run_folder.py`); starting again on an existing run folder
resumes it with the flags it was started with, except those given again here. The learners'
progress shows in the terminal; each process also logs to the run folder. Ctrl-C stops every
process of the run.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Mapping

from absl import app, flags

from impala import flags as impala_flags
from impala import run_folder, run_secret, run_tls
from impala.launch import planning
from impala.launch.ports import free_ports
from impala.launch.supervisor import ROOT, Supervised, stop, supervise

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_learners", 1, "Learner processes (under mpirun when more than one).")
flags.DEFINE_integer("num_actors", 2, "Actor processes.")
flags.DEFINE_float("stop_timeout_secs", 15.0, "How long processes get to exit before SIGKILL.")
flags.DEFINE_integer(
    "max_actor_restarts",
    100,
    "Restarts of each actor that dies (killed, crashed) before it is left dead; they come after "
    "1, 2, 4 ... s, up to --restart_max_delay_secs, and the delay starts again at 1 s after 5 "
    "minutes of running.",
)
flags.DEFINE_float(
    "restart_max_delay_secs",
    30.0,
    "The longest wait before restarting a process that died (the waits double up to it).",
)
flags.DEFINE_integer(
    "max_learner_restarts",
    3,
    "Restarts of the learners, from the run's latest checkpoint, when one of them dies; the "
    "actors reconnect to them by themselves.",
)


def plan(
    num_learners: int, num_actors: int, flags_to_forward: list[str], python: str, as_root: bool
) -> tuple[list[str], list[list[str]]]:
    """The learner command (mpirun when several) and each actor's command, on localhost."""
    learner_hosts = [f"localhost:{port}" for port in free_ports(num_learners)]
    actor_hosts = ["localhost"] * num_actors
    script = os.path.join(ROOT, "experiment.py")
    learner = planning.learner_command(python, script, learner_hosts, actor_hosts, flags_to_forward)
    if num_learners > 1:
        learner = planning.mpirun_command(["localhost"] * num_learners, learner, as_root)
    actors = [
        planning.actor_command(python, script, task, learner_hosts, actor_hosts, flags_to_forward)
        for task in range(num_actors)
    ]
    return learner, actors


# What a run trained with before a flag existed, for the flags whose default has changed since:
# the cooldown (2026-11-29; the default is a 15% cooldown since 2026-12-04).
_BEFORE_THE_FLAG = {"learning_rate_cooldown_fraction": 0.0}


def run_flags(run_dir: str) -> tuple[dict[str, object], int, int, str]:
    """The experiment.py flags for every process, the numbers of learners and actors, and a line
    saying how a resumed run resumes ("" for a new run).

    Those given here; when `run_dir` is an earlier run's folder, the rest as that run was
    started with (its flags.json, whose learner and actor lists give the numbers).

    Raises:
      ValueError: one line, for a saved value the processes could not take.
    """
    given = impala_flags.flag_values(only_given=True)
    num_learners, num_actors = FLAGS.num_learners, FLAGS.num_actors
    saved = run_folder.read_flags(run_dir)
    if saved is None:
        return given, num_learners, num_actors, ""
    if "preset" in given and given["preset"] != saved.get("preset", ""):
        # The saved values of the old preset would be forwarded as given and beat the new one.
        raise ValueError(
            f"--preset={given['preset']}: {run_dir} was started with "
            f"--preset={saved.get('preset', '')}; resume it without --preset (its flags are "
            f"kept), or start a new run"
        )
    path = os.path.join(run_dir, run_folder.FLAGS_FILE)
    for name in ("learner_hosts", "actor_hosts"):
        hosts = saved.get(name, [])
        if not (isinstance(hosts, list) and all(isinstance(host, str) for host in hosts)):
            raise ValueError(f"{path}: {name}={hosts!r}: expected a list of hosts")
    if not FLAGS["num_learners"].present:
        num_learners = len(saved.get("learner_hosts") or [None])
    if not FLAGS["num_actors"].present:
        num_actors = len(saved.get("actor_hosts") or [None] * num_actors)
    # Parsed as the processes will parse them when forwarded: the file may have been edited.
    parsed = {}
    own = impala_flags.flag_values()
    for name, value in saved.items():
        if name in own and name not in run_folder.PER_PROCESS_FLAGS:
            try:
                parsed[name] = impala_flags.parse_saved(name, value)
            except ValueError as error:
                raise ValueError(f"{path}: {error}") from None
    # A flag added after the run was started is not in its file: it trained with the value that
    # turned the flag's feature off, which the flag's default since is not.
    for name, value in _BEFORE_THE_FLAG.items():
        parsed.setdefault(name, value)
    preset = given.get("preset", parsed.get("preset", ""))
    # Every value the processes would not get by themselves: a saved value equal to the
    # default still beats the preset's.
    kept = {
        name: value
        for name, value in parsed.items()
        if name not in given and value != impala_flags.unset_value(name, preset)
    }
    note = (
        f"[run_local] resuming {run_dir} as it was started: {num_learners} learner(s), "
        f"{num_actors} actor(s)"
        + (f", {planning.shell_line(planning.forwarded_flags(kept))}" if kept else "")
    )
    return {**kept, **given}, num_learners, num_actors, note


MAX_PROCESSES = 1024
MAX_RESTART_DELAY_SECS = 86_400


def check_launcher_flags(num_learners: int, num_actors: int) -> None:
    """Raises a one-line error for a flag of run_local.py itself out of range (the numbers of
    learners and actors as `run_flags` gives them)."""
    for name, value in (("num_learners", num_learners), ("num_actors", num_actors)):
        if value < 1:
            raise ValueError(f"--{name}={value}: must be at least 1")
        if value > MAX_PROCESSES:
            raise ValueError(
                f"--{name}={value}: must be at most {MAX_PROCESSES} (all run on this machine)"
            )
    for name in ("max_actor_restarts", "max_learner_restarts"):
        if FLAGS[name].value < 0:
            raise ValueError(f"--{name}={FLAGS[name].value}: must be >= 0")
    if not 0 <= FLAGS.restart_max_delay_secs <= MAX_RESTART_DELAY_SECS:  # NaN too
        # The same ceiling as run_experiment_mm_raw.py's: inf would wait forever.
        raise ValueError(
            f"--restart_max_delay_secs={FLAGS.restart_max_delay_secs}: must be in "
            f"0-{MAX_RESTART_DELAY_SECS} (a day)"
        )
    if not 0 < FLAGS.stop_timeout_secs < math.inf:
        # NaN, 0 or less would SIGKILL the learners before they save.
        raise ValueError(
            f"--stop_timeout_secs={FLAGS.stop_timeout_secs}: must be a finite number > 0"
        )


def make_run_files(run_dir: str, given: Mapping[str, object]) -> None:
    """The run secret in `run_dir`, and with --transport_tls among the flags `given` the run's
    TLS bundle beside it: made before any process starts (and kept when there), so that every
    process reads them from the run folder.

    Raises:
      SecretError, TlsError: a file there that cannot be used, or cannot be written.
    """
    run_secret.ensure(run_secret.path_in(run_dir))
    if given.get("transport_tls"):
        run_tls.ensure(run_tls.path_in(run_dir))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _already_stopping(signum, frame):
    print("[run_local] already stopping: the learners are saving", flush=True)


# Ctrl-C, SIGTERM and SIGHUP all stop the run.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.logdir:
        print("run_local.py: error: --logdir is empty: the run needs a folder", file=sys.stderr)
        return 2
    try:
        experiment_name, run_dir, given, num_learners, num_actors = _checked_run()
    except ValueError as error:
        print(f"run_local.py: error: {error}", file=sys.stderr)
        return 2
    if FLAGS.private_run_files:
        # The run folder and the logs, and everything the processes started here write.
        run_folder.keep_private()
    os.makedirs(run_dir, exist_ok=True)
    try:
        make_run_files(run_dir, given)
    except (run_secret.SecretError, run_tls.TlsError) as error:
        print(f"run_local.py: error: {error}", file=sys.stderr)
        return 2
    try:
        learner_argv, actor_argvs = plan(
            num_learners,
            num_actors,
            [
                *planning.forwarded_flags(given),
                f"--logdir={os.path.abspath(FLAGS.logdir)}",
                f"--experiment={experiment_name}",
            ],
            sys.executable,
            as_root=os.geteuid() == 0,
        )
    except OSError as error:
        print(f"run_local.py: error: no free port for the learners: {error}", file=sys.stderr)
        return 1
    print(f"[run_local] {num_learners} learner(s), {num_actors} actor(s); logs in {run_dir}/")
    return _run(run_dir, learner_argv, actor_argvs)


def _checked_run() -> tuple[str, str, dict[str, object], int, int]:
    """The run's name and folder, the flags of its processes and the numbers of learners and
    actors, checked as every process will check them, before any starts; prints how a resumed
    run resumes.

    Raises:
      ValueError: one line, for a flag or a saved value that the run cannot take.
    """
    run_folder.check_name(FLAGS.experiment)
    experiment_name = FLAGS.experiment or run_folder.default_name(FLAGS.level_name)
    run_dir = run_folder.path(FLAGS.logdir, experiment_name)
    given, num_learners, num_actors, resuming = run_flags(run_dir)
    check_launcher_flags(num_learners, num_actors)
    planning.check_hyperparameters(given)  # as every process will, before any starts
    if resuming:
        print(resuming)
    return experiment_name, run_dir, given, num_learners, num_actors


def _run(run_dir: str, learner_argv: list[str], actor_argvs: list[list[str]]) -> int:
    """Starts the learners and actors and supervises them until the learners finish or the run
    is stopped; returns the launcher's exit code."""
    # SIGINT explicitly too: a shell starts background jobs with it ignored, and that would make
    # Ctrl-C's signal do nothing.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _raise_interrupt)
    learners, actors = _roles(run_dir, learner_argv, actor_argvs)
    for role in (learners, *actors):
        role.start()
    try:
        return supervise(learners, actors, FLAGS.stop_timeout_secs)
    except KeyboardInterrupt:
        # A second Ctrl-C or SIGTERM (a scheduler signalling every process, an impatient user)
        # must not cut the stop short: the learners are saving.
        for signum in _STOP_SIGNALS:
            signal.signal(signum, _already_stopping)
        print("\n[run_local] stopping every process of the run...")
        stop([r.process for r in (learners, *actors) if r.process], FLAGS.stop_timeout_secs)
        print("[run_local] stopped")
        return 130


def _roles(
    run_dir: str, learner_argv: list[str], actor_argvs: list[list[str]]
) -> tuple[Supervised, list[Supervised]]:
    """The learners and each actor, as roles restarted within the flags' caps."""
    learners = Supervised(
        "learners",
        learner_argv,
        os.path.join(run_dir, "learners.log"),
        FLAGS.max_learner_restarts,
        FLAGS.restart_max_delay_secs,
        learners=True,
    )
    actors = [
        Supervised(
            f"actor {task}",
            argv,
            os.path.join(run_dir, f"actor_{task}.log"),
            FLAGS.max_actor_restarts,
            FLAGS.restart_max_delay_secs,
        )
        for task, argv in enumerate(actor_argvs)
    ]
    return learners, actors
