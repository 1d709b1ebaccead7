"""Carrying out a multi-host run's plan (`run_plan.py`): start it, show its status, stop it.

A run is one tmux session per host; stopping it stops that session's processes and nothing
else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import shlex
import subprocess
import time

from impala.launch.hosts import Host, HostError, SshOptions, connect, connect_all
from impala.launch.path_trust import TRUST_FUNCTIONS, untrusted_function
from impala.launch.planning import fail_with
from impala.launch.run_plan import HostPlan
from impala.launch.tmux import (
    is_learners_window,
    label_names,
    parse_status,
    stop_learners_command,
    summary_line,
    tmux_has_session,
    tmux_interrupt,
    tmux_kill_session,
    tmux_last_lines,
    tmux_list_windows,
    tmux_new_window,
    tmux_session_label,
)

# ---- Start -------------------------------------------------------------------------------------


def start_run(
    plans: list[HostPlan],
    ssh: SshOptions,
    secret: str,
    ssh_keys: RunSshKeys | None = None,
    tls_bundle: str = "",
) -> int:
    """Checks every host, then starts every window; on any failure, stops what it started.

    Each host gets the run `secret` in its run folders (`HostPlan.secret_paths`) first, the
    run's TLS bundle beside it (`HostPlan.tls_paths`, from `tls_bundle`) and the run's SSH keys
    it needs (`HostPlan.key_files`, from `ssh_keys`).
    """
    if any(plan.tls_paths for plan in plans) and not tls_bundle:
        raise HostError("the run needs its TLS bundle (--transport_tls)")
    key_contents = _key_contents(plans, ssh_keys)
    connected = connect_all(plans, ssh)
    started: list[tuple[Host, HostPlan]] = []
    try:
        for host, plan in zip(connected, plans, strict=True):
            _preflight(host, plan)
        for host, plan in zip(connected, plans, strict=True):
            _write_files(host, plan, secret, tls_bundle, key_contents)
            started.append((host, plan))
            _start_windows(host, plan)
    except HostError:
        for host, plan in started:
            # Every host started is stopped, whatever one of them does; the error that ended
            # the start is the one raised.
            with contextlib.suppress(HostError):
                _stop_session(host, plan, timeout=10.0)
        raise
    finally:
        for host in connected:
            host.close()
    print(
        "watch:  --action=status    stop:  --action=stop    "
        f"attach on a host:  tmux attach -t {plans[0].session}"
    )
    return 0


def _other_run(host: Host, plan: HostPlan) -> str | None:
    """The run (`label_names`) that `plan.session` on `host` was started for if not this one:
    several run names give one session name. None for this run's session, a missing one, or
    one started before sessions were labelled."""
    code, said = host.tmux(tmux_session_label(plan.session))
    label = said.strip()
    if code != 0 or not label or label == plan.label:
        return None
    return label_names(label)


def _write_files(
    host: Host, plan: HostPlan, secret: str, tls_bundle: str, key_contents: dict[str, str]
) -> None:
    """The run's secret, TLS bundle and SSH keys, then the plan's other files, on `host`."""
    for path in plan.secret_paths:
        host.write_secret(path, secret)
    for path in plan.tls_paths:
        host.write_tls(path, tls_bundle)
    for path, name in plan.key_files:
        host.write_file(path, key_contents[name], owner_only=True)
    for path, content in plan.files:
        # Owner-only: mpirun's ssh reads its config (`-F`) whatever its mode, so a config
        # others could write would let them add commands to it.
        host.write_file(path, content, owner_only=True)


def _start_windows(host: Host, plan: HostPlan) -> None:
    """Starts the plan's tmux session on `host`, one window after another."""
    for index, window in enumerate(plan.windows):
        host.check_tmux(
            tmux_new_window(plan.session, window, first=index == 0, label=plan.label),
            f"starting {window.name}",
        )
    print(
        f"{plan.host}: started {', '.join(w.name for w in plan.windows)} "
        f"in tmux session {plan.session}"
    )


def _preflight(host: Host, plan: HostPlan) -> None:
    """Everything that can be checked before anything starts on any host."""
    code, output = host.tmux(["-V"])
    if code != 0:
        raise HostError(f"{host.name}: tmux is not usable: {output.strip()}")
    if host.tmux(tmux_has_session(plan.session))[0] == 0:
        other = _other_run(host, plan)
        if other:
            raise HostError(
                f"{host.name}: tmux session {plan.session} is run {other}'s, whose name gives "
                "the same session name as this run's: choose another --run_name"
            )
        raise HostError(
            f"{host.name}: tmux session {plan.session} exists already: a run of this name is "
            "running (stop it with --action=stop, or choose another --run_name)"
        )
    if plan.containers:
        code, output = host.shell(plan.containers.check_command())
        if code != 0:
            lines = output.strip().splitlines() or [f"exit {code}"]
            raise HostError(f"{host.name}: {lines[-1]}")
    for worker in plan.workers:
        code, output = host.shell(_check_worker_command(worker, plan.containers is None))
        if code != 0:
            lines = output.strip().splitlines() or [f"exit {code}"]
            raise HostError(f"{host.name} ({worker.name}, CSV line {worker.line}): {lines[-1]}")


def _check_worker_command(worker, bare: bool = True) -> str:
    """A shell command that fails with one line naming what is missing, busy or not trusted.
    Every value from the CSV is quoted: in the tests, in the messages echoed and in the Python
    probe.

    A bare process runs the workdir's `experiment.py` with the row's python, and Python
    imports from the workdir first: whoever can write there, or swap the interpreter, runs
    code as this user with the run secret in reach. So the workdir, its `experiment.py` and
    the python must be trusted (`_TRUSTED`) before anything runs them, the learner's port
    probe included.

    Args:
      bare: the process runs on the host, not in a container: its python must be there.
    """
    workdir, python = shlex.quote(worker.workdir), shlex.quote(worker.python)
    checks = [f"test -d {workdir} || {fail_with(f'workdir {worker.workdir} does not exist')}"]
    if not bare:  # the image has the project and its python; the workdir holds the run folder
        return checks[0]
    checks.append(
        f"test -x {python} || "
        + fail_with(f"python {worker.python} is not an executable (run make setup there)")
    )
    script = posixpath.join(worker.workdir, "experiment.py")
    checks.append(
        f"test -f {shlex.quote(script)} || "
        + fail_with(f"workdir {worker.workdir} has no experiment.py (not the project)")
    )
    checks.append(_TRUSTED)
    # How many parts at the end of each path, as given and real, may not be writable by others
    # even if sticky: the workdir itself; the script and its folder (Python imports from the
    # script's real folder first); the interpreter, its folder and the one above (Python reads
    # a pyvenv.cfg there as given, and its `._pth` file and standard library beside the real
    # one). What lies inside them (a venv's site-packages, the project's packages) is not
    # checked: the folders being no one else's, neither are they unless made so.
    for what, path, strict in (
        ("workdir", worker.workdir, 1),
        ("python", worker.python, 3),
        ("workdir", script, 2),
    ):
        shown = shlex.quote(f"{what} {path}")
        checks.append(f"trusted {shown} {shlex.quote(posixpath.normpath(path))} {strict}")
    if worker.job == "learner":
        where = f"tf_port {worker.tf_port} on {worker.host}: "
        probe = (
            "import socket, sys\n"
            "s = socket.socket()\n"
            f"try: s.bind(({worker.host!r}, {int(worker.tf_port)}))\n"
            f"except OSError as e: sys.exit({where!r} + str(e))"
        )
        checks.append(f"{python} -c {shlex.quote(probe)}")
    return " && ".join(checks)


# Shell: `trusted WHAT PATH STRICT` (`path_trust`), refusing in one line that says why.
_TRUSTED = (
    untrusted_function("", " (someone else could change the code this run executes)")
    + " && "
    + TRUST_FUNCTIONS
)


# ---- The run's SSH keys ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSshKeys:
    """The run's SSH keys for mpirun between learner containers: a key mpirun's ssh logs in
    with, and the host key of the sshd containers (OpenSSH formats)."""

    client_key: str
    client_public: str
    host_key: str
    host_public: str


def run_ssh_keys(directory: str) -> RunSshKeys:
    """The run's SSH keys, kept in `directory` (owner-only; made with ssh-keygen the first time,
    the same ones after)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for name in ("client", "host"):
        key = os.path.join(directory, name)
        if not os.path.exists(key):
            try:
                done = subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "impala-run", "-f", key],
                    capture_output=True,
                    text=True,
                )
            except FileNotFoundError:
                raise HostError(
                    "ssh-keygen not found here: the run's SSH keys need it (openssh-client)"
                ) from None
            if done.returncode != 0:
                raise HostError(f"ssh-keygen for {key} failed: {done.stderr.strip()}")
    return RunSshKeys(
        *(_read(directory, name) for name in ("client", "client.pub", "host", "host.pub"))
    )


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read()


def _key_contents(plans, keys: RunSshKeys | None) -> dict[str, str]:
    """What each file of `containers.MPI_SSH_FILES` holds for this run."""
    if not any(plan.key_files for plan in plans):
        return {}
    if keys is None:
        raise HostError("the run needs its SSH keys (learners in containers on several hosts)")
    port = plans[0].containers.sshd_port
    host_key = " ".join(keys.host_public.split()[:2])
    servers = [p.host for p in plans if any(n == "host_key" for _, n in p.key_files)]
    return {
        "id_ed25519": keys.client_key,
        # restrict: no forwarding, no pty, no ~/.ssh/rc; commands (mpirun's orted) only.
        "authorized_keys": f"restrict {keys.client_public}",
        "host_key": keys.host_key,
        "known_hosts": "".join(f"[{host}]:{port} {host_key}\n" for host in servers),
    }


# ---- Status ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WindowStatus:
    name: str
    alive: bool
    exit_status: str
    last_line: str


def print_status(plans: list[HostPlan], ssh: SshOptions) -> int:
    """Prints one row per process window: host, window, alive or dead, its last log line."""
    rows = [("host", "process", "state", "last line")]
    for plan in plans:
        try:
            host = connect(plan, ssh)
            try:
                other = _other_run(host, plan)
                statuses = None if other else _statuses(host, plan)
            finally:
                host.close()
        except HostError as error:  # unreachable, or failed midway: the next hosts still show
            rows += [(plan.host, w.name, "unreachable", str(error)) for w in plan.windows]
            continue
        if statuses is None:
            said = f"tmux session {plan.session} is run {other}'s"
            rows += [(plan.host, w.name, "another run's", said) for w in plan.windows]
            continue
        rows += [(plan.host, s.name, _state(s), s.last_line) for s in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + "  "
            + row[3][:100]
        )
    return 0


def _state(status: WindowStatus) -> str:
    if status.alive:
        return "alive"
    return "not started" if status.exit_status == "missing" else f"dead ({status.exit_status})"


def _statuses(host: Host, plan: HostPlan) -> list[WindowStatus]:
    code, listing = host.tmux(tmux_list_windows(plan.session))
    found = (
        {name: (alive, status) for name, alive, status in parse_status(listing)}
        if code == 0
        else {}
    )
    statuses = []
    for window in plan.windows:
        if window.name not in found:
            statuses.append(WindowStatus(window.name, False, "missing", ""))
            continue
        alive, status = found[window.name]
        _, screen = host.tmux(tmux_last_lines(plan.session, window.name))
        statuses.append(WindowStatus(window.name, alive, f"exit {status}", summary_line(screen)))
    return statuses


# ---- Stop --------------------------------------------------------------------------------------


def stop_run(plans: list[HostPlan], ssh: SshOptions) -> int:
    """Interrupts every window of the run on every host, then removes the sessions.

    The learners' host comes first, its session stopped (the learners saved and gone) before
    any other: a learner on another host may run in that host's sshd container, which stopping
    it first would kill before that learner saves.
    """
    failures = []
    learners_first = sorted(
        plans, key=lambda p: not any(is_learners_window(w.name) for w in p.windows)
    )
    for plan in learners_first:
        try:
            host = connect(plan, ssh)
            try:
                stopped = _stop_session(host, plan, timeout=30.0)
            finally:
                host.close()
        except HostError as error:  # unreachable, or failed midway: the next hosts still stop
            failures.append(str(error))
            continue
        print(
            f"{plan.host}: {'stopped' if stopped else 'nothing running in'} "
            f"tmux session {plan.session}"
        )
    if failures:
        raise HostError("could not stop the run on every host: " + "; ".join(failures))
    return 0


def _stop_session(host: Host, plan: HostPlan, timeout: float) -> bool:
    """Stops the learners (SIGUSR1 to each learners window's learner or mpirun) and Ctrl-C to
    the other windows; waits, then removes the session, and the run's containers if it runs in
    containers."""
    session, containers = plan.session, plan.containers
    if host.tmux(tmux_has_session(session))[0] != 0:
        if containers:  # a session killed by hand may leave its containers running
            host.shell(containers.remove_command(session))
        return False
    other = _other_run(host, plan)
    if other:
        raise HostError(
            f"{host.name}: not stopping tmux session {session}: it is run {other}'s, whose name "
            "gives the same session name as this run's"
        )

    def stop_learners(window: str) -> str:
        if containers:
            return containers.signal_command(session, window, "USR1")
        return stop_learners_command(session, window)

    code, listing = host.tmux(tmux_list_windows(session))
    for name, alive, _ in parse_status(listing):
        if not alive:
            continue
        if not is_learners_window(name) or host.shell(stop_learners(name))[0]:
            host.tmux(tmux_interrupt(session, name))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, listing = host.tmux(tmux_list_windows(session))
        if code != 0 or not any(alive for _, alive, _ in parse_status(listing)):
            break
        time.sleep(0.5)
    host.tmux(tmux_kill_session(session))
    if containers:
        host.shell(containers.remove_command(session))
    return True
