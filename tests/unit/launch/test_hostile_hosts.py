"""A worker host that is hostile, as a host someone else's CSV names may be: an SSH server of
our own (paramiko's server side, at 127.0.0.2, which the frontend does not take for this
machine) that greets with terminal escape sequences, answers commands with them, floods, or
never finishes. Whatever it does, the frontend's `SshHost` returns within its deadline, keeps
at most its cap of output, lets go of the connection, and quotes the host only in printable
text."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import types

import paramiko
import pytest

from impala.launch import hosts, run_control, run_plan, workers_csv
from tests.helpers import ROOT

# What a hostile host would have the user's terminal do: write the clipboard (OSC 52), move up a
# line, erase it, and clear the screen, then say something reassuring.
ESCAPES = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[1A\x1b[2K\r\x1b[2J\x1b[Hall hosts ready"


def _has_control(text: str) -> bool:
    return any(not char.isprintable() for char in text)


class _Server(paramiko.ServerInterface):
    """Lets anyone in with a key, and answers every command as `answer` says."""

    def __init__(self, answer):
        self._answer = answer

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        # Answered once the request's own reply is out, as sshd answers: a channel closed
        # before it would fail the request itself.
        answering = threading.Timer(0.1, self._answer, args=(channel,))
        answering.daemon = True
        answering.start()
        return True


class _HostileHost:
    """Listens on loopback; each connection is greeted by `greeting` (raw bytes, no SSH after
    them) or served over SSH with `answer(channel)` for every command."""

    def __init__(
        self, host_key, *, answer=None, greeting: bytes = b"", address="127.0.0.2", server=None
    ):
        self._host_key, self._answer, self._greeting = host_key, answer, greeting
        self._server = server or _Server
        self._listener = socket.create_server((address, 0))
        self.port = self._listener.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            if self._greeting:
                with contextlib.suppress(OSError):
                    connection.sendall(self._greeting)
                continue  # and nothing more: no line end, no key exchange
            transport = paramiko.Transport(connection)
            transport.add_server_key(self._host_key)
            transport.start_server(server=self._server(self._answer))
            self._transports.append(transport)

    def close(self):
        self._listener.close()
        for transport in self._transports:
            transport.close()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    client_key = paramiko.RSAKey.generate(2048)
    client_key.write_private_key_file(str(folder / "id_rsa"))
    return paramiko.RSAKey.generate(2048), str(folder / "id_rsa")


@pytest.fixture
def hostile(keys, monkeypatch):
    """Starts hostile hosts; commands on them have 2 s and keep 64 KiB of output."""
    monkeypatch.setattr(hosts, "COMMAND_SECS", 2.0)
    monkeypatch.setattr(hosts, "MAX_OUTPUT_BYTES", 64 << 10)
    started = []

    def start(**behaviour) -> _HostileHost:
        started.append(_HostileHost(keys[0], **behaviour))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _connect(server: _HostileHost, key_file: str, timeout: float = 15.0) -> hosts.SshHost:
    worker = types.SimpleNamespace(
        host="127.0.0.2", ssh_port=server.port, ssh_user="impala", ssh_key=key_file
    )
    return hosts.SshHost(worker, True, os.devnull, timeout=timeout)


def _answering(*, stdout=b"", stderr=b"", status=None, close=True, hold=0.0):
    def answer(channel):
        if stdout:
            channel.sendall(stdout)
        if stderr:
            channel.sendall_stderr(stderr)
        if hold:
            time.sleep(hold)
        if status is not None:
            channel.send_exit_status(status)
        if close:
            channel.close()

    return answer


def _paramiko_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, paramiko.Transport) and t.is_alive()]


def test_a_greeting_of_escape_sequences_is_quoted_printable_and_the_connection_let_go(
    hostile, keys
):
    """Before its key is checked, a host greets with whatever it likes: paramiko quotes it in
    its error; the frontend's error keeps it printable, and stops paramiko's thread."""
    before = len(_paramiko_threads())
    server = hostile(greeting=(ESCAPES + "\r\n").encode() * 120 + b"no line end")
    with pytest.raises(hosts.HostError) as raised:
        _connect(server, keys[1], timeout=1.0)
    assert not _has_control(str(raised.value)), repr(str(raised.value))
    assert "127.0.0.2" in str(raised.value)
    deadline = time.monotonic() + 5  # paramiko's thread sees its stop within 0.1 s
    while len(_paramiko_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_paramiko_threads()) <= before


def test_a_commands_answer_is_quoted_printable(hostile, keys):
    server = hostile(answer=_answering(stderr=ESCAPES.encode() + b"\n", status=1))
    host = _connect(server, keys[1])
    try:
        with pytest.raises(hosts.HostError) as raised:
            host.check_tmux(["-V"], "tmux -V")
    finally:
        host.close()
    message = str(raised.value)
    assert not _has_control(message) and "all hosts ready" in message, repr(message)


@pytest.mark.parametrize(
    "answer",
    [
        _answering(stdout=b"impala_x|0|\n", close=False),  # its end of output, then no status
        _answering(hold=30),  # nothing at all
    ],
    ids=["no exit status", "silent"],
)
def test_a_host_that_never_finishes_a_command_is_an_error_after_the_deadline(hostile, keys, answer):
    host = _connect(hostile(answer=answer), keys[1])
    started = time.monotonic()
    try:
        with pytest.raises(hosts.HostError, match="did not finish within 2 s"):
            host.tmux(["list-windows"])
    finally:
        host.close()
    assert time.monotonic() - started < 5


def test_a_flood_of_output_keeps_only_the_cap(hostile, keys, monkeypatch):
    """4 MiB of output and of errors are read to their end (the exit status comes after) and
    64 KiB of each kept."""
    monkeypatch.setattr(hosts, "COMMAND_SECS", 30.0)  # paramiko reads a few MB/s when loaded
    flood = b"A" * (4 << 20)
    host = _connect(hostile(answer=_answering(stdout=flood, stderr=flood, status=0)), keys[1])
    try:
        code, output = host.shell("true")
    finally:
        host.close()
    assert code == 0 and len(output) == 2 * (64 << 10)


def test_a_host_that_floods_without_end_is_an_error_after_the_deadline(hostile, keys):
    def endless(channel):
        with contextlib.suppress(OSError, EOFError):
            while True:
                channel.sendall(b"A" * 65536)

    host = _connect(hostile(answer=endless), keys[1])
    started = time.monotonic()
    try:
        with pytest.raises(hosts.HostError, match="did not finish within 2 s"):
            host.shell("true")
    finally:
        host.close()
    assert time.monotonic() - started < 6


def test_the_frontends_status_shows_a_hostile_greeting_printable(hostile, tmp_path):
    """`run_experiment_mm_raw.py --action=status` on a CSV naming the hostile host: one row of
    printable text, on standard output and standard error alike."""
    server = hostile(greeting=(ESCAPES + "\r\n").encode() * 120)
    csv = tmp_path / "workers.csv"
    csv.write_text(
        "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices,workdir,python\n"
        f"learner,127.0.0.2,8001,{server.port},impala,,,/w,\n"
        f"actor,127.0.0.2,,{server.port},impala,,,/w,\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "run_experiment_mm_raw.py",
            f"--workers_csv_path={csv}",
            "--action=status",
            "--accept_unknown_host_keys",
            f"--logdir={tmp_path / 'runs'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "unreachable" in done.stdout, done.stdout + done.stderr
    assert not _has_control(done.stdout.replace("\n", "")), repr(done.stdout)
    assert not _has_control(done.stderr.replace("\n", "")), repr(done.stderr)


def test_a_stop_goes_on_to_the_next_host_when_one_never_answers(hostile, keys, tmp_path, capsys):
    """The learners' host (stopped first) never finishes a command; the actor's host, after
    it, is still asked, and the stop fails naming the first."""
    stuck = hostile(answer=_answering(close=False))
    idle = hostile(answer=_answering(status=1), address="127.0.0.3")  # no session: nothing runs
    csv = tmp_path / "workers.csv"
    csv.write_text(
        "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices,workdir,python\n"
        f"learner,127.0.0.2,8001,{stuck.port},impala,{keys[1]},,/w,\n"
        f"actor,127.0.0.3,,{idle.port},impala,{keys[1]},,/w,\n"
    )
    workers = workers_csv.read_workers(str(csv), default_workdir="/w")
    plans = run_plan.plan_run(workers, [], "cluster")
    ssh = hosts.SshOptions(accept_unknown_host_keys=True, known_hosts=os.devnull)
    with pytest.raises(hosts.HostError, match=r"127\.0\.0\.2: a command did not finish") as raised:
        run_control.stop_run(plans, ssh)
    assert "127.0.0.3" not in str(raised.value)
    assert "127.0.0.3: nothing running in tmux session" in capsys.readouterr().out


class _NeverAnswersExec(_Server):
    def check_channel_exec_request(self, channel, command):
        time.sleep(30)  # in paramiko's thread: the request is never answered
        return False


class _MalformedRequest(_Server):
    """Answers a command with a channel request whose type is not UTF-8, which paramiko's
    client fails to decode."""

    def check_channel_exec_request(self, channel, command):
        message = paramiko.Message()
        message.add_byte(bytes([98]))  # SSH_MSG_CHANNEL_REQUEST
        message.add_int(channel.remote_chanid)
        message.add_string(b"\xff\xfe")
        message.add_boolean(False)
        channel.transport._send_user_message(message)
        return True


@pytest.mark.parametrize("server", [_NeverAnswersExec, _MalformedRequest])
def test_a_command_request_never_answered_or_malformed_is_an_error(hostile, keys, server):
    host = _connect(hostile(answer=_answering(status=0), server=server), keys[1])
    started = time.monotonic()
    try:
        with pytest.raises(hosts.HostError, match=r"127\.0\.0\.2: "):
            host.shell("true")
    finally:
        host.close()
    assert time.monotonic() - started < 6


def test_a_malformed_key_exchange_is_an_error(hostile, keys):
    """A KEXINIT whose first algorithm list is not UTF-8, which paramiko fails to decode."""

    def name_list(names: bytes) -> bytes:
        return len(names).to_bytes(4, "big") + names

    payload = b"\x14" + bytes(16) + name_list(b"\xff\xfe") + name_list(b"x") * 9 + bytes(5)
    padding = 8 - (5 + len(payload)) % 8
    padding += 8 if padding < 4 else 0
    packet = (1 + len(payload) + padding).to_bytes(4, "big") + bytes([padding]) + payload
    server = hostile(greeting=b"SSH-2.0-hostile\r\n" + packet + bytes(padding))
    with pytest.raises(hosts.HostError, match=r"127\.0\.0\.2:.*failed"):
        _connect(server, keys[1], timeout=3.0)


def test_output_after_the_exit_status_is_kept(hostile, keys):
    """OpenSSH may send a command's exit status before the last of its output."""

    def answer(channel):
        channel.send_exit_status(0)
        time.sleep(0.2)
        channel.sendall(b"impala_x|1|0\n")
        channel.shutdown_write()
        channel.close()

    host = _connect(hostile(answer=answer), keys[1])
    try:
        assert host.shell("tmux list-windows") == (0, "impala_x|1|0\n")
    finally:
        host.close()


def test_a_file_written_over_ssh_arrives_whole_through_standard_input(hostile, keys):
    received = []

    def answer(channel):
        data = b""
        while chunk := channel.recv(65536):
            data += chunk
        received.append(data)
        channel.send_exit_status(0)
        channel.close()

    content = "secret\n" + "x" * (3 << 20)  # larger than the channel's window
    host = _connect(hostile(answer=answer), keys[1])
    try:
        host.write_file("/w/run/secret", content, owner_only=True)
    finally:
        host.close()
    assert received == [content.encode()]


def test_a_hosts_long_many_lined_answer_is_one_short_printable_line():
    error = hosts.HostError("n2: failed: " + "line\x1b[2J\n" * 1000)
    message = str(error)
    assert message.startswith("n2: failed: line?[2J | line?[2J | ")
    assert len(message) == hosts.MAX_MESSAGE_CHARS and message.endswith("...")
