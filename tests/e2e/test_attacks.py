"""An attacker's view of a real learner process on loopback.

The attacker speaks the wire protocol (`impala/transport/wire.py`) itself, with grpcio, `struct`
and NumPy only: the method paths, the metadata key of the run secret, the layouts and the status
codes are written out here from the spec, not imported, since a stranger has no other code.
One learner (Counter, MLP), fed by one real actor, is attacked by every test of the module:

- a stranger without the run secret (none, a wrong one, one of the wrong length, upper-cased,
  binary, under another key, given twice) is refused UNAUTHENTICATED on every path, real or
  made up, with nothing answered, read or queued, and every refusal counted;
- a caller with the secret who shifts arguments (extra bytes, counts that disagree with the
  body, negative or 2**31-1 counts) is refused (REFUSED or INVALID_ARGUMENT) without the
  learner allocating what the header declares;
- floods of tiny messages declaring huge sizes, oversized messages and 200 connections at once
  leave the learner's resident memory within `RSS_BOUND_MB`;
- connections set up by hand and held idle, past the learner's cap, are closed as they come;
- through it all the learner trains, and a caller with the secret still gets weights.

The learner reports its refusals every 5 s (a log line per reason) and, once stopped, in its
summary (`learner_0.json`); the tests keep their own count of what each attack should add.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from impala.launch.ports import free_ports
from tests.helpers import Processes, wait_until

pytestmark = pytest.mark.slow

# ---- The protocol, as a stranger reads it in the spec ----------------------------------------

METHODS = (
    "Hello",
    "Room",
    "Enqueue",
    "ReportEpisodes",
    "WeightsVersion",
    "Weights",
    "PolicyStatus",
    "PolicyState",
)
# Paths no learner serves, some of which other servers do: reflection lists a server's methods,
# TensorFlow's RPC layer (the learner's before) listed and called them.
MADE_UP_PATHS = (
    "/impala.Learner/Nope",
    "/impala.Learner/weights",
    "/impala.Learner/Weights/",
    "/impala.Learner.Admin/Weights",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.health.v1.Health/Check",
    "/tensorflow.rpc.RpcService/List",
    "/tensorflow.rpc.RpcService/Call",
)
REFLECTION_PATHS = MADE_UP_PATHS[4:6]
SECRET_KEY = "impala-secret"
ACCEPTED, QUEUE_FULL, FINISHED, REFUSED, UNKNOWN_ACTOR = 0, 1, 2, 4, 5
TASK = struct.Struct("<i")
STATUS = struct.Struct("<i")
VERSION = struct.Struct("<q")
ENQUEUE_HEADER = struct.Struct("<iqi")
EPISODES_HEADER = struct.Struct("<ii")
INT32_MAX = 2**31 - 1
MAX_HELLO_BYTES = 64 << 10
MAX_EPISODES_PER_REPORT = 1024
# An `Enqueue` carries as many whole trajectories as fit in this (the learner's message cap).
MAX_MESSAGE_BYTES = 3 << 20

# ---- The attacked run -------------------------------------------------------------------------

LEVEL = "impala/Counter-v0"  # every episode returns 3.0: an injected return shows at once
EPISODE_RETURN = 3.0
UNROLL_LENGTH = 5
OBSERVATION_SHAPE = (84, 84, 4)  # uint8
NUM_ACTIONS = 4
# The real actor's task; the attacker's, welcomed with the secret (`learner` fixture).
ACTOR_TASK = 0
ATTACKER_TASK = 7
# How far the learner's resident memory may rise over its level before an attack.
RSS_BOUND_MB = 200
# The learner reports refusals with each progress line, this often (`--log_every_secs`; 5 s
# by default): each test waits for the report after its attack.
REPORT_SECS = 1.0
_REFUSED_LINE = re.compile(r"learner 0 refused (.*) \(\d+ since it started\)")
_STEP_LINE = re.compile(r"^\S+   step (\d+) \|", re.MULTILINE)
# What each test measured (memory, connections), printed by the last test.
FIGURES: dict[str, str] = {}


def channel(address: str, *, own_connection: bool = False) -> grpc.Channel:
    """A channel that sends and receives messages of any size (the learner's caps are tested);
    with `own_connection`, over a TCP connection of its own (gRPC shares them by default)."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    if own_connection:
        options.append(("grpc.use_local_subchannel_pool", 1))
    return grpc.insecure_channel(address, options=options)


def call(
    connection: grpc.Channel, path: str, request: bytes, metadata=(), timeout: float = 30
) -> tuple[grpc.StatusCode, bytes | None, grpc.RpcError | None]:
    """(status code, reply or None, the error) of one unary call with raw bytes both ways."""
    try:
        reply = connection.unary_unary(path)(request, metadata=metadata, timeout=timeout)
    except grpc.RpcError as error:
        return error.code(), None, error
    return grpc.StatusCode.OK, reply, None


def with_secret(secret: str) -> tuple:
    return ((SECRET_KEY, secret),)


def bad_credentials(secret: str) -> dict[str, tuple]:
    """Metadata that must not pass for the run secret, by what is wrong with it."""
    wrong = format(int(secret, 16) ^ 1, "064x")  # the last digit differs
    assert secret.upper() != secret, "a secret of digits only cannot be upper-cased"
    return {
        "none": (),
        "wrong": ((SECRET_KEY, wrong),),
        "zeros": ((SECRET_KEY, "0" * 64),),
        "empty": ((SECRET_KEY, ""),),
        "one digit short": ((SECRET_KEY, secret[:-1]),),
        "one digit long": ((SECRET_KEY, secret + "0"),),
        "prefix only": ((SECRET_KEY, secret[:8]),),
        "4000 digits": ((SECRET_KEY, (secret * 63)[:4000]),),
        "upper-cased": ((SECRET_KEY, secret.upper()),),
        "bytes under the binary key": ((SECRET_KEY + "-bin", secret.encode()),),
        "raw bytes under the binary key": ((SECRET_KEY + "-bin", bytes.fromhex(secret)),),
        "under another key": (("impala-secret2", secret),),
        "as authorization": (("authorization", f"Bearer {secret}"),),
        "twice": ((SECRET_KEY, secret), (SECRET_KEY, secret)),
        "right, then wrong": ((SECRET_KEY, secret), (SECRET_KEY, wrong)),
        "wrong, then right": ((SECRET_KEY, wrong), (SECRET_KEY, secret)),
    }


def hello(task: int, identity: bytes) -> bytes:
    return TASK.pack(task) + identity


def trajectories(count: int, *, action: int = 1) -> bytes:
    """The fields of `count` well-formed trajectories of the attacked run: [T + 1, n] prev
    actions, rewards, done flags, observations, actions, logits (the MLP has no core state)."""
    steps = (UNROLL_LENGTH + 1, count)
    return b"".join(
        [
            np.full(steps, action, "<i4").tobytes(),
            np.zeros(steps, "<f4").tobytes(),
            np.zeros(steps, "u1").tobytes(),
            np.zeros((*steps, *OBSERVATION_SHAPE), "u1").tobytes(),
            np.full(steps, action, "<i4").tobytes(),
            np.zeros((*steps, NUM_ACTIONS), "<f4").tobytes(),
        ]
    )


TRAJECTORY_BYTES = len(trajectories(1))


def enqueue(task: int, version: int, count: int, body: bytes) -> bytes:
    return ENQUEUE_HEADER.pack(task, version, count) + body


def episodes(task: int, returns, steps=None, frames=None, starts=None, *, count=None) -> bytes:
    """A `ReportEpisodes` request; `count` may lie about how many follow."""
    k = len(returns)
    steps = [10] * k if steps is None else steps
    frames = [10] * k if frames is None else frames
    starts = [-1] * k if starts is None else starts
    return b"".join(
        [
            EPISODES_HEADER.pack(task, k if count is None else count),
            np.asarray(returns, "<f4").tobytes(),
            np.asarray(steps, "<i8").tobytes(),
            np.asarray(frames, "<i8").tobytes(),
            np.asarray(starts, "<i8").tobytes(),
        ]
    )


def requests_a_stranger_wants_answered() -> dict[str, bytes]:
    """Per path, a request that would do harm if answered: the weights, a queued chunk, a fake
    episode return, a welcome."""
    wanted = {
        "/impala.Learner/Hello": hello(ATTACKER_TASK, b"{}"),
        "/impala.Learner/Room": TASK.pack(ATTACKER_TASK),
        "/impala.Learner/Enqueue": enqueue(ATTACKER_TASK, 0, 1, trajectories(1)),
        "/impala.Learner/ReportEpisodes": episodes(ATTACKER_TASK, [1e6]),
        "/impala.Learner/WeightsVersion": b"",
        "/impala.Learner/Weights": VERSION.pack(-1),
        # Population-based training's: a policy's standing, and its whole state.
        "/impala.Learner/PolicyStatus": b"",
        "/impala.Learner/PolicyState": b"",
    }
    assert sorted(wanted) == sorted(f"/impala.Learner/{m}" for m in METHODS)
    return {**wanted, **dict.fromkeys(MADE_UP_PATHS, VERSION.pack(-1))}


# ---- The learner under attack -----------------------------------------------------------------


@dataclasses.dataclass
class Learner:
    """The attacked learner process, and the refusals the attacks so far should have made it
    count, by reason: at least `counted_low`, at most `counted_high` (gRPC may answer some
    calls before or instead of the learner's own refusal)."""

    process: subprocess.Popen
    actor: subprocess.Popen
    processes: Processes
    address: str
    secret: str
    run_dir: str
    num_weights: int
    counted_low: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    counted_high: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # Trajectories of the attacker's task the learner accepted (with the secret).
    accepted: int = 0

    def log(self) -> str:
        return self.processes.log(self.process)

    def steps(self, log: str | None = None) -> int:
        """The learner's last reported step (0 before the first)."""
        found = _STEP_LINE.findall(self.log() if log is None else log)
        return int(found[-1]) if found else 0

    def refusals(self) -> collections.Counter:
        """Refused calls by reason, summed over the learner's refusal reports."""
        counted = collections.Counter()
        for listed in _REFUSED_LINE.findall(self.log()):
            for item in listed.split(", "):
                n, _, reason = item.partition(" call(s): ")
                counted[reason] += int(n)
        return counted

    def rss_mb(self) -> float:
        return _rss_mb(self.process.pid)

    def sockets(self) -> int:
        """Sockets the learner holds open."""
        count = 0
        fd_dir = f"/proc/{self.process.pid}/fd"
        for fd in os.listdir(fd_dir):
            with contextlib.suppress(OSError):  # closed meanwhile
                count += os.readlink(os.path.join(fd_dir, fd)).startswith("socket:")
        return count

    def lets_go_of_sockets(self, before: int) -> None:
        """Waits until the learner holds no more than a few sockets over `before`: it let go
        of the connections an attacker closed."""
        wait_until(
            lambda: self.sockets() <= before + 5,
            30,
            lambda: f"the learner still holds {self.sockets()} sockets",
        )

    def expect(self, reason: str, calls: int = 1, *, maybe: int = 0) -> None:
        """`calls` more refusals for `reason` to be counted, and up to `maybe` more."""
        self.counted_low[reason] += calls
        self.counted_high[reason] += calls + maybe

    def check_counted_and_trained(self, steps_before: int) -> collections.Counter:
        """Waits for the learner's next report after now, checks that it counted the expected
        refusals and went on training since `steps_before`, and that both processes live."""
        offset = len(self.log())
        wait_until(
            lambda: _STEP_LINE.search(self.log()[offset:]),
            30,  # a learner slowed by a loaded machine reports late
            lambda: f"the learner reported no step since the attack:\n{self.log()[-3000:]}",
        )
        # Its refusal line follows its step line: wait for the refusals expected at least.
        deadline = time.monotonic() + 5
        counted = self.refusals()
        while time.monotonic() < deadline and any(
            counted[reason] < low for reason, low in self.counted_low.items()
        ):
            time.sleep(0.02)
            counted = self.refusals()
        self._check_within_expected(counted)
        if self.counted_high != self.counted_low:
            # A call gRPC may have answered in the learner's place (`expect`'s `maybe`) can be
            # counted after the read above: its handler may run after the caller has gRPC's
            # answer, and a report's refusal line follows its step line, so the wait above can
            # read between the two. (A maybe of the oversized calls once came into the next
            # test's count, one over.) Two reports later, it is in a refusal line written before
            # the second's step line.
            offset = len(self.log())
            wait_until(
                lambda: len(_STEP_LINE.findall(self.log()[offset:])) >= 2,
                30,
                lambda: f"the learner reported no two steps:\n{self.log()[-3000:]}",
            )
            counted = self.refusals()
            self._check_within_expected(counted)
        # What gRPC answered in its place is now known to be counted or not.
        self.counted_low, self.counted_high = collections.Counter(counted), counted
        assert self.steps() > steps_before, f"no training since step {steps_before}"
        assert f"return {EPISODE_RETURN:.1f} (" in self.log()[offset:], "a fake return counted"
        self.check_alive()
        return counted

    def _check_within_expected(self, counted: collections.Counter) -> None:
        for reason in set(counted) | set(self.counted_high):
            assert self.counted_low[reason] <= counted[reason] <= self.counted_high[reason], (
                reason,
                counted,
                self.counted_low,
                self.counted_high,
            )

    def check_alive(self) -> None:
        assert self.process.poll() is None, self.log()[-3000:]
        assert self.actor.poll() is None, self.processes.log(self.actor)[-3000:]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class PeakRss:
    """Samples a process's resident memory every 10 ms while in use: its level on entry, and
    the highest seen until exit."""

    def __init__(self, pid: int):
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.before = self.peak = 0.0

    def __enter__(self) -> PeakRss:
        self.before = self.peak = _rss_mb(self._pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb(self._pid))

    @property
    def growth(self) -> float:
        return self.peak - self.before

    def describe(self) -> str:
        return f"{self.before:.0f} MB -> peak {self.peak:.0f} MB (+{self.growth:.0f} MB)"

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _rss_mb(self._pid))


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """A learner on 127.0.0.1 and one real actor, training; the attacker's task welcomed."""
    folder = tmp_path_factory.mktemp("attacks")
    processes = Processes(str(folder))
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    common = (
        f"--learner_hosts={address}",
        f"--level_name={LEVEL}",
        "--agent_name=MLPAgent",
        f"--unroll_length={UNROLL_LENGTH}",
    )
    process = processes.experiment(
        "learner",
        "--job_name=learner",
        *common,
        "--batch_size=4",
        "--total_environment_frames=1e9",
        f"--log_every_secs={REPORT_SECS}",
        "--experiment=attacked",
    )
    actor = processes.experiment(
        "actor", "--job_name=actor", f"--task={ACTOR_TASK}", *common, "--num_envs_per_actor=2"
    )
    try:
        wait_until(
            lambda: process.poll() is not None or _STEP_LINE.search(processes.log(process)),
            180,
            lambda: f"the learner never trained:\n{processes.log(process)}",
        )
        with open(processes.secret_file) as f:
            secret = f.read().strip()
        target = Learner(
            process,
            actor,
            processes,
            address,
            secret,
            os.path.join(str(folder), "runs", "attacked"),
            _welcome_attacker(address, secret),
        )
        target.check_alive()
        yield target
    finally:
        processes.kill_all()


def _welcome_attacker(address: str, secret: str) -> int:
    """Says hello as `ATTACKER_TASK` with the learner's identity (which a hello with a wrong
    one answers); the number of weights the learner serves."""
    with channel(address) as connection:
        path = "/impala.Learner/Hello"
        code, reply, _ = call(connection, path, hello(ATTACKER_TASK, b"{}"), with_secret(secret))
        assert code == grpc.StatusCode.OK and reply.startswith(b"MISMATCH:"), (code, reply)
        identity = json.loads(reply[len(b"MISMATCH:") :])
        assert identity["observation_shape"] == list(OBSERVATION_SHAPE)
        assert (identity["num_actions"], identity["unroll_length"]) == (NUM_ACTIONS, UNROLL_LENGTH)
        welcome = hello(ATTACKER_TASK, reply[len(b"MISMATCH:") :])
        assert call(connection, path, welcome, with_secret(secret))[:2] == (
            grpc.StatusCode.OK,
            b"",
        )
        version, weights = _weights(connection, secret)
        assert version >= 0 and len(weights) > 1000
        return len(weights)


def _weights(connection: grpc.Channel, secret: str) -> tuple[int, np.ndarray]:
    code, reply, error = call(
        connection, "/impala.Learner/Weights", VERSION.pack(-1), with_secret(secret)
    )
    assert code == grpc.StatusCode.OK, error
    (version,) = VERSION.unpack_from(reply)
    return version, np.frombuffer(reply, "<f4", offset=VERSION.size)


def _enqueue_when_room(connection, request: bytes, secret: str, secs: float = 20) -> int:
    """Sends an `Enqueue` until the learner's queue has room for it (the real actor keeps it
    full much of the time, and a full queue answers before reading the chunk); its status."""
    deadline = time.monotonic() + secs
    while True:
        code, reply, error = call(
            connection, "/impala.Learner/Enqueue", request, with_secret(secret)
        )
        assert code == grpc.StatusCode.OK, error
        (status,) = STATUS.unpack(reply)
        if status != QUEUE_FULL or time.monotonic() > deadline:
            return status
        time.sleep(0.002)


# ---- 1. Listing --------------------------------------------------------------------------------

_TENSORFLOW_CLIENT = """
import json, sys
import tensorflow as tf

Client = tf.distribute.experimental.rpc.Client
try:
    client = Client.create("grpc", sys.argv[1], name="stranger", timeout_in_ms=10000)
except Exception as error:
    print("FAILED", type(error).__name__)
else:
    methods = set(dir(client)) - set(dir(type(client)))
    print("LISTED", json.dumps(sorted(m for m in methods if not m.startswith("_"))))
"""


def test_no_method_list_for_tensorflows_rpc_client_or_server_reflection(learner):
    steps = learner.steps()
    # TensorFlow's RPC client lists the server's methods as it connects (one call), and adds
    # each as a method of the client: it must get no list.
    listing = subprocess.run(
        [sys.executable, "-c", _TENSORFLOW_CLIENT, learner.address],
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcome = listing.stdout.strip().splitlines()[-1:]
    assert outcome in (["FAILED UnauthenticatedError"], ["LISTED []"]), listing
    learner.expect("wrong secret")

    # Server reflection lists a service's methods: not served to a stranger, nor to a caller with
    # the secret (it would be UNIMPLEMENTED there, the learner's one answer to an unknown path).
    ask_for_services = b"\x3a\x01*"  # ServerReflectionRequest{list_services: "*"}
    with channel(learner.address) as connection:
        for path in REFLECTION_PATHS:
            for metadata, expected in (
                ((), grpc.StatusCode.UNAUTHENTICATED),
                (with_secret(learner.secret), grpc.StatusCode.UNIMPLEMENTED),
            ):
                stream = connection.stream_stream(path)
                with pytest.raises(grpc.RpcError) as raised:
                    list(stream(iter([ask_for_services]), metadata=metadata, timeout=10))
                assert raised.value.code() == expected, (path, metadata, raised.value)
            learner.expect("wrong secret")
    learner.check_counted_and_trained(steps)


# ---- 2. Without the secret ----------------------------------------------------------------------


def test_every_path_is_refused_without_the_secret_and_nothing_is_read_or_queued(learner):
    steps = learner.steps()
    wanted = requests_a_stranger_wants_answered()
    credentials = bad_credentials(learner.secret)
    outcomes = collections.Counter()
    with channel(learner.address) as connection, PeakRss(learner.process.pid) as rss:
        for name, metadata in credentials.items():
            for path, request in wanted.items():
                code, reply, error = call(connection, path, request, metadata)
                outcomes[code] += 1
                assert code == grpc.StatusCode.UNAUTHENTICATED, (name, path, code, reply)
                # The refusal says nothing: no reply, no metadata, no secret.
                assert reply is None
                assert not error.initial_metadata() and not error.trailing_metadata()
                assert len(error.details() or "") < 64 and learner.secret not in error.details()
                learner.expect("wrong secret")
        # The same requests with the secret are answered (an unknown path is UNIMPLEMENTED):
        # the refusals above were the secret's. Those that would queue are left out.
        for path in ("Hello", "Room", "WeightsVersion", "Weights"):
            path = f"/impala.Learner/{path}"
            code, reply, error = call(connection, path, wanted[path], with_secret(learner.secret))
            assert code == grpc.StatusCode.OK, (path, error)
        # A learner in no population has no standing to give, and no state: at once, not
        # after holding a server thread for a snapshot no step will take.
        code, reply, _ = call(
            connection, "/impala.Learner/PolicyStatus", b"", with_secret(learner.secret)
        )
        assert (code, reply) == (grpc.StatusCode.OK, b"{}")
        started = time.monotonic()
        code, reply, _ = call(
            connection, "/impala.Learner/PolicyState", b"", with_secret(learner.secret)
        )
        assert (code, reply) == (grpc.StatusCode.OK, b"") and time.monotonic() - started < 5
        code, _, _ = call(connection, MADE_UP_PATHS[0], b"", with_secret(learner.secret))
        assert code == grpc.StatusCode.UNIMPLEMENTED
    assert outcomes[grpc.StatusCode.UNAUTHENTICATED] == len(credentials) * len(wanted)
    FIGURES["without the secret"] = (
        f"{sum(outcomes.values())} calls ({len(credentials)} kinds of bad secret x "
        f"{len(wanted)} paths), learner RSS {rss.describe()}"
    )
    # Counted one by one; the fake episode (return 1e6) is not among the learner's returns.
    learner.check_counted_and_trained(steps)
    assert rss.growth < RSS_BOUND_MB, rss.describe()


# ---- 3. Shifted and extra arguments ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shifted:
    """A request whose arguments are shifted, and how a learner refuses it from a caller with
    the secret: a status and the reason it counts, or a gRPC code (nothing counted), or a
    hello that does not welcome."""

    what: str
    method: str
    request: bytes
    status: int | None = None
    reason: str = "malformed"
    code: grpc.StatusCode | None = None
    not_welcomed: bool = False


def shifted_requests() -> list[Shifted]:
    one = trajectories(1)
    task, big = ATTACKER_TASK, INT32_MAX
    huge_episodes = EPISODES_HEADER.pack(task, big) + bytes(8)  # 16 bytes declaring 2**31-1
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    return [
        # Enqueue: the count against the body, the version, the task.
        Shifted("a trailing byte", "Enqueue", enqueue(task, 0, 1, one) + b"\0", REFUSED),
        Shifted("one byte short", "Enqueue", enqueue(task, 0, 1, one[:-1]), REFUSED),
        Shifted("2 declared, 1 sent", "Enqueue", enqueue(task, 0, 2, one), REFUSED),
        Shifted("1 declared, 2 sent", "Enqueue", enqueue(task, 0, 1, one + one), REFUSED),
        Shifted("0 declared", "Enqueue", enqueue(task, 0, 0, one), REFUSED),
        Shifted("-1 declared", "Enqueue", enqueue(task, 0, -1, one), REFUSED),
        Shifted("-2**31 declared", "Enqueue", enqueue(task, 0, -(2**31), one), REFUSED),
        Shifted("2**31-1 declared", "Enqueue", enqueue(task, 0, big, one), REFUSED),
        Shifted("2**31-1 in a header", "Enqueue", enqueue(task, 0, big, b""), REFUSED),
        Shifted("2**31-1 in 31 bytes", "Enqueue", enqueue(task, 0, big, bytes(15)), REFUSED),
        Shifted("header 4 bytes short", "Enqueue", enqueue(task, 0, 1, b"")[:-4], code=invalid),
        Shifted("empty", "Enqueue", b"", code=invalid),
        Shifted(
            "negative version",
            "Enqueue",
            enqueue(task, -1, 1, one),
            REFUSED,
            "negative weight version",
        ),
        Shifted(
            "action out of range",
            "Enqueue",
            enqueue(task, 0, 1, trajectories(1, action=NUM_ACTIONS)),
            REFUSED,
            "action out of range",
        ),
        Shifted(
            "negative task",
            "Enqueue",
            enqueue(-1, 0, 1, one),
            REFUSED,
            "actor task not this learner's",
        ),
        Shifted("task never welcomed", "Enqueue", enqueue(big, 0, 1, one), UNKNOWN_ACTOR),
        # ReportEpisodes: the count against the body and its bound, the values.
        Shifted("2**31-1 episodes in 16 bytes", "ReportEpisodes", huge_episodes, REFUSED),
        Shifted("-1 episodes", "ReportEpisodes", episodes(task, [1.0], count=-1), REFUSED),
        Shifted("0 episodes", "ReportEpisodes", episodes(task, [1.0], count=0), REFUSED),
        Shifted("2 declared, 1 sent", "ReportEpisodes", episodes(task, [1.0], count=2), REFUSED),
        Shifted(
            "1 declared, 2 sent", "ReportEpisodes", episodes(task, [1.0, 1.0], count=1), REFUSED
        ),
        Shifted("a trailing byte", "ReportEpisodes", episodes(task, [1.0]) + b"\0", REFUSED),
        Shifted(
            "1025 episodes",
            "ReportEpisodes",
            episodes(task, [1.0] * (MAX_EPISODES_PER_REPORT + 1)),
            REFUSED,
        ),
        Shifted("4 bytes", "ReportEpisodes", TASK.pack(task), REFUSED),
        Shifted("negative steps", "ReportEpisodes", episodes(task, [1.0], [-1]), REFUSED),
        Shifted(
            "NaN return", "ReportEpisodes", episodes(task, [np.nan]), REFUSED, "non-finite value"
        ),
        Shifted(
            "return 2e9", "ReportEpisodes", episodes(task, [2e9]), REFUSED, "value out of bounds"
        ),
        Shifted(
            "negative task",
            "ReportEpisodes",
            episodes(-1, [1.0]),
            REFUSED,
            "actor task not this learner's",
        ),
        # The small fixed layouts.
        Shifted("empty", "Room", b"", code=invalid),
        Shifted("a trailing byte", "Room", TASK.pack(task) + b"\0", code=invalid),
        Shifted("8 bytes", "Room", VERSION.pack(task), code=invalid),
        Shifted("a byte", "WeightsVersion", b"\0", code=invalid),
        Shifted("8 bytes", "WeightsVersion", VERSION.pack(-1), code=invalid),
        Shifted("a byte", "PolicyStatus", b"\0", code=invalid),
        Shifted("a byte", "PolicyState", b"\0", code=invalid),
        Shifted("a header", "PolicyState", STATUS.pack(1 << 30), code=invalid),
        Shifted("empty", "Weights", b"", code=invalid),
        Shifted("4 bytes", "Weights", TASK.pack(-1), code=invalid),
        Shifted("a trailing byte", "Weights", VERSION.pack(-1) + b"\0", code=invalid),
        Shifted("two versions", "Weights", VERSION.pack(-1) * 2, code=invalid),
        Shifted("3 bytes", "Hello", b"\0\0\0", code=invalid),
        Shifted("over 64 KiB", "Hello", hello(task, b" " * MAX_HELLO_BYTES), code=invalid),
        Shifted("not JSON", "Hello", hello(task, b"\xff\xfe{"), not_welcomed=True),
        Shifted("nested 60k deep", "Hello", hello(task, b"[" * 60_000), not_welcomed=True),
        Shifted("a JSON list", "Hello", hello(task, b"[1, 2]"), not_welcomed=True),
        Shifted("negative task", "Hello", hello(-1, b"{}"), not_welcomed=True),
    ]


def _refused_as_expected(connection, case: Shifted, secret: str) -> None:
    """Sends `case` with the secret and checks how it is refused."""
    path = f"/impala.Learner/{case.method}"
    if case.method == "Enqueue" and case.status is not None:
        status = _enqueue_when_room(connection, case.request, secret)
        assert status == case.status, (case.what, status)
        return
    code, reply, error = call(connection, path, case.request, with_secret(secret))
    if case.code is not None:
        assert code == case.code, (case.method, case.what, code, reply)
        return
    assert code == grpc.StatusCode.OK, (case.method, case.what, error)
    if case.not_welcomed:
        assert reply != b"", (case.method, case.what)
    else:
        assert STATUS.unpack(reply) == (case.status,), (case.method, case.what, reply)


def test_shifted_arguments_are_refused_with_or_without_the_secret(learner):
    steps = learner.steps()
    cases = shifted_requests()
    with channel(learner.address) as connection, PeakRss(learner.process.pid) as rss:
        # The unshifted chunk is one the learner takes: what follows is refused for its shift.
        status = _enqueue_when_room(
            connection, enqueue(ATTACKER_TASK, 0, 1, trajectories(1)), learner.secret
        )
        assert status == ACCEPTED
        learner.accepted += 1
        for case in cases:
            path = f"/impala.Learner/{case.method}"
            for metadata in ((), ((SECRET_KEY, learner.secret[::-1]),)):
                code, reply, _ = call(connection, path, case.request, metadata)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (case.what, code, reply)
                learner.expect("wrong secret")
            _refused_as_expected(connection, case, learner.secret)
            if case.status == REFUSED:
                learner.expect(case.reason)
    FIGURES["shifted arguments"] = (
        f"{len(cases)} requests x 3 secrets, learner RSS {rss.describe()}"
    )
    learner.check_counted_and_trained(steps)
    # No allocation of what a header declares: 2**31-1 trajectories would be 360 TB.
    assert rss.growth < RSS_BOUND_MB, rss.describe()


# ---- 4. Huge declared sizes, oversized messages ------------------------------------------------


def test_huge_declared_sizes_and_oversized_messages_leave_memory_bounded(learner):
    steps = learner.steps()
    tiny = [
        ("/impala.Learner/Enqueue", enqueue(ATTACKER_TASK, 0, INT32_MAX, bytes(15))),  # 31 bytes
        ("/impala.Learner/Enqueue", enqueue(ATTACKER_TASK, 0, INT32_MAX, b"")),
        ("/impala.Learner/ReportEpisodes", EPISODES_HEADER.pack(ATTACKER_TASK, INT32_MAX)),
        ("/impala.Learner/ReportEpisodes", episodes(ATTACKER_TASK, [1.0], count=INT32_MAX)),
    ]
    secrets = [(), ((SECRET_KEY, "f" * 64),), with_secret(learner.secret)]
    threads, calls_per_thread = 8, 50

    # Big: above the learner's message cap, which its layout sets near 3 MiB; and metadata
    # beyond gRPC's cap on it.
    big = [(64 << 20, with_secret(learner.secret))] * 2 + [(64 << 20, ())] * 2
    big += [(4 << 20, with_secret(learner.secret)), (4 << 20, ((SECRET_KEY, "0" * 64),))]
    with PeakRss(learner.process.pid) as rss, concurrent.futures.ThreadPoolExecutor(16) as pool:
        floods = [
            pool.submit(_flood, learner, tiny, secrets, seed, calls_per_thread)
            for seed in range(threads)
        ]
        bigs = [pool.submit(_oversized, learner.address, size, md) for size, md in big]
        with channel(learner.address) as connection:
            for metadata in (
                ((SECRET_KEY, "a" * 20_000),),
                (*with_secret(learner.secret), ("x-padding", "b" * 20_000)),
                tuple((f"k{i}", "v" * 100) for i in range(300)),
            ):
                code, _, _ = call(connection, "/impala.Learner/Weights", VERSION.pack(-1), metadata)
                assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, code
                # gRPC cuts the metadata and answers for it, the learner's handler may still run
                # on what is left: a call without the secret then counts.
                learner.expect("wrong secret", 0, maybe=1)
        seen = sum((f.result() for f in floods), collections.Counter())
        big_codes = [f.result() for f in bigs]

    unauthenticated = (grpc.StatusCode.UNAUTHENTICATED, None)
    ok = grpc.StatusCode.OK
    allowed = {
        (False, *unauthenticated),
        (True, ok, REFUSED),
        (True, ok, QUEUE_FULL),  # a full queue answers an Enqueue before reading it
    }
    assert set(seen) <= allowed, seen
    assert sum(seen.values()) == threads * calls_per_thread
    learner.expect("wrong secret", seen[(False, *unauthenticated)])
    learner.expect("malformed", seen[(True, ok, REFUSED)])
    for (size, metadata), code in zip(big, big_codes, strict=True):
        if metadata == with_secret(learner.secret):
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (size, code)
            continue
        # Refused for its secret or its size, whichever gRPC saw first.
        assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            learner.expect("wrong secret")
        else:  # the learner's refusal may have run before gRPC's
            learner.expect("wrong secret", 0, maybe=1)
    FIGURES["huge declared sizes"] = (
        f"{sum(seen.values())} tiny calls from {threads} threads + "
        f"{len(big)} oversized (64 MiB, 4 MiB) + 3 oversized metadata, "
        f"learner RSS {rss.describe()}"
    )
    learner.check_counted_and_trained(steps)
    assert rss.growth < RSS_BOUND_MB, rss.describe()


def _flood(learner: Learner, tiny, secrets, seed: int, calls: int) -> collections.Counter:
    """Sends `calls` of the `tiny` requests in turn, each with the next of `secrets`; how many
    were answered how, by (with the right secret, gRPC code, status)."""
    seen = collections.Counter()
    with channel(learner.address) as connection:
        for i in range(calls):
            path, request = tiny[(seed + i) % len(tiny)]
            metadata = secrets[(seed + i) % len(secrets)]
            code, reply, _ = call(connection, path, request, metadata)
            status = STATUS.unpack(reply)[0] if reply is not None else None
            seen[(metadata == with_secret(learner.secret), code, status)] += 1
    return seen


def _oversized(address: str, size: int, metadata) -> grpc.StatusCode:
    """The code of an `Enqueue` of `size` bytes."""
    with channel(address) as connection:
        request = enqueue(ATTACKER_TASK, 0, 1, bytes(size - ENQUEUE_HEADER.size))
        return call(connection, "/impala.Learner/Enqueue", request, metadata, timeout=60)[0]


# ---- 5. Many connections -----------------------------------------------------------------------


def test_two_hundred_connections_without_the_secret_are_all_refused(learner):
    steps = learner.steps()
    connections_before = learner.sockets()
    connections = [channel(learner.address, own_connection=True) for _ in range(200)]
    wanted = requests_a_stranger_wants_answered()
    paths = ["/impala.Learner/Weights", "/impala.Learner/Enqueue", MADE_UP_PATHS[0]]
    try:
        with PeakRss(learner.process.pid) as rss:
            for connection in connections:
                grpc.channel_ready_future(connection).result(timeout=30)
            open_sockets = learner.sockets()
            calls = [
                connection.unary_unary(path).future(wanted[path], timeout=60)
                for connection in connections
                for path in paths
            ]
            codes = collections.Counter()
            _count_refusals(calls, codes)
    finally:
        for connection in connections:
            connection.close()
    # Each connection is its own socket on the learner.
    assert open_sockets >= connections_before + 200, (connections_before, open_sockets)
    # Refused, for the secret or (past the learner's calls at once) before it was looked at.
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert codes[grpc.StatusCode.UNAUTHENTICATED] > 0, codes
    learner.expect("wrong secret", codes[grpc.StatusCode.UNAUTHENTICATED])
    FIGURES["200 connections"] = (
        f"{len(calls)} calls: {codes[grpc.StatusCode.UNAUTHENTICATED]} UNAUTHENTICATED, "
        f"{codes[grpc.StatusCode.RESOURCE_EXHAUSTED]} RESOURCE_EXHAUSTED; learner sockets "
        f"{connections_before} -> {open_sockets}; learner RSS {rss.describe()}"
    )
    assert rss.growth < RSS_BOUND_MB, rss.describe()
    learner.lets_go_of_sockets(connections_before)
    learner.check_counted_and_trained(steps)
    # A caller with the secret still gets weights, newer than before the attack.
    with channel(learner.address) as connection:
        version, weights = _weights(connection, learner.secret)
    assert version > 0 and len(weights) == learner.num_weights
    assert np.isfinite(weights).all()


# A connection as HTTP/2 sets one up (RFC 9113 3.4, 6.5): the client preface and an empty
# SETTINGS frame; the server answers with its SETTINGS, which a client acknowledges.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
SETTINGS_ACK = bytes.fromhex("000000040100000000")
# A learner accepts at most this many connections at once, and half its open-file limit if
# that is less (the guide's threat model).
MAX_CONNECTIONS = 1024


def _connection_cap(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        (soft,) = [line.split()[3] for line in f if line.startswith("Max open files")]
    return MAX_CONNECTIONS if soft == "unlimited" else min(MAX_CONNECTIONS, int(soft) // 2)


def test_connections_held_idle_past_the_cap_are_closed_and_the_learner_keeps_its_files(learner):
    """A stranger opens more connections than the learner accepts, sets each up and leaves it
    idle, making no call: those past the cap are closed as they come, so the learner holds at
    most the cap's sockets and keeps the rest of its open files; its actor, connected before,
    goes on; once the stranger lets go, a caller with the secret connects again."""
    steps = learner.steps()
    cap = _connection_cap(learner.process.pid)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < cap + 256:
        pytest.skip(f"this process may open {hard} files, too few to pass a cap of {cap}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, cap + 256), hard))
    host, port = learner.address.rsplit(":", 1)
    address = (host, int(port))
    sockets_before = learner.sockets()
    held = []
    try:
        with PeakRss(learner.process.pid) as rss:
            for _ in range(cap + 32):
                connection = socket.create_connection(address, timeout=10)
                connection.sendall(HTTP2_PREFACE)
                held.append(connection)
            set_up = closed = 0
            for connection in held:
                connection.settimeout(10)
                try:
                    first = connection.recv(9)
                except ConnectionResetError:
                    first = b""
                if first[3:4] == b"\x04":  # the learner's SETTINGS
                    connection.sendall(SETTINGS_ACK)
                    set_up += 1
                else:
                    closed += first == b""
            # A connection past the cap is shut (the stranger reads its end) a moment before
            # its socket is released: what the learner holds settles within a second.
            bound = sockets_before + set_up
            wait_until(
                lambda: learner.sockets() <= bound,
                5,
                lambda: f"the learner holds {learner.sockets()} sockets, over {bound}",
            )
            sockets_held = learner.sockets()
        # The actor's connection is one of the cap's.
        assert set_up < cap and closed >= 32 and set_up + closed == len(held), (set_up, closed)
        assert sockets_held <= bound, (sockets_before, sockets_held, set_up)
        learner.check_counted_and_trained(steps)
    finally:
        for connection in held:
            connection.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    FIGURES[f"{len(held)} idle connections"] = (
        f"{set_up} set up (cap {cap}), {closed} closed at once; learner sockets "
        f"{sockets_before} -> {sockets_held}; learner RSS {rss.describe()}"
    )
    assert rss.growth < RSS_BOUND_MB, rss.describe()
    learner.lets_go_of_sockets(sockets_before)
    with channel(learner.address) as connection:
        version, weights = _weights(connection, learner.secret)
    assert version > 0 and len(weights) == learner.num_weights


def _count_refusals(calls, codes: collections.Counter) -> None:
    """Waits for every call of `calls` (futures), each of which must fail, and counts their
    status codes into `codes`."""
    for future in calls:
        with pytest.raises(grpc.RpcError) as raised:
            future.result()
        codes[raised.value.code()] += 1


def test_full_size_messages_on_many_connections_leave_memory_bounded(learner):
    """400 connections, each sending a message the size of the learner's message cap (a full
    `Enqueue` chunk, about 3 MiB) without the secret, in rounds: refused, and the learner's
    memory within the bound."""
    steps = learner.steps()
    chunk = MAX_MESSAGE_BYTES // TRAJECTORY_BYTES * TRAJECTORY_BYTES  # 18 trajectories
    request = enqueue(ATTACKER_TASK, 0, 1, bytes(chunk))
    connections = [channel(learner.address, own_connection=True) for _ in range(400)]
    codes = collections.Counter()
    try:
        with PeakRss(learner.process.pid) as rss:
            for connection in connections:
                grpc.channel_ready_future(connection).result(timeout=30)
            for _ in range(5):
                calls = [
                    connection.unary_unary("/impala.Learner/Enqueue").future(request, timeout=60)
                    for connection in connections
                ]
                _count_refusals(calls, codes)
    finally:
        for connection in connections:
            connection.close()
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}
    learner.expect("wrong secret", codes[grpc.StatusCode.UNAUTHENTICATED])
    FIGURES["400 connections x 3 MiB x 5"] = (
        f"{sum(codes.values())} calls: {dict((c.name, n) for c, n in codes.items())}; "
        f"learner RSS {rss.describe()}"
    )
    learner.check_counted_and_trained(steps)
    assert rss.growth < RSS_BOUND_MB, rss.describe()


# ---- 6. Throughout -----------------------------------------------------------------------------


def test_the_learner_trained_through_it_all_and_counted_every_refusal(learner):
    """A last stranger's call to each method; then the learner is stopped (it saves and writes
    its summary) and its own accounts checked against the attacks'."""
    steps = learner.steps()
    with channel(learner.address) as connection:
        for path, request in requests_a_stranger_wants_answered().items():
            code, reply, _ = call(connection, path, request)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (path, code, reply)
            learner.expect("wrong secret")
    learner.check_counted_and_trained(steps)
    # The actor first: calls reaching a learner as it exits hold it up to their 30 s deadline.
    learner.actor.kill()
    learner.actor.wait()
    os.kill(learner.process.pid, signal.SIGINT)
    learner.processes.wait(learner.process, 120)
    with open(os.path.join(learner.run_dir, "learner_0.json")) as f:
        summary = json.load(f)
    print("\n" + "\n".join(f"[attacks] {name}: {text}" for name, text in FIGURES.items()))
    refused = {reason: n for reason, n in summary["refused_calls"].items() if n}
    assert refused == dict(+learner.counted_low), (refused, learner.counted_low)
    assert summary["steps"] >= steps > 0
    # Only the real actor's trajectories and the one chunk taken from the attacker (the queue
    # is first in, first out, and held one batch) were trained on; no fake episode counted.
    by_actor = summary["trajectories_by_actor"]
    assert set(by_actor) <= {str(ACTOR_TASK), str(ATTACKER_TASK)}, by_actor
    assert by_actor.get(str(ATTACKER_TASK), 0) == learner.accepted, by_actor
    assert summary["mean_return"] == summary["best_mean_return"] == EPISODE_RETURN
