"""Reaching hosts: local tmux through libtmux, remote hosts through SSH (paramiko) running tmux.

Both kinds run the same tmux command lists, built by the pure `tmux_*` functions in `tmux.py`. A
run is one tmux session per host; stopping it stops that session's processes and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import subprocess
import time
from collections.abc import Sequence

import libtmux
import paramiko

from impala import run_secret, run_tls
from impala.launch import planning
from impala.launch.planning import fail_with
from impala.launch.tmux import (
    parse_status,
    stop_learners_command,
    summary_line,
    tmux_has_session,
    tmux_interrupt,
    tmux_kill_session,
    tmux_last_lines,
    tmux_list_windows,
    tmux_new_window,
)


class HostError(RuntimeError):
    """Something failed on a host; the message names the host."""


@dataclasses.dataclass(frozen=True)
class WindowStatus:
    name: str
    alive: bool
    exit_status: str
    last_line: str


# ---- Hosts -------------------------------------------------------------------------------------


class Host:
    """A host of the run: runs shell and tmux commands, writes files."""

    name: str

    def tmux(self, args: Sequence[str]) -> tuple[int, str]:
        raise NotImplementedError

    def shell(self, command: str) -> tuple[int, str]:
        raise NotImplementedError

    def write_file(self, path: str, content: str, *, owner_only: bool = False) -> None:
        """Writes `content` to `path`; `owner_only`: readable by its owner only from its first
        byte, and put in place whole."""
        raise NotImplementedError

    def write_secret(self, path: str, secret: str) -> None:
        """Writes the run secret to `path`, readable by its owner only from its first byte."""
        raise NotImplementedError

    def write_tls(self, path: str, bundle: str) -> None:
        """Writes the run's TLS bundle (`run_tls.Material.pem`) to `path`, as the secret."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def check_tmux(self, args: Sequence[str], what: str) -> str:
        code, output = self.tmux(args)
        if code != 0:
            raise HostError(f"{self.name}: {what} failed: {output.strip() or f'exit {code}'}")
        return output


class LocalHost(Host):
    """This machine: tmux through libtmux, no SSH."""

    def __init__(self, name: str):
        self.name = name
        self._server = libtmux.Server()

    def tmux(self, args: Sequence[str]) -> tuple[int, str]:
        result = self._server.cmd(*args)
        return result.returncode, "\n".join(result.stdout + result.stderr)

    def shell(self, command: str) -> tuple[int, str]:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    def write_file(self, path: str, content: str, *, owner_only: bool = False) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not owner_only:
            with open(path, "w") as f:
                f.write(content)
            return
        temporary = f"{path}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(content)
        os.replace(temporary, path)

    def write_secret(self, path: str, secret: str) -> None:
        self._write_run_file(
            path, secret, run_secret.load, run_secret.write, run_secret.SecretError
        )

    def write_tls(self, path: str, bundle: str) -> None:
        self._write_run_file(
            path, bundle, lambda p: run_tls.load(p).pem(), run_tls.write, run_tls.TlsError
        )

    def _write_run_file(self, path: str, content: str, load, write, error_type) -> None:
        """Writes an owner-only run file (`write`), unless `path` holds `content` already
        (`load`): this machine's own copy, the one the frontend made."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            if load(path) == content:
                return
        except error_type:
            pass
        try:
            write(path, content)
        except error_type as error:
            raise HostError(f"{self.name}: {error}") from None


class SshHost(Host):
    """A remote host over SSH: keys or the SSH agent only, host keys checked."""

    def __init__(
        self, worker, accept_unknown_host_keys: bool, known_hosts: str, timeout: float = 15.0
    ):
        self.name = worker.host
        self._client = paramiko.SSHClient()
        self._client.load_system_host_keys()
        known_hosts = os.path.expanduser(known_hosts)
        if os.path.exists(known_hosts):
            self._client.load_host_keys(known_hosts)
        self._client.set_missing_host_key_policy(
            paramiko.AutoAddPolicy() if accept_unknown_host_keys else paramiko.RejectPolicy()
        )
        try:
            self._client.connect(
                worker.host,
                port=worker.ssh_port,
                username=worker.ssh_user,
                key_filename=worker.ssh_key or None,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                allow_agent=True,
                look_for_keys=not worker.ssh_key,
            )
        except paramiko.BadHostKeyException:
            raise HostError(
                f"{worker.host}:{worker.ssh_port}: its host key differs from the one in "
                "known_hosts (refusing to connect)"
            ) from None
        except paramiko.SSHException as error:
            raise HostError(
                f"{worker.host}:{worker.ssh_port}: SSH as {worker.ssh_user} failed: {error}"
                + (
                    ""
                    if "known_hosts" not in str(error) and "not found" not in str(error)
                    else " (add its key to known_hosts, or pass --accept_unknown_host_keys)"
                )
            ) from None
        except OSError as error:
            raise HostError(
                f"{worker.host}:{worker.ssh_port}: unreachable: {error.strerror or error}"
            ) from None

    def tmux(self, args: Sequence[str]) -> tuple[int, str]:
        return self.shell(shlex.join(["tmux", *args]))

    def shell(self, command: str) -> tuple[int, str]:
        _, stdout, stderr = self._client.exec_command(command, timeout=60)
        output = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), output

    def write_file(self, path: str, content: str, *, owner_only: bool = False) -> None:
        # Through the shell rather than SFTP, which not every SSH server offers. The content
        # goes through stdin: never on a command line, where `ps` would show it. An owner-only
        # file is written under umask 077 into a new folder of unguessable name that only its
        # owner can change (a fixed temporary name could be made a symlink to another file
        # between its removal and the write, by anyone who can write to the folder), then
        # moved into place: a rename replaces a symlink at the target, never follows it.
        folder, target = shlex.quote(os.path.dirname(path)), shlex.quote(path)
        if owner_only:
            private = shlex.quote(os.path.join(os.path.dirname(path), ".write.XXXXXXXX"))
            command = (
                f"umask 077 && mkdir -p {folder} && private=$(mktemp -d {private}) && "
                f'{{ cat > "$private/file" && mv -f "$private/file" {target}; written=$?; '
                f'rm -rf "$private"; exit "$written"; }}'
            )
        else:
            command = f"mkdir -p {folder} && cat > {target}"
        stdin, stdout, stderr = self._client.exec_command(command, timeout=60)
        stdin.write(content)
        stdin.channel.shutdown_write()
        if stdout.channel.recv_exit_status() != 0:
            raise HostError(f"{self.name}: writing {path} failed: {stderr.read().decode()}")

    def write_secret(self, path: str, secret: str) -> None:
        self.write_file(path, secret + "\n", owner_only=True)

    def write_tls(self, path: str, bundle: str) -> None:
        self.write_file(path, bundle, owner_only=True)

    def close(self) -> None:
        self._client.close()


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How hosts are reached over SSH.

    Attributes:
      accept_unknown_host_keys: accept host keys not in `known_hosts` (else refuse the host).
      known_hosts: the known_hosts file to check host keys against.
    """

    accept_unknown_host_keys: bool = False
    known_hosts: str = "~/.ssh/known_hosts"


def connect(plan: planning.HostPlan, ssh: SshOptions) -> Host:
    if plan.local:
        return LocalHost(plan.host)
    return SshHost(plan.worker, ssh.accept_unknown_host_keys, ssh.known_hosts)


def _connect_all(plans, ssh: SshOptions) -> list[Host]:
    connected: list[Host] = []
    try:
        for plan in plans:
            connected.append(connect(plan, ssh))
    except HostError:
        for host in connected:
            host.close()
        raise
    return connected


# ---- Actions -----------------------------------------------------------------------------------


def start_run(
    plans: list[planning.HostPlan],
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
    connected = _connect_all(plans, ssh)
    started: list[tuple[Host, planning.HostPlan]] = []
    try:
        for host, plan in zip(connected, plans, strict=True):
            _preflight(host, plan)
        for host, plan in zip(connected, plans, strict=True):
            for path in plan.secret_paths:
                host.write_secret(path, secret)
            for path in plan.tls_paths:
                host.write_tls(path, tls_bundle)
            for path, name in plan.key_files:
                host.write_file(path, key_contents[name], owner_only=True)
            for path, content in plan.files:
                host.write_file(path, content)
            started.append((host, plan))
            for index, window in enumerate(plan.windows):
                host.check_tmux(
                    tmux_new_window(plan.session, window, first=index == 0),
                    f"starting {window.name}",
                )
            print(
                f"{plan.host}: started {', '.join(w.name for w in plan.windows)} "
                f"in tmux session {plan.session}"
            )
    except HostError:
        for host, plan in started:
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

    def read(name):
        with open(os.path.join(directory, name)) as f:
            return f.read()

    return RunSshKeys(read("client"), read("client.pub"), read("host"), read("host.pub"))


def _key_contents(plans, keys: RunSshKeys | None) -> dict[str, str]:
    """What each file of `planning.MPI_SSH_FILES` holds for this run."""
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


def _preflight(host: Host, plan: planning.HostPlan) -> None:
    """Everything that can be checked before anything starts on any host."""
    code, output = host.tmux(["-V"])
    if code != 0:
        raise HostError(f"{host.name}: tmux is not usable: {output.strip()}")
    if host.tmux(tmux_has_session(plan.session))[0] == 0:
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
    """A shell command that fails with one line naming what is missing or busy. Every value from
    the CSV is quoted: in the tests, in the messages echoed and in the Python probe.

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


def print_status(plans: list[planning.HostPlan], ssh: SshOptions) -> int:
    """Prints one row per process window: host, window, alive or dead, its last log line."""
    rows = [("host", "process", "state", "last line")]
    for plan in plans:
        try:
            host = connect(plan, ssh)
        except HostError as error:
            rows += [(plan.host, w.name, "unreachable", str(error)) for w in plan.windows]
            continue
        try:
            rows += [(plan.host, s.name, _state(s), s.last_line) for s in _statuses(host, plan)]
        finally:
            host.close()
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


def _statuses(host: Host, plan: planning.HostPlan) -> list[WindowStatus]:
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


def stop_run(plans: list[planning.HostPlan], ssh: SshOptions) -> int:
    """Interrupts every window of the run on every host, then removes the sessions.

    The learners' host comes first, its session stopped (the learners saved and gone) before
    any other: a learner on another host may run in that host's sshd container, which stopping
    it first would kill before that learner saves.
    """
    failures = []
    learners_first = sorted(
        plans, key=lambda p: all(w.name != planning.LEARNERS_WINDOW for w in p.windows)
    )
    for plan in learners_first:
        try:
            host = connect(plan, ssh)
        except HostError as error:
            failures.append(str(error))
            continue
        try:
            stopped = _stop_session(host, plan, timeout=30.0)
            print(
                f"{plan.host}: {'stopped' if stopped else 'nothing running in'} "
                f"tmux session {plan.session}"
            )
        finally:
            host.close()
    if failures:
        raise HostError("could not reach every host: " + "; ".join(failures))
    return 0


def _stop_session(host: Host, plan: planning.HostPlan, timeout: float) -> bool:
    """Stops the learners (SIGUSR1 to mpirun) and Ctrl-C to the other windows; waits, then
    removes the session, and the run's containers if it runs in containers."""
    session, containers = plan.session, plan.containers
    if host.tmux(tmux_has_session(session))[0] != 0:
        if containers:  # a session killed by hand may leave its containers running
            host.shell(containers.remove_command(session))
        return False
    stop_learners = (
        containers.signal_command(session, planning.LEARNERS_WINDOW, "USR1")
        if containers
        else stop_learners_command(session)
    )
    code, listing = host.tmux(tmux_list_windows(session))
    for name, alive, _ in parse_status(listing):
        if not alive:
            continue
        if name != planning.LEARNERS_WINDOW or host.shell(stop_learners)[0]:
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
