"""Reaching hosts: local tmux through libtmux, remote hosts through SSH (paramiko) running tmux.

Both kinds run the same tmux command lists, built by the pure `tmux_*` functions in `tmux.py`;
what a run does on them (start, status, stop) is `run_control.py`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Sequence

import libtmux
import paramiko

from impala import run_folder, run_secret, run_tls
from impala.launch.path_trust import TRUST_FUNCTIONS, untrusted_function
from impala.launch.run_plan import HostPlan
from impala.printable import printable
from impala.run_folder import not_plain_absolute, unsafe_folder

# The longest message a HostError carries, a host's answer included.
MAX_MESSAGE_CHARS = 500


class HostError(RuntimeError):
    """Something failed on a host; the message names the host. It may quote what a host sent
    (a hostile one, for all the frontend knows), so it is made printable: one line (a host's
    lines joined by " | ") of at most `MAX_MESSAGE_CHARS`, with no character a terminal would
    act on."""

    def __init__(self, message: str):
        lines = " | ".join(line.strip() for line in str(message).splitlines() if line.strip())
        if len(lines) > MAX_MESSAGE_CHARS:
            lines = lines[: MAX_MESSAGE_CHARS - 3] + "..."
        super().__init__(printable(lines))


# What a command's output may add to the frontend's memory, per stream; the rest is dropped.
MAX_OUTPUT_BYTES = 1 << 20
# How long a command on a host may take, output and exit status included.
COMMAND_SECS = 60.0


# ---- Hosts -------------------------------------------------------------------------------------


class Host:
    """A host of the run: runs shell and tmux commands, writes files."""

    name: str

    def tmux(self, args: Sequence[str]) -> tuple[int, str]:
        raise NotImplementedError

    def shell(self, command: str) -> tuple[int, str]:
        raise NotImplementedError

    def write_file(self, path: str, content: str, *, owner_only: bool = False) -> None:
        """Writes `content` to `path`, put in place whole: a symlink at `path` is replaced,
        never followed. `owner_only`: readable by its owner only from its first byte."""
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
        # Into the folder's real path, checked (`_checked_folder`): no one else can then rename
        # or replace what is written there. A new temporary file of unguessable name, renamed
        # into place (`run_folder.replacing`): a symlink at `path` is replaced, never followed.
        folder = os.path.realpath(self._checked_folder(path))
        try:
            target = os.path.join(folder, os.path.basename(path))
            with run_folder.replacing(target, owner_only=owner_only) as f:
                f.write(content)
        except OSError as error:
            raise HostError(f"{self.name}: writing {path} failed: {error}") from None

    def _checked_folder(self, path: str) -> str:
        """`path`'s folder, made if missing, where no one else can change what is written
        (`unsafe_folder`): checked before anything is made there (on the nearest folder that
        exists) and again once made."""
        folder = os.path.dirname(path)
        if not_plain_absolute(folder):  # as over SSH: the plan's paths are plain
            raise HostError(f"{self.name}: writing {path}: not an absolute path without '..'")
        try:
            unsafe = unsafe_folder(run_folder.nearest_existing(folder))
            if not unsafe:
                os.makedirs(folder, exist_ok=True)
                unsafe = unsafe_folder(folder)
        except OSError as error:
            raise HostError(f"{self.name}: writing {path} failed: {error}") from None
        if unsafe:
            raise HostError(f"{self.name}: refusing to write {path}: {unsafe}")
        return folder

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
        (`load`): this machine's own copy, the one the frontend made. Only into a folder no
        one else can change (`_checked_folder`), as `write_file`."""
        self._checked_folder(path)
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
        try:
            self._connect(worker, accept_unknown_host_keys, known_hosts, timeout)
        except BaseException:
            self._client.close()  # or paramiko's thread reading the host lives on
            raise

    def _connect(self, worker, accept_unknown_host_keys, known_hosts, timeout) -> None:
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
        except Exception as error:  # what paramiko raises on a malformed packet, as it is
            raise HostError(
                f"{worker.host}:{worker.ssh_port}: SSH as {worker.ssh_user} failed: "
                f"{type(error).__name__}: {error}"
            ) from None

    def tmux(self, args: Sequence[str]) -> tuple[int, str]:
        return self.shell(shlex.join(["tmux", *args]))

    def shell(self, command: str) -> tuple[int, str]:
        code, stdout, stderr = self._run(command)
        return code, (stdout + stderr).decode(errors="replace")

    def write_file(self, path: str, content: str, *, owner_only: bool = False) -> None:
        # Through the shell rather than SFTP, which not every SSH server offers. The content
        # goes through stdin: never on a command line, where `ps` would show it. The folder is
        # checked as the preflight checks a workdir (`path_trust.trusted`, none of it strict):
        # resolved part by part, every link met, and the folders it lies in, root's or this
        # user's, and no folder of the real path writable by others unless sticky: no one else
        # can then rename what is written away or point the path elsewhere. Checked on the
        # nearest folder that exists before `mkdir -p` (which would make folders through a
        # link), and again once made. The file is written, an owner-only one under umask 077,
        # into a new folder of unguessable name in the real path (a fixed temporary name could
        # be made a symlink between its removal and the write), then moved into place: a rename
        # replaces a symlink at the target, never follows it, and `mv -T` fails on a folder
        # there rather than moving the file into it.
        given = os.path.dirname(path)
        if not_plain_absolute(given):
            raise HostError(f"{self.name}: writing {path}: not an absolute path without '..'")
        given, name = shlex.quote(os.path.normpath(given)), shlex.quote(os.path.basename(path))
        command = (
            f"{'umask 077 && ' if owner_only else ''}"
            + untrusted_function("refusing to write there: ")
            + " && "
            + TRUST_FUNCTIONS
            + f' && e={given} && while ! exists "$e"; do e=${{e%/*}}; [ -n "$e" ] || e=/; done'
            + ' && trusted - "$e" 0'
            + f" && mkdir -p -- {given} && CDPATH= cd -P -- {given} && folder=$PWD"
            + f' && trusted - {given} 0 && chain - "$folder" 0'
            + ' && private=$(mktemp -d "$folder/.write.XXXXXXXX")'
            + f' && {{ cat > "$private/file" && mv -fT "$private/file" "$folder"/{name}; '
            + 'written=$?; rm -rf "$private"; exit "$written"; }'
        )
        code, _, stderr = self._run(command, content)
        if code != 0:
            error = stderr.decode(errors="replace").strip() or f"exit {code}"
            raise HostError(f"{self.name}: writing {path} failed: {error}")

    def _run(self, command: str, stdin: str = "") -> tuple[int, bytes, bytes]:
        """Runs `command` with `stdin`: its exit status, and its output and errors, each cut at
        `MAX_OUTPUT_BYTES`. A host that does not finish within `COMMAND_SECS` (its connection
        is then closed, which ends every wait on it), or fails the SSH session, is a
        HostError: whatever it sends or withholds, this returns."""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise HostError(f"{self.name}: the SSH connection is closed")
        timed_out = threading.Event()

        def time_out() -> None:
            timed_out.set()
            transport.close()

        watchdog = threading.Timer(COMMAND_SECS, time_out)
        watchdog.daemon = True
        watchdog.start()
        channel = None
        try:
            channel = transport.open_session(timeout=COMMAND_SECS)
            channel.settimeout(COMMAND_SECS)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin.encode())
            channel.shutdown_write()
            streams = (bytearray(), bytearray())
            readers = (
                (channel.recv_ready, channel.recv),
                (channel.recv_stderr_ready, channel.recv_stderr),
            )
            while not timed_out.is_set():
                # Done once the host said its exit status and ended its output (the status
                # may come before the last of the output), with nothing left to read.
                finished = channel.exit_status_ready() and (channel.eof_received or channel.closed)
                read = False
                for kept, (ready, receive) in zip(streams, readers, strict=True):
                    if ready():  # a chunk each at a time: a flood meets the deadline
                        read = True
                        data = receive(65536)
                        kept += data[: max(0, MAX_OUTPUT_BYTES - len(kept))]
                if finished and not read:
                    return channel.recv_exit_status(), bytes(streams[0]), bytes(streams[1])
                if not read:
                    time.sleep(0.01)
        except Exception as error:  # paramiko's, or what it raises on a malformed packet
            if not timed_out.is_set():
                raise HostError(
                    f"{self.name}: SSH failed: {type(error).__name__}: {error}"
                ) from None
        finally:
            watchdog.cancel()
            if channel is not None:
                channel.close()
        raise HostError(
            f"{self.name}: a command did not finish within {COMMAND_SECS:.0f} s (its SSH "
            f"connection closed): {command[:60]}"
        )

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


def connect(plan: HostPlan, ssh: SshOptions) -> Host:
    """The plan's host: this machine, or over SSH."""
    if plan.local:
        return LocalHost(plan.host)
    return SshHost(plan.worker, ssh.accept_unknown_host_keys, ssh.known_hosts)


def connect_all(plans: Sequence[HostPlan], ssh: SshOptions) -> list[Host]:
    """A connection to each plan's host, in order; none left open if one fails."""
    connected: list[Host] = []
    try:
        for plan in plans:
            connected.append(connect(plan, ssh))
    except HostError:
        for host in connected:
            host.close()
        raise
    return connected
