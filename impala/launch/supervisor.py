"""Supervising a run's processes on this machine (run_local.py): start them, restart the ones
that die (each within its cap, after growing delays), and stop them all.

The learners (one process, or the mpirun of several) are stopped with SIGUSR1, which mpirun
passes on to every rank: they finish their step, save a checkpoint and exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from impala import run_folder
from impala.launch.planning import shell_line

# The repository root: processes start there (experiment.py and the runs/ folder users know
# are relative to it).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PR_SET_PDEATHSIG = 1
# Looked up once here: a child between fork and exec must not dlopen (another thread of the
# launcher may hold the loader's lock at the fork, and the child would wait for it forever).
_prctl = ctypes.CDLL(None, use_errno=True).prctl


@dataclasses.dataclass
class Process:
    """A started process of the run, and where it logs."""

    name: str
    popen: subprocess.Popen
    log_path: str
    learners: bool = False  # the learner (or the mpirun of several), stopped with SIGUSR1
    reported: bool = False


_FIRST_DELAY_SECS = 1.0
_HEALTHY_SECS = 300.0  # running this long resets the delay before the next restart


@dataclasses.dataclass
class Supervised:
    """A role that is started again when it dies: its command, process and restart record."""

    name: str
    argv: list[str]
    log_path: str
    max_restarts: int
    max_delay: float = 30.0
    learners: bool = False
    shown_as: str = ""  # put before each line of the learners' output shown in the terminal
    process: Process | None = None
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
            threading.Thread(
                target=_copy_output, args=(self.process, self.shown_as), daemon=True
            ).start()

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


def _die_with_the_launcher() -> None:
    # So nothing is orphaned even if the launcher is killed outright. The only Python that runs
    # in the child between fork and exec: one call of a function looked up beforehand.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _start(name: str, argv: list[str], log_path: str, learners: bool = False) -> Process:
    # Appended to: a resumed run keeps the earlier part of each log.
    log = open(log_path, "a")  # noqa: SIM115  (kept open for the child's lifetime)
    log.write(shell_line(argv) + "\n")
    log.flush()
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE if learners else log,  # the learners' output is shown
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, so a stop reaches the whole tree
        preexec_fn=_die_with_the_launcher,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return Process(name, popen, log_path, learners)


def _copy_output(process: Process, shown_as: str = "") -> None:
    """Shows a process's output in the terminal, each line after `shown_as`, and keeps it in its
    log."""
    with open(process.log_path, "a") as log:
        for line in iter(process.popen.stdout.readline, b""):
            text = line.decode(errors="replace")
            sys.stdout.write(shown_as + text)
            sys.stdout.flush()
            log.write(text)
            log.flush()


def stop(processes: list[Process], timeout: float) -> None:
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


def _signal_group(process: Process, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.popen.pid, signum)


@dataclasses.dataclass
class Group:
    """One policy's processes: its learners (one process, or the mpirun of several) and its
    actors. A run of one policy is one group."""

    learners: Supervised
    actors: list[Supervised]
    code: int | None = None  # the learners' final exit code, once they are done
    actors_deadline: float | None = None  # when its actors are stopped if still running
    stopped: bool = False

    def processes(self) -> list[Process]:
        return [role.process for role in (self.learners, *self.actors) if role.process]


def supervise(groups: list[Group], stop_timeout: float) -> int:
    """Runs every group until its learners finish: restarts actors that die, and the learners
    (from their latest checkpoint) if they die, each within its cap. A group whose learners are
    done (finished, refused, out of restarts) has its actors stopped; the other groups go on.
    Returns 0 when every group finished, else the first failed group's exit code."""
    while not all(group.stopped for group in groups):
        for group in groups:
            if group.code is None:
                _supervise_learners(group, stop_timeout)
            if group.code is None:
                for actor in group.actors:
                    _supervise_actor(actor)
            elif not group.stopped:
                _stop_when_due(group, stop_timeout)
        time.sleep(0.2)
    codes = [group.code for group in groups]
    return next((code for code in codes if code != 0), 0)


def _supervise_learners(group: Group, stop_timeout: float) -> None:
    learners = group.learners
    code = learners.exit_code()
    if code is not None and learners.due is None:
        if not learners.schedule_restart(code):
            _learners_done(group, code, stop_timeout)
            return
        print(
            f"[run_local] {learners.name} exited with code {code}; restarting them from "
            f"their latest checkpoint in {learners.delay:.0f} s (restart {learners.restarts} "
            f"of at most {learners.max_restarts}). Log: {learners.log_path}"
        )
    learners.restart_if_due()


def _learners_done(group: Group, code: int, stop_timeout: float) -> None:
    """The group's learners will not run again: its actors are stopped, at once after a
    failure; after a normal finish they hear it from their learner and get `stop_timeout` to
    exit by themselves."""
    learners = group.learners
    group.code = code
    if code != 0:
        print(
            f"[run_local] {learners.name} exited with code {code}"
            + (
                f" after {learners.restarts} restart(s)"
                if code not in run_folder.FINAL_EXIT_CODES
                else ""
            )
            + f"; stopping {'their' if len(group.actors) else 'no'} actors. Log: "
            f"{learners.log_path}"
        )
    group.actors_deadline = time.monotonic() + (stop_timeout if code == 0 else 0.0)


def _stop_when_due(group: Group, stop_timeout: float) -> None:
    processes = [actor.process for actor in group.actors if actor.process]
    if time.monotonic() < group.actors_deadline and _any_running(processes):
        return
    stop(processes, stop_timeout)
    group.stopped = True


def _any_running(processes: list[Process]) -> bool:
    return any(p.popen.poll() is None for p in processes)


def _supervise_actor(actor: Supervised) -> None:
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
