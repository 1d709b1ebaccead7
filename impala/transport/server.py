"""The learner's side of the transport: `LearnerService`, a gRPC server over its trajectory store.

A new transport is a new server and client pair implementing the same methods (see the package
docstring).
"""

from __future__ import annotations

import collections
import errno
import hmac
import logging
import socket
import threading
import time
from concurrent import futures
from typing import Any, NamedTuple

import grpc
import numpy as np
import tensorflow as tf

from impala import configs, run_identity, run_secret
from impala.learner.store import FifoStore, TrajectoryStore
from impala.trajectory import (
    MAX_ABS_CORE_STATE,
    MAX_ABS_EPISODE_RETURN,
    MAX_ABS_POLICY_LOGIT,
    MAX_ABS_REWARD,
    Steps,
)
from impala.transport import wire
from impala.transport.wire import (
    ACCEPTED,
    FINISHED,
    FINISHED_VERSION,
    NO_WEIGHTS_VERSION,
    QUEUE_FULL,
    REFUSAL_REASONS,
    REFUSED,
    STATUS,
    UNKNOWN_ACTOR,
    VERSION,
    ProtocolError,
    UnrollSpec,
)

# An actor that has not asked for room for this long has stopped waiting (it sent, died or
# restarted): room no longer waits for it. Longer than an actor's longest pause between asks.
ROOM_ASKING_SECS = 1.0
# Threads that run calls, and calls under way at once (more are answered RESOURCE_EXHAUSTED at
# once, and an actor tries again): with `MAX_MESSAGE_BYTES` per call, the bytes that calls can
# hold on a learner are bounded by about 128 x 3 MiB, whatever callers do.
SERVER_THREADS = 8
MAX_CONCURRENT_CALLS = 128
# Streams one connection may hold open at once (an actor has one per chunk in flight).
MAX_STREAMS_PER_CONNECTION = 32
# The most actor tasks a learner keeps track of, and episodes waiting for the learner to read
# them; episodes are also accepted at most at this rate (a burst of the waiting bound), so that
# no caller makes the learner's bookkeeping stall it.
MAX_ACTOR_TASKS = 1 << 16
MAX_WAITING_EPISODES = 10_000
MAX_EPISODES_PER_SEC = 2_000.0
# A host's refused calls are logged one by one up to this many a minute, then summed up.
LOGGED_REFUSALS_PER_MINUTE = 5

_log = logging.getLogger(__name__)


class QueuedTrajectories(NamedTuple):
    """A batch dequeued by the learner, time-major like `learner.Batch`.

    Attributes:
      actor_task: [B] int32 task index of the actor each trajectory came from.
      weight_version: [B] int64 version of the weights that generated it.
      agent_state: flattened core state, list of [B, ...].
      steps: the time steps, [T + 1, B, ...] tensors.
    """

    actor_task: tf.Tensor
    weight_version: tf.Tensor
    agent_state: list[tf.Tensor]
    steps: Steps


class EpisodeBatch(NamedTuple):
    """Episodes reported by actors: [K] arrays of real game returns, agent steps, frames and
    the frames each game began with (`envs.EpisodeStats.start_frames`, -1 where none)."""

    actor_task: np.ndarray
    episode_return: np.ndarray
    episode_steps: np.ndarray
    episode_frames: np.ndarray
    start_frames: np.ndarray


# Refusal reasons, by index into the service's counters.
(
    _WRONG_SECRET,
    _NOT_OUR_TASK,
    _MALFORMED,
    _ACTION_OUT_OF_RANGE,
    _NON_FINITE,
    _NEGATIVE_VERSION,
    _OUT_OF_BOUNDS,
    _TOO_MANY_EPISODES,
) = range(len(REFUSAL_REASONS))


class _RefusedError(Exception):
    """A request refused for `REFUSAL_REASONS[reason]`."""

    def __init__(self, reason: int):
        super().__init__(REFUSAL_REASONS[reason])
        self.reason = reason


class LearnerService:
    """The learner's side: a trajectory store and a weight snapshot, served over gRPC.

    Trajectories go into a `TrajectoryStore` (`impala/learner/store.py`): a bounded FIFO queue
    by default. A replay scheme is a new `TrajectoryStore` in that file, passed as `store`.

    A call is authenticated before anything else (`_Authenticator`): without the run secret it
    ends UNAUTHENTICATED, its request unread. Every request is then checked against the layout
    in `wire.py` by its length before a field is read, and what it would queue or record is
    checked (`_trajectory_problem`, `_episodes_problem`), so that nothing an actor sends can stop
    the learner. Each refused call is counted by reason (`refusals`).
    """

    def __init__(
        self,
        address: str,
        spec: UnrollSpec,
        identity: dict[str, Any],
        variables: list[tf.Variable],
        learner_index: int,
        num_learners: int,
        queue_capacity: int | None = None,
        *,
        secret: str,
        store: TrajectoryStore | None = None,
        tls=None,
    ):
        """Starts serving at `address` ("host:port").

        Args:
          address: where to listen: the address of this host that actors reach it on
            ("0.0.0.0:port" listens on every interface).
          spec: trajectory shapes.
          identity: settings that an actor must share with this learner (environment, network,
            unroll length...), compared field by field when an actor connects.
          variables: the weights actors fetch, in a fixed order.
          learner_index: this learner's index; actor task i belongs to learner i % num_learners.
          num_learners: the number of learners.
          queue_capacity: trajectories the queue holds before actors wait for room,
            for a `FifoStore` (see there) made here; give either this or `store`.
          secret: the run secret (`run_secret.LENGTH` hexadecimal digits) every call carries.
          store: where trajectories wait for the learner; its `capacity` is `queue_capacity`.
          tls: the run's TLS material (`impala.run_tls.Material`), or None for plain TCP.

        Raises:
          ValueError: `address` is malformed or cannot be listened on (another process holds
            the port, or it is not an address of this host), or `secret` is not a secret.
        """
        if (queue_capacity is None) == (store is None):
            raise ValueError(
                "LearnerService needs either queue_capacity (for a FIFO queue) or a store, "
                f"not both or neither: got queue_capacity={queue_capacity}, store={store}"
            )
        if len(secret) != run_secret.LENGTH:
            raise ValueError(f"a run secret has {run_secret.LENGTH} characters, not {len(secret)}")
        check_listening_address(address)
        self.spec = spec
        self._identity = run_identity.encode(identity)
        self._variables = list(variables)
        self._learner_index = learner_index
        self._num_learners = num_learners
        self._store = store if store is not None else FifoStore(spec.queue_specs(), queue_capacity)
        self._admit = tf.function(self._admit_chunk, input_signature=_chunk_signature(spec))
        self._lock = threading.Lock()
        self._refusals = [0] * len(REFUSAL_REASONS)
        # Welcomes per actor task: more than one is an actor that came back (restarted, or
        # reconnected after losing this learner).
        self._welcomes: dict[int, int] = {}
        # Actor task -> [when its wait for room began, when it last asked], while it waits.
        self._room_asks: dict[int, tuple[float, float]] = {}
        self._episodes: list[tuple] = []
        self._waiting_episodes = 0
        self._episode_tokens = _TokenBucket(MAX_EPISODES_PER_SEC, MAX_WAITING_EPISODES)
        self._received = 0
        self._finished = False
        # The reply to `Weights`: the version, then the weights (see `publish_weights`).
        self._weights_reply = VERSION.pack(NO_WEIGHTS_VERSION)
        self._authenticator = _Authenticator(secret, self._count_wrong_secret)
        self._server = self._serve(address, tls)

    # ---- The learner's side ------------------------------------------------------------------

    @property
    def queue_size(self) -> int:
        return int(self._store.size())

    @property
    def queue_capacity(self) -> int:
        return self._store.capacity

    @property
    def refusals(self) -> dict[str, int]:
        """Calls refused since this learner started, by reason (`wire.REFUSAL_REASONS`)."""
        with self._lock:
            return dict(zip(REFUSAL_REASONS, self._refusals, strict=True))

    @property
    def refusing_hosts(self) -> dict[str, int]:
        """Calls refused for the secret since this learner started, by the caller's host."""
        return self._authenticator.by_host()

    @property
    def connections(self) -> dict[int, int]:
        """How many times each actor task has connected since this learner started."""
        with self._lock:
            return dict(self._welcomes)

    @property
    def trajectories_received(self) -> int:
        """Trajectories actors have put into the queue since this learner started."""
        return self._received

    def publish_weights(self, version: int) -> None:
        """Makes the current variable values available to actors as `version`."""
        flat = _flat_weights(self._variables).numpy() if self._variables else np.zeros(0)
        self._weights_reply = VERSION.pack(version) + flat.astype("<f4").tobytes()

    def dequeue(self, batch_size: int) -> QueuedTrajectories:
        """Blocks until `batch_size` trajectories are queued and returns them, time-major."""
        return self._dequeue(tf.constant(batch_size))

    def pop_episodes(self) -> EpisodeBatch:
        """Episodes reported since the last call (never blocks)."""
        with self._lock:
            episodes, self._episodes, self._waiting_episodes = self._episodes, [], 0
        fields = zip(*episodes, strict=True) if episodes else [[e] for e in _EMPTY_EPISODES]
        return EpisodeBatch(
            *(
                np.concatenate(field).astype(empty.dtype)
                for field, empty in zip(fields, _EMPTY_EPISODES, strict=True)
            )
        )

    def close(self, linger_secs: float = 0.0) -> None:
        """Tells actors that training is over and stops accepting trajectories.

        Args:
          linger_secs: keep answering for this long, so that every actor hears that the learner
            finished (on its next call) rather than finding it gone.
        """
        self._finished = True
        self._store.close()
        time.sleep(linger_secs)

    def stop(self) -> None:
        """Stops serving: calls under way end, and the port is free again."""
        self._finished = True
        self._server.stop(grace=None).wait()

    # ---- Serving ---------------------------------------------------------------------------

    def _serve(self, address: str, tls) -> grpc.Server:
        handlers = {
            wire.method_path("Hello"): self._hello,
            wire.method_path("Room"): self._room,
            wire.method_path("Enqueue"): self._enqueue,
            wire.method_path("ReportEpisodes"): self._report_episodes,
            wire.method_path("WeightsVersion"): self._weights_version,
            wire.method_path("Weights"): self._weights,
        }
        server = grpc.server(
            futures.ThreadPoolExecutor(SERVER_THREADS, thread_name_prefix="learner-rpc"),
            handlers=[_Methods(self._authenticator, handlers)],
            maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
            options=[
                # The largest request is a full `Enqueue` chunk: gRPC refuses larger ones
                # (RESOURCE_EXHAUSTED) before any of it reaches this process's Python.
                ("grpc.max_receive_message_length", self.spec.max_enqueue_bytes),
                ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
                # gRPC lets a second server share a port (SO_REUSEPORT) by default: refuse that.
                ("grpc.so_reuseport", 0),
                # Receive windows that grow by bandwidth probing let each connection make the
                # learner buffer megabytes of requests it will refuse: a stranger opening many
                # connections grew it by gigabytes (tests/e2e/test_attacks.py).
                ("grpc.http2.bdp_probe", 0),
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
        return server

    def _count(self, reason: int) -> None:
        with self._lock:
            self._refusals[reason] += 1

    def _count_wrong_secret(self) -> None:
        self._count(_WRONG_SECRET)

    def _owns(self, actor_task: int) -> bool:
        return actor_task >= 0 and actor_task % self._num_learners == self._learner_index

    # ---- Methods: run on the server's threads, after the secret was checked --------------------

    def _hello(self, request: bytes, context) -> bytes:
        """'' if the actor may connect, else the reason it may not."""
        actor_task, identity = wire.decode_hello(request)
        if not self._owns(actor_task):
            owner = actor_task % self._num_learners
            return (
                f"actor task {actor_task} belongs to learner {owner} (task mod "
                f"{self._num_learners} learners), not to learner {self._learner_index}"
            ).encode()
        if identity is None or run_identity.encode(identity) != self._identity:
            return ("MISMATCH:" + self._identity).encode()
        with self._lock:
            if actor_task not in self._welcomes and len(self._welcomes) >= MAX_ACTOR_TASKS:
                return f"this learner serves {MAX_ACTOR_TASKS} actor tasks already".encode()
            self._welcomes[actor_task] = self._welcomes.get(actor_task, 0) + 1
        return b""

    def _room(self, request: bytes, context) -> bytes:
        """Whether the actor may send a chunk now: ACCEPTED, QUEUE_FULL or FINISHED.

        Actors ask before sending an unroll: sent to a full store, its megabytes would travel
        and be checked only to be refused. Room goes to the actor that began waiting first
        among those still asking: answered by who asks first, an actor that asks less often (it
        pauses longer after a long wait) lost most races, waited longer still, and sent unrolls
        that sat acting-to-learning for many batches.
        """
        (actor_task,) = wire.unpack_exact(wire.TASK, request, "Room")
        if self._finished:
            return STATUS.pack(FINISHED)
        # An actor of another learner takes no place in line: refused at `Enqueue`.
        served = self._serve_in_line(actor_task) if self._owns(actor_task) else self._has_room()
        return STATUS.pack(ACCEPTED if served else QUEUE_FULL)

    def _serve_in_line(self, actor_task: int) -> bool:
        """Records that `actor_task` asks for room; whether the store has room and no actor
        still asking has waited longer.

        Served, the actor keeps its place until its unroll arrives (`_enqueue` ends its wait)
        or it stops asking: another actor given the same room in between would send its
        megabytes only to meet a full store, or take the room from the actor that waited.
        """
        now = time.monotonic()
        with self._lock:
            began, last_asked = self._room_asks.get(actor_task, (-np.inf, -np.inf))
            if last_asked < now - ROOM_ASKING_SECS:
                began = now
            self._room_asks = {
                task: asked
                for task, asked in self._room_asks.items()
                if asked[1] >= now - ROOM_ASKING_SECS
            }
            if actor_task in self._welcomes or len(self._room_asks) < MAX_ACTOR_TASKS:
                self._room_asks[actor_task] = (began, now)
            first = began <= min(asked[0] for asked in self._room_asks.values())
        return first and self._has_room()

    def _has_room(self) -> bool:
        return bool(self._store.has_room())

    def _enqueue(self, request: bytes, context) -> bytes:
        """Queues the trajectories of one chunk (`wire.py` has the layout)."""
        actor_task, weight_version, _ = wire.enqueue_header(request)
        if self._owns(actor_task):
            with self._lock:
                welcomed = actor_task in self._welcomes
                # Whatever the answer, this actor no longer waits for room.
                self._room_asks.pop(actor_task, None)
            if not welcomed:
                # Only from a task of ours that said hello to this learner: after a restart
                # gRPC reconnects an actor on its own, unchecked by this learner. Asked before
                # the other checks, so that such an actor hears of a changed spec from the
                # hello it is sent back to (not as one refused chunk after another).
                return STATUS.pack(UNKNOWN_ACTOR)
        if self._finished:
            return STATUS.pack(FINISHED)
        # Never block a server thread on a full store: it refuses the chunk, read no further
        # than its header, and the actor asks for room again.
        if not self._has_room():
            return STATUS.pack(QUEUE_FULL)
        try:
            if not self._owns(actor_task):
                raise _RefusedError(_NOT_OUR_TASK)
            try:
                steps, agent_state = wire.decode_enqueue(self.spec, request)
            except ProtocolError:
                raise _RefusedError(_MALFORMED) from None
            self._check_trajectories(weight_version, steps, agent_state)
        except _RefusedError as refused:
            self._count(refused.reason)
            return STATUS.pack(REFUSED)
        count = steps.prev_action.shape[1]
        steps = steps._replace(done=steps.done.view(bool))
        admitted = self._admit(
            np.full([count], actor_task, np.int32),
            np.full([count], weight_version, np.int64),
            *steps,
            *agent_state,
        )
        if not bool(admitted):
            return STATUS.pack(QUEUE_FULL)
        with self._lock:
            self._received += count
        return STATUS.pack(ACCEPTED)

    def _check_trajectories(self, weight_version: int, steps: Steps, agent_state) -> None:
        """Raises `_RefusedError` with the first reason to refuse these trajectories.

        The layout fixed their shapes; this checks what it cannot: the actions' range, `done`
        flags that are booleans, finite numbers within the bounds the loss needs
        (`impala/trajectory.py` says why each) and a weight version.
        """
        spec = self.spec
        for actions in (steps.action, steps.prev_action):
            if actions.size and (actions.min() < 0 or actions.max() >= spec.num_actions):
                raise _RefusedError(_ACTION_OUT_OF_RANGE)
        if steps.done.size and steps.done.max() > 1:
            raise _RefusedError(_MALFORMED)
        bounded = [(steps.reward, MAX_ABS_REWARD), (steps.policy_logits, MAX_ABS_POLICY_LOGIT)]
        bounded += [(s, MAX_ABS_CORE_STATE) for s in agent_state if s.dtype.kind == "f"]
        if spec.observation_dtype.startswith("float"):
            bounded.append((steps.observation, np.inf))
        for values, bound in bounded:
            if not np.isfinite(values).all():
                raise _RefusedError(_NON_FINITE)
            if values.size and np.abs(values).max() > bound:
                raise _RefusedError(_OUT_OF_BOUNDS)
        if weight_version < 0:
            raise _RefusedError(_NEGATIVE_VERSION)

    def _admit_chunk(self, actor_task, weight_version, *fields):
        steps = Steps(*fields[: len(Steps._fields)])
        agent_state = list(fields[len(Steps._fields) :])
        return self._store.admit(
            [actor_task, weight_version, *map(_swap_leading_axes, steps), *agent_state]
        )

    def _report_episodes(self, request: bytes, context) -> bytes:
        """Records finished episodes' returns, agent steps, frames and start frames."""
        if self._finished:
            return STATUS.pack(FINISHED)
        try:
            try:
                actor_task, fields = wire.decode_episodes(request)
            except ProtocolError:
                raise _RefusedError(_MALFORMED) from None
            if not self._owns(actor_task):
                raise _RefusedError(_NOT_OUR_TASK)
            returns, steps, frames, start_frames = fields
            if (steps < 0).any() or (frames < 0).any() or (start_frames < -1).any():
                raise _RefusedError(_MALFORMED)
            if not np.isfinite(returns).all():
                raise _RefusedError(_NON_FINITE)
            if np.abs(returns).max() > MAX_ABS_EPISODE_RETURN:
                raise _RefusedError(_OUT_OF_BOUNDS)
            count = len(returns)
            with self._lock:
                if self._waiting_episodes + count > MAX_WAITING_EPISODES:
                    raise _RefusedError(_TOO_MANY_EPISODES)
                if not self._episode_tokens.take(count):
                    raise _RefusedError(_TOO_MANY_EPISODES)
                task = np.full(count, actor_task, np.int32)
                self._episodes.append((task, returns, steps, frames, start_frames))
                self._waiting_episodes += count
        except _RefusedError as refused:
            self._count(refused.reason)
            return STATUS.pack(REFUSED)
        return STATUS.pack(ACCEPTED)

    def _weights_version(self, request: bytes, context) -> bytes:
        if request:
            raise ProtocolError(f"WeightsVersion of {len(request)} bytes")
        return self._weights_reply[: VERSION.size] if not self._finished else _FINISHED_REPLY

    def _weights(self, request: bytes, context) -> bytes:
        """The version, and the weights unless the caller holds that version or it is < 0."""
        (held,) = wire.unpack_exact(VERSION, request, "Weights")
        if self._finished:
            return _FINISHED_REPLY
        reply = self._weights_reply  # one read: the version and the weights it names
        (version,) = VERSION.unpack_from(reply)
        return reply[: VERSION.size] if version in (held, NO_WEIGHTS_VERSION) else reply

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def _dequeue(self, batch_size):
        actor_task, weight_version, *fields = self._store.take(batch_size)
        steps = Steps(*fields[: len(Steps._fields)])
        return QueuedTrajectories(
            actor_task,
            weight_version,
            agent_state=list(fields[len(Steps._fields) :]),
            steps=Steps(*map(_swap_leading_axes, steps)),
        )


class _Methods(grpc.GenericRpcHandler):
    """Finds a call's handler once its secret passed; a call without it gets one that ends it
    UNAUTHENTICATED without reading its request, whatever method it names."""

    def __init__(self, authenticator: _Authenticator, behaviours: dict):
        self._authenticator = authenticator
        self._handlers = {
            path: grpc.unary_unary_rpc_method_handler(_answering(behaviour))
            for path, behaviour in behaviours.items()
        }

    def service(self, handler_call_details):
        if not self._authenticator.admits(handler_call_details.invocation_metadata):
            return self._authenticator.refusal
        # None: gRPC answers UNIMPLEMENTED (to a caller with the secret only).
        return self._handlers.get(handler_call_details.method)


def _answering(behaviour):
    """`behaviour`, with a request that breaks its layout ended INVALID_ARGUMENT."""

    def answer(request: bytes, context) -> bytes:
        try:
            return behaviour(request, context)
        except ProtocolError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {error}")

    return answer


class _Authenticator:
    """Checks the run secret in a call's metadata, before any handler runs or reads a byte.

    A call is admitted only if its metadata holds the key `wire.SECRET_KEY` exactly once, with
    the secret as its value, compared in time independent of where they differ. Refusals are
    counted, by host too, and logged one by one up to `LOGGED_REFUSALS_PER_MINUTE` a host, then
    summed up once a minute: a stranger calling in a loop cannot fill the learner's log.
    """

    def __init__(self, secret: str, count):
        self._secret = secret.encode()
        self._count = count
        self._lock = threading.Lock()
        self._by_host: collections.Counter[str] = collections.Counter()
        self._logged: dict[str, tuple[float, int]] = {}
        # A stream handler, so that gRPC does not wait for (or keep) the request to run it.
        self.refusal = grpc.stream_unary_rpc_method_handler(self._refuse)

    def admits(self, metadata) -> bool:
        given = [value for key, value in metadata or () if key == wire.SECRET_KEY]
        if len(given) != 1 or not isinstance(given[0], str):
            return False
        try:
            value = given[0].encode("ascii")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(value, self._secret)

    def by_host(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_host)

    def _refuse(self, request_iterator, context):
        self._count()
        host = _host_of(context.peer())
        now = time.monotonic()
        with self._lock:
            self._by_host[host] += 1
            if len(self._by_host) > MAX_ACTOR_TASKS:  # a bound, should hosts be spoofed
                self._by_host = collections.Counter(dict(self._by_host.most_common(1024)))
            since, logged = self._logged.get(host, (now, 0))
            if now - since > 60:
                if logged > LOGGED_REFUSALS_PER_MINUTE:
                    _log.warning(
                        "refused %d calls without the run secret from %s in the last minute",
                        logged,
                        host,
                    )
                since, logged = now, 0
            self._logged[host] = (since, logged + 1)
        if logged < LOGGED_REFUSALS_PER_MINUTE:
            _log.warning("refused a call without the run secret from %s", host)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "run secret refused")


class _TokenBucket:
    """Allows `rate` units a second, in bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float):
        self._rate, self._burst = rate, burst
        self._tokens, self._when = burst, time.monotonic()

    def take(self, units: float) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._when) * self._rate)
        self._when = now
        if units > self._tokens:
            return False
        self._tokens -= units
        return True


def _host_of(peer: str) -> str:
    """'ipv4:10.0.0.2:5000' -> 'ipv4:10.0.0.2'; '[...]' IPv6 likewise."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def _chunk_signature(spec: UnrollSpec) -> list[tf.TensorSpec]:
    """The arguments of `_admit_chunk`: the actor task and weight version of each of `n`
    trajectories, the `Steps` fields [T + 1, n, ...], the core state [n, ...]."""
    _, _, *steps_and_state = spec.queue_specs()
    num_steps = len(Steps._fields)
    return [
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None], tf.int64),
        *(
            tf.TensorSpec([s.shape[0], None, *s.shape[1:]], s.dtype)
            for s in steps_and_state[:num_steps]
        ),
        *(tf.TensorSpec([None, *s.shape], s.dtype) for s in steps_and_state[num_steps:]),
    ]


@tf.function
def _flat_weights(variables):
    return tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in variables], 0)


def _swap_leading_axes(tensor: tf.Tensor) -> tf.Tensor:
    """[T, B, ...] <-> [B, T, ...]."""
    return tf.transpose(tensor, [1, 0, *range(2, len(tensor.shape))])


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


_FINISHED_REPLY = VERSION.pack(FINISHED_VERSION)
_EMPTY_EPISODES = (
    np.zeros([0], np.int32),
    np.zeros([0], np.float32),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
)
