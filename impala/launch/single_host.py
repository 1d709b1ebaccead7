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

import contextlib
import ctypes
import dataclasses
import errno
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from absl import app, flags

from impala import flags as impala_flags
from impala import run_folder, run_secret, run_tls
from impala.launch import planning

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

# The repository root: experiment.py and the runs/ folder users know are relative to it.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PR_SET_PDEATHSIG = 1
# Looked up once here: a child between fork and exec must not dlopen (another thread of the
# launcher may hold the loader's lock at the fork, and the child would wait for it forever).
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclasses.dataclass
class _Process:
    name: str
    popen: subprocess.Popen
    log_path: str
    learners: bool = False  # the learner (or the mpirun of several), stopped with SIGUSR1
    reported: bool = False


_FIRST_DELAY_SECS = 1.0
_HEALTHY_SECS = 300.0  # running this long resets the delay before the next restart


@dataclasses.dataclass
class _Supervised:
    """A role that is started again when it dies: its command, process and restart record."""

    name: str
    argv: list[str]
    log_path: str
    max_restarts: int
    max_delay: float = 30.0
    learners: bool = False
    process: _Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    delay: float = _FIRST_DELAY_SECS
    due: float | None = None  # when it starts again
    given_up: bool = False

    def start(self) -> None:
        self.process = _start(self.name, self.argv, self.log_path, learners=self.learners)
        self.started_at = time.monotonic()
        self.due = None
        if self.learners:
            threading.Thread(target=_copy_output, args=(self.process,), daemon=True).start()

    def exit_code(self) -> int | None:
        return self.process.popen.poll() if self.process else None

    def schedule_restart(self, code: int) -> bool:
        """Decides whether to start it again after it exited with `code`, and when. Returns
        whether it will be."""
        if code in run_folder.FINAL_EXIT_CODES or self.restarts >= self.max_restarts:
            self.given_up = True
            return False
        if time.monotonic() - self.started_at >= _HEALTHY_SECS:
            self.delay = _FIRST_DELAY_SECS
        self.delay = min(self.delay, self.max_delay)
        self.due = time.monotonic() + self.delay
        self.restarts += 1
        return True

    def restart_if_due(self) -> bool:
        if self.due is None or time.monotonic() < self.due:
            return False
        self.start()
        self.delay = min(2 * self.delay, self.max_delay)
        return True


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """`count` distinct ports that nothing listens on right now, for servers started next.

    Taken below the kernel's ephemeral range when there is room: a port the OS handed out for
    `bind(0)` and freed again can be given to the next outgoing connection (an actor's, say)
    before the server binds it, whereas a port outside that range is only taken by someone
    choosing it. Where the ephemeral range covers almost everything, the OS chooses.

    Raises:
      OSError: if fewer than `count` ports are free.
    """
    rng = rng or random.Random()
    low, high = _ephemeral_port_range()
    candidates = [*range(10_000, low), *range(high + 1, 65_536)]
    ports: list[int] = []
    if len(candidates) >= 100 * count:
        for port in rng.sample(candidates, len(candidates)):
            if len(ports) == count:
                break
            if _bindable(port):
                ports.append(port)
    for _ in range(100 * count):
        if len(ports) == count:
            break
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    if len(ports) < count:
        raise OSError(f"found {len(ports)} free ports of the {count} needed")
    return ports


def _bindable(port: int) -> bool:
    """Nothing listens on `port`, on any IPv4 or IPv6 address of this machine."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, address in families:
        try:
            with socket.socket(family) as s:
                s.bind((address, port))
        except OSError as error:
            if family == socket.AF_INET6 and error.errno == errno.EADDRNOTAVAIL:
                continue  # no IPv6 on this machine
            return False
    return True


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(field) for field in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def plan(
    num_learners: int, num_actors: int, flags_to_forward: list[str], python: str, as_root: bool
) -> tuple[list[str], list[list[str]]]:
    """The learner command (mpirun when several) and each actor's command, on localhost."""
    learner_hosts = [f"localhost:{port}" for port in free_ports(num_learners)]
    actor_hosts = ["localhost"] * num_actors
    script = os.path.join(_ROOT, "experiment.py")
    learner = planning.learner_command(python, script, learner_hosts, actor_hosts, flags_to_forward)
    if num_learners > 1:
        learner = planning.mpirun_command(["localhost"] * num_learners, learner, as_root)
    actors = [
        planning.actor_command(python, script, task, learner_hosts, actor_hosts, flags_to_forward)
        for task in range(num_actors)
    ]
    return learner, actors


def _die_with_the_launcher() -> None:
    # So nothing is orphaned even if the launcher is killed outright. The only Python that runs
    # in the child between fork and exec: one call of a function looked up beforehand.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _start(name: str, argv: list[str], log_path: str, learners: bool = False) -> _Process:
    # Appended to: a resumed run keeps the earlier part of each log.
    log = open(log_path, "a")  # noqa: SIM115  (kept open for the child's lifetime)
    log.write(planning.shell_line(argv) + "\n")
    log.flush()
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE if learners else log,  # the learners' output is shown
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, so a stop reaches the whole tree
        preexec_fn=_die_with_the_launcher,
        cwd=_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return _Process(name, popen, log_path, learners)


def _copy_output(process: _Process) -> None:
    """Shows a process's output in the terminal and keeps it in its log."""
    with open(process.log_path, "a") as log:
        for line in iter(process.popen.stdout.readline, b""):
            text = line.decode(errors="replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            log.write(text)
            log.flush()


def _stop(processes: list[_Process], timeout: float) -> None:
    """Asks every process still running to stop, all at once, then SIGKILLs what is left after
    `timeout`. Learners get SIGUSR1, which mpirun passes on to every rank: they finish their
    step, save a checkpoint and exit (on SIGTERM mpirun would kill them before they save)."""
    for process in processes:
        if process.popen.poll() is None:
            _signal_group(process, signal.SIGUSR1 if process.learners else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"[run_local] {process.name} did not stop in {timeout:.0f} s: killing it")
            _signal_group(process, signal.SIGKILL)
            process.popen.wait()


def _signal_group(process: _Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.popen.pid, signum)


def _supervise(learners: _Supervised, actors: list[_Supervised], stop_timeout: float) -> int:
    """Runs the roles until the learners finish: restarts actors that die, and the learners
    (from the latest checkpoint) if they die, each within its cap. Returns an exit code."""
    while True:
        code = learners.exit_code()
        if code is not None and learners.due is None:
            if not learners.schedule_restart(code):
                break
            print(
                f"[run_local] the learners exited with code {code}; restarting them from the "
                f"run's latest checkpoint in {learners.delay:.0f} s (restart {learners.restarts} "
                f"of at most {learners.max_restarts}). Log: {learners.log_path}"
            )
        learners.restart_if_due()
        for actor in actors:
            _supervise_actor(actor)
        time.sleep(0.2)
    if code != 0:
        print(
            f"[run_local] the learners exited with code {code}"
            + (
                f" after {learners.restarts} restart(s)"
                if code not in run_folder.FINAL_EXIT_CODES
                else ""
            )
            + f"; stopping the actors. Log: {learners.log_path}"
        )
    # After a normal finish the actors hear it from their learner and exit by themselves.
    processes = [a.process for a in actors if a.process]
    deadline = time.monotonic() + stop_timeout
    while code == 0 and time.monotonic() < deadline and _any_running(processes):
        time.sleep(0.2)
    _stop(processes, stop_timeout)
    return code


def _any_running(processes: list[_Process]) -> bool:
    return any(p.popen.poll() is None for p in processes)


def _supervise_actor(actor: _Supervised) -> None:
    code = actor.exit_code()
    if code is not None and actor.due is None and not actor.given_up:
        if actor.schedule_restart(code):
            print(
                f"[run_local] {actor.name} exited with code {code}; restarting it in "
                f"{actor.delay:.0f} s (restart {actor.restarts} of at most {actor.max_restarts})"
            )
        elif code != 0:
            why = (
                f"it refused its flags or files (see {actor.log_path})"
                if code == 2
                else f"after {actor.restarts} restarts"
            )
            print(f"[run_local] {actor.name} exited with code {code}; not restarting it: {why}")
    if actor.restart_if_due():
        print(f"[run_local] {actor.name} started again")


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


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.logdir:
        print("run_local.py: error: --logdir is empty: the run needs a folder", file=sys.stderr)
        return 2
    try:
        run_folder.check_name(FLAGS.experiment)
        experiment_name = FLAGS.experiment or run_folder.default_name(FLAGS.level_name)
        run_dir = run_folder.path(FLAGS.logdir, experiment_name)
        given, num_learners, num_actors, resuming = run_flags(run_dir)
        check_launcher_flags(num_learners, num_actors)
        planning.check_hyperparameters(given)  # as every process will, before any starts
        if resuming:
            print(resuming)
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
    # Ctrl-C, SIGTERM and SIGHUP all stop the run. SIGINT explicitly too: a shell starts
    # background jobs with it ignored, and that would make Ctrl-C's signal do nothing.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_interrupt)
    learners = _Supervised(
        "learners",
        learner_argv,
        os.path.join(run_dir, "learners.log"),
        FLAGS.max_learner_restarts,
        FLAGS.restart_max_delay_secs,
        learners=True,
    )
    actors = [
        _Supervised(
            f"actor {task}",
            argv,
            os.path.join(run_dir, f"actor_{task}.log"),
            FLAGS.max_actor_restarts,
            FLAGS.restart_max_delay_secs,
        )
        for task, argv in enumerate(actor_argvs)
    ]
    for role in (learners, *actors):
        role.start()
    try:
        return _supervise(learners, actors, FLAGS.stop_timeout_secs)
    except KeyboardInterrupt:
        # A second Ctrl-C or SIGTERM (a scheduler signalling every process, an impatient user)
        # must not cut the stop short: the learners are saving.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _already_stopping)
        print("\n[run_local] stopping every process of the run...")
        _stop([r.process for r in (learners, *actors) if r.process], FLAGS.stop_timeout_secs)
        print("[run_local] stopped")
        return 130
