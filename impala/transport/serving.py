"""The gRPC server a learner's service runs: where it listens, its caps, and how a call finds
its handler (only once its run secret passed, `authentication.py`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures

import grpc

from impala import configs
from impala.transport.authentication import Authenticator
from impala.transport.wire import ProtocolError

# Threads that run calls, and calls under way at once (more are answered RESOURCE_EXHAUSTED at
# once, and an actor tries again): with `MAX_MESSAGE_BYTES` per call, the bytes that requests
# can hold on a learner are bounded by about 128 x 3 MiB, whatever callers do. A call's place
# is free once its handler returns, while gRPC holds its reply until the caller reads it: the
# replies are bounded by `ReplyBudget`.
SERVER_THREADS = 8
MAX_CONCURRENT_CALLS = 128
# Bytes of replies that callers have not read yet, at most, each reply counted with
# `CALL_BYTES` more for the call gRPC keeps open: a call that comes when they are at it ends
# RESOURCE_EXHAUSTED before it does anything, and an actor tries again. Without it a caller with
# the secret that never reads (its HTTP/2 window shut) made a learner hold 4 MiB of weights per
# call, 773 MiB for 192 calls, until it hung up; an unread call of a few bytes held about
# 21 KiB, up to 1,024 connections x 32 streams of them. (The calls admitted while it was below
# may pass it by their replies: by `SERVER_THREADS` replies at most.)
MAX_REPLY_BYTES_OUT = 256 << 20
CALL_BYTES = 32 << 10
# A reply still unread this long after it was made is cancelled when a call finds the budget
# full: the calls of actors and of other policies' learners have given up by then (deadlines
# of 30 s, and of 90 s for a PBT state, most of which is the wait before the reply).
REPLY_DELIVERY_SECS = 60.0
# How a call refused for room ends (RESOURCE_EXHAUSTED), so that a client tells it from a
# message too large, which trying again cannot mend.
BUSY_DETAILS = "replies wait to be read; try again"
# Streams one connection may hold open at once (an actor has one per chunk in flight).
MAX_STREAMS_PER_CONNECTION = 32
# Connections open at once, at most half the process's open-file limit (`connection_cap`),
# which a server raises to its hard limit first: gRPC closes any past the cap as it accepts
# them, so a stranger who opens connections and leaves them idle can keep new callers out but
# cannot take the files a learner writes its checkpoints and summaries to (uncapped, idle
# connections could take them all). gRPC keeps a cap per address it listens on (a name may
# resolve to an IPv4 and an IPv6 one): the cap is shared between them.
MAX_CONNECTIONS = 1024
# A connection with no call under way this long is closed (a client connects again at its next
# call), and one that has not finished its TLS or HTTP/2 handshake this long after it opened.
IDLE_CONNECTION_MS = 60_000
HANDSHAKE_MS = 20_000

_log = logging.getLogger(__name__)

# A method's behaviour: the request's bytes and the gRPC context -> the reply's bytes.
Behaviour = Callable[[bytes, grpc.ServicerContext], bytes]


def serve(
    address: str,
    behaviours: Mapping[str, Behaviour],
    authenticator: Authenticator,
    max_request_bytes: int,
    tls=None,
    replies: ReplyBudget | None = None,
) -> grpc.Server:
    """Starts a gRPC server at `address` ("host:port") answering `behaviours` (method path ->
    behaviour) to calls that `authenticator` admits.

    Args:
      address: where to listen.
      behaviours: each method's behaviour; a request that breaks its method's layout
        (`ProtocolError`) ends INVALID_ARGUMENT.
      authenticator: checks each call's secret before its handler is looked up.
      max_request_bytes: the largest request gRPC accepts (larger ones end RESOURCE_EXHAUSTED
        before any of it reaches this process's Python).
      tls: the run's TLS material (`impala.run_tls.Material`), or None for plain TCP.
      replies: where the replies not yet read are counted (a new `ReplyBudget` if None).

    Raises:
      ValueError: the server cannot listen at `address`.
    """
    _raise_open_file_limit()
    listeners = len(listening_addresses(address))
    cap = connection_cap(listeners)
    server = grpc.server(
        futures.ThreadPoolExecutor(SERVER_THREADS, thread_name_prefix="learner-rpc"),
        handlers=[_Methods(authenticator, behaviours, replies or ReplyBudget())],
        maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
        options=[
            # The largest request is a full `Enqueue` chunk: gRPC refuses larger ones
            # (RESOURCE_EXHAUSTED) before any of it reaches this process's Python.
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            # gRPC lets a second server share a port (SO_REUSEPORT) by default: refuse that.
            ("grpc.so_reuseport", 0),
            # Receive windows that grow by bandwidth probing let each connection make the
            # learner buffer megabytes of requests it will refuse: a stranger opening many
            # connections grew it by gigabytes (tests/e2e/test_attacks.py).
            ("grpc.http2.bdp_probe", 0),
            ("grpc.max_allowed_incoming_connections", cap),
            ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_MS),
        ],
    )
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        from impala import run_tls

        bound = server.add_secure_port(address, run_tls.server_credentials(tls))
    if not bound:
        raise ValueError(f"cannot listen at {address}")
    server.start()
    _log.info(
        "serving at %s: at most %d connections at once",
        address,
        cap * listeners,
    )
    return server


class ReplyBudget:
    """The calls a server has admitted whose replies their callers have not read yet, within
    `MAX_REPLY_BYTES_OUT`; each leaves when its call ends (read, failed or cancelled).

    A call is admitted before its method runs, so that one refused has done nothing (a chunk
    refused after it was queued would be queued again when the actor tries again).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._max_bytes, self._deadline_secs = MAX_REPLY_BYTES_OUT, REPLY_DELIVERY_SECS
        self._clock = clock
        self._lock = threading.Lock()
        self._keys = itertools.count()
        # Each call's context, bytes counted, and when its reply was made (None: not yet).
        self._out: dict[int, list] = {}
        self._bytes_out = 0
        self.refused = 0  # calls ended RESOURCE_EXHAUSTED for want of room
        self.cancelled = 0  # replies cancelled unread after `REPLY_DELIVERY_SECS`

    @property
    def bytes_out(self) -> int:
        """The bytes counted for the calls whose replies are not read yet."""
        return self._bytes_out

    def admit(self, context: grpc.ServicerContext) -> int:
        """Counts a call about to run (`CALL_BYTES`) until it ends; returns its key for
        `replied`. Ends the call RESOURCE_EXHAUSTED (raises, through `context.abort`) when the
        replies not read yet fill the budget, even after those unread too long are cancelled."""
        with self._lock:
            room = self._bytes_out + CALL_BYTES <= self._max_bytes
        if not room:
            self._cancel_late()
        with self._lock:
            room = self._bytes_out + CALL_BYTES <= self._max_bytes
            if room:
                key = next(self._keys)
                self._out[key] = [context, CALL_BYTES, None]
                self._bytes_out += CALL_BYTES
            else:
                self.refused += 1
                held = self._bytes_out
        if not room:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{BUSY_DETAILS} ({held} bytes)")
        if not context.add_callback(lambda: self._release(key)):
            self._release(key)  # the call has ended already
        return key

    def replied(self, key: int, reply: bytes) -> bytes:
        """Counts the call's `reply` too, from now."""
        with self._lock:
            entry = self._out.get(key)
            if entry is not None:
                entry[1] += len(reply)
                entry[2] = self._clock()
                self._bytes_out += len(reply)
        return reply

    def _cancel_late(self) -> None:
        now = self._clock()
        with self._lock:
            late = [
                key
                for key, (_, _, made) in self._out.items()
                if made is not None and now - made > self._deadline_secs
            ]
            contexts = [self._out[key][0] for key in late]
            for key in late:
                self._drop(key)
            self.cancelled += len(late)
        for context in contexts:
            with contextlib.suppress(Exception):  # a call that ended meanwhile
                context.cancel()  # gRPC frees the reply; its callback finds it gone
        if late:
            _log.warning("cancelled %d replies left unread for %gs", len(late), self._deadline_secs)

    def _release(self, key: int) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: int) -> None:
        """Under the lock."""
        entry = self._out.pop(key, None)
        if entry is not None:
            self._bytes_out -= entry[1]


def connection_cap(listeners: int = 1) -> int:
    """The connections a server of this process accepts at once on each of its `listeners`
    addresses: `MAX_CONNECTIONS` in all, or half the process's open-file limit where that is
    less, so the other half stays the process's own."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    total = MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else min(MAX_CONNECTIONS, soft // 2)
    return max(1, total // max(1, listeners))


def listening_addresses(address: str) -> set:
    """The socket addresses gRPC listens on for `address` ("host:port"), one per address its
    host resolves to (at least one counted)."""
    host, port = configs.parse_address(address, "learner address")
    try:
        return {info[4] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except socket.gaierror:
        return {address}


def _raise_open_file_limit() -> None:
    """Raises this process's soft limit of open files to its hard limit (64k at most), as far
    as the system lets it: more room for the connections' cap and the learner's own files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


class _Methods(grpc.GenericRpcHandler):
    """Finds a call's handler once its secret passed; a call without it gets one that ends it
    UNAUTHENTICATED without reading its request, whatever method it names."""

    def __init__(
        self,
        authenticator: Authenticator,
        behaviours: Mapping[str, Behaviour],
        replies: ReplyBudget,
    ):
        self._authenticator = authenticator
        self._handlers = {
            path: grpc.unary_unary_rpc_method_handler(_answering(behaviour, replies))
            for path, behaviour in behaviours.items()
        }

    def service(self, handler_call_details):
        if not self._authenticator.admits(handler_call_details.invocation_metadata):
            return self._authenticator.refusal
        # None: gRPC answers UNIMPLEMENTED (to a caller with the secret only).
        return self._handlers.get(handler_call_details.method)


def _answering(behaviour: Behaviour, replies: ReplyBudget):
    """`behaviour`, with a request that breaks its layout ended INVALID_ARGUMENT, and its reply
    counted in `replies` until it is read."""

    def answer(request: bytes, context) -> bytes:
        key = replies.admit(context)
        try:
            reply = behaviour(request, context)
        except ProtocolError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {error}")
        return replies.replied(key, reply)

    return answer


def check_listening_address(address: str) -> None:
    """Raises a one-line error unless a server can listen at `address` ("host:port") now.

    gRPC's own bind failures say little, and by default it lets a second server share a port
    (SO_REUSEPORT): so binding is tried here first, without sharing.
    """
    host, port = configs.parse_address(address, "learner address")
    try:
        candidates = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(
            f"cannot listen at {address}: {host} does not resolve ({error.strerror})"
        ) from None
    failures = []
    for family, kind, proto, _, sockaddr in candidates:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
            try:
                probe.bind(sockaddr)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise ValueError(
                        f"cannot listen at {address}: port {port} is in use by another process"
                    ) from None
                failures.append(f"{sockaddr[0]}: {error.strerror}")
    # A name with an IPv6 address on a host without IPv6 still has its IPv4 one.
    if len(failures) == len(candidates):
        raise ValueError(
            f"cannot listen at {address} ({'; '.join(failures)}): is {host} an address of "
            "this host?"
        )
