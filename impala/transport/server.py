"""The learner's side of the transport: `LearnerService`, an RPC server over its trajectory store.

A new transport is a new server and client pair implementing the same methods (see the package
docstring).
"""

from __future__ import annotations

import errno
import socket
import time
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from impala import configs, run_identity, run_secret
from impala.learner.store import FifoStore, TrajectoryStore
from impala.trajectory import Steps
from impala.transport.wire import (
    _FINISHED_VERSION,
    _UNAUTHORIZED_HELLO,
    _UNAUTHORIZED_VERSION,
    _VERSION_DIGITS,
    ACCEPTED,
    FINISHED,
    QUEUE_FULL,
    REFUSAL_REASONS,
    REFUSED,
    UNAUTHORIZED,
    UNKNOWN_ACTOR,
    UnrollSpec,
    _split_steps,
    _swap_leading_axes,
)

_rpc = tf.distribute.experimental.rpc

# An actor that has not asked for room for this long has stopped waiting (it sent, died or
# restarted): room no longer waits for it. Longer than an actor's longest pause between asks.
ROOM_ASKING_SECS = 1.0


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
) = range(len(REFUSAL_REASONS))


class LearnerService:
    """The learner's side: a trajectory store and a weight snapshot, served over RPC.

    Trajectories go into a `TrajectoryStore` (`impala/learner/store.py`): a bounded FIFO queue
    by default. A replay scheme is a new `TrajectoryStore` in that file, passed as `store`.

    Every method takes the run secret first and does nothing for a caller without it (see
    `impala/run_secret.py`): it hands out no weights, queues nothing, records no episode. What
    it queues is checked first (`_trajectory_problem`), so that nothing an actor sends can stop
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
        self._secret = tf.constant(np.frombuffer(secret.encode(), np.uint8))
        self._refusals = tf.Variable(tf.zeros([len(REFUSAL_REASONS)], tf.int64), trainable=False)
        # Welcomes per actor task: more than one is an actor that came back (restarted, or
        # reconnected after losing this learner).
        self._welcomes = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, 0)
        # Actor task -> [when its wait for room began, when it last asked], while it waits.
        self._room_asks = tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.float64, [-np.inf, -np.inf]
        )
        self._identity = run_identity.encode(identity)
        self._variables = list(variables)
        self._learner_index = learner_index
        self._num_learners = num_learners
        self._store = store if store is not None else FifoStore(spec.queue_specs(), queue_capacity)
        self._episodes = tf.queue.FIFOQueue(
            1 << 20, [tf.int32, tf.float32, tf.int64, tf.int64, tf.int64], shapes=[[]] * 5
        )
        self._version = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self._received = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._finished = tf.Variable(False, trainable=False)
        self._snapshot = tf.Variable("", dtype=tf.string, trainable=False)
        self._server = _rpc.Server.create("grpc", address)
        self._register_methods()
        self._server.start()

    @property
    def queue_size(self) -> int:
        return int(self._store.size())

    @property
    def queue_capacity(self) -> int:
        return self._store.capacity

    @property
    def refusals(self) -> dict[str, int]:
        """Calls refused since this learner started, by reason (`wire.REFUSAL_REASONS`)."""
        return dict(zip(REFUSAL_REASONS, (int(n) for n in self._refusals.numpy()), strict=True))

    @property
    def connections(self) -> dict[int, int]:
        """How many times each actor task has connected since this learner started."""
        tasks, counts = self._welcomes.export()
        return {int(t): int(c) for t, c in zip(tasks.numpy(), counts.numpy(), strict=True)}

    @property
    def trajectories_received(self) -> int:
        """Trajectories actors have put into the queue since this learner started."""
        return int(self._received)

    def publish_weights(self, version: int) -> None:
        """Makes the current variable values available to actors as `version`."""
        self._publish(tf.constant(version, tf.int64))

    def dequeue(self, batch_size: int) -> QueuedTrajectories:
        """Blocks until `batch_size` trajectories are queued and returns them, time-major."""
        return self._dequeue(tf.constant(batch_size))

    def pop_episodes(self) -> EpisodeBatch:
        """Episodes reported since the last call (never blocks)."""
        count = int(self._episodes.size())
        fields = self._episodes.dequeue_many(count) if count else _EMPTY_EPISODES
        return EpisodeBatch(*(np.asarray(t) for t in fields))

    def close(self, linger_secs: float = 0.0) -> None:
        """Tells actors that training is over and stops accepting trajectories.

        Args:
          linger_secs: keep answering for this long, so that every actor hears that the learner
            finished (on its next call) rather than finding it gone.
        """
        self._finished.assign(True)
        self._store.close()
        self._episodes.close(cancel_pending_enqueues=True)
        time.sleep(linger_secs)

    def _register_methods(self) -> None:
        scalar = tf.TensorSpec([], tf.int32)
        secret = tf.TensorSpec([], tf.string)
        methods = {
            "hello": (self._hello, [secret, tf.TensorSpec([], tf.string), scalar]),
            "room": (self._room, [secret, scalar]),
            "enqueue": (self._enqueue, self.spec.enqueue_signature()),
            "report_episodes": (
                self._report_episodes,
                [secret, scalar]
                + [tf.TensorSpec([None], t) for t in (tf.float32, tf.int64, tf.int64, tf.int64)],
            ),
            "weights_version": (self._weights_version, [secret]),
            "weights_chunk": (self._weights_chunk, [secret] + [tf.TensorSpec([], tf.int64)] * 2),
        }
        for name, (method, signature) in methods.items():
            self._server.register(name, tf.function(method, input_signature=signature))

    # ---- RPC methods: run by the server's threads as TensorFlow functions -------------------

    def _authorized(self, secret):
        """Whether `secret` is the run's, compared in time independent of where they differ."""

        def same_bytes():
            given = tf.io.decode_raw(secret, tf.uint8)
            return tf.equal(tf.reduce_max(tf.bitwise.bitwise_xor(given, self._secret)), 0)

        # Every secret has the same length, so the length tells an attacker nothing.
        same_length = tf.equal(tf.strings.length(secret), run_secret.LENGTH)
        return tf.cond(same_length, same_bytes, lambda: tf.constant(False))

    def _refuse(self, reason, answer):
        """Counts a refusal for `reason` (a `REFUSAL_REASONS` index) and returns `answer`."""
        one = tf.one_hot(reason, len(REFUSAL_REASONS), dtype=tf.int64)
        counted = self._refusals.assign_add(one)
        with tf.control_dependencies([counted]):
            return tf.nest.map_structure(tf.identity, answer)

    def _owns(self, actor_task):
        return tf.logical_and(
            actor_task >= 0, tf.equal(actor_task % self._num_learners, self._learner_index)
        )

    def _hello(self, secret, actor_identity, actor_task):
        """Returns '' if the actor may connect, else the reason it may not."""
        return tf.cond(
            self._authorized(secret),
            lambda: self._welcome(actor_identity, actor_task),
            lambda: self._refuse(_WRONG_SECRET, tf.constant(_UNAUTHORIZED_HELLO)),
        )

    def _welcome(self, actor_identity, actor_task):
        answer = self._welcome_answer(actor_identity, actor_task)

        def count():
            task = tf.cast(actor_task, tf.int64)
            welcomes = self._welcomes.lookup(task) + 1
            with tf.control_dependencies([self._welcomes.insert(task, welcomes)]):
                return tf.identity(answer)

        return tf.cond(tf.equal(answer, ""), count, lambda: answer)

    def _welcome_answer(self, actor_identity, actor_task):
        owner = actor_task % self._num_learners
        wrong_learner = tf.strings.format(
            "actor task {} belongs to learner {} (task mod {} learners), not to learner {}",
            (actor_task, owner, self._num_learners, self._learner_index),
        )
        mismatch = tf.where(
            tf.equal(actor_identity, self._identity), "", "MISMATCH:" + self._identity
        )
        return tf.where(self._owns(actor_task), mismatch, wrong_learner)

    def _room(self, secret, actor_task):
        """Whether actor `actor_task` may send a chunk now: ACCEPTED, QUEUE_FULL or FINISHED
        (UNAUTHORIZED, and nothing else, to a caller without the secret).

        Actors ask before sending an unroll: sent to a full store, its megabytes would travel
        and be decoded and checked only to be refused. Room goes to the actor that began
        waiting first among those still asking: answered by who asks first, an actor that asks
        less often (it pauses longer after a long wait) lost most races, waited longer still,
        and sent unrolls that sat acting-to-learning for many batches.
        """

        def status():
            served = tf.cond(
                self._owns(actor_task),
                lambda: self._serve_in_line(actor_task),
                self._store.has_room,  # an actor of another learner: refused at `enqueue`
            )
            return tf.where(self._finished, FINISHED, tf.where(served, ACCEPTED, QUEUE_FULL))

        return tf.cond(
            self._authorized(secret),
            status,
            lambda: self._refuse(_WRONG_SECRET, tf.constant(UNAUTHORIZED)),
        )

    def _serve_in_line(self, actor_task):
        """Records that `actor_task` asks for room; whether the store has room and no actor
        still asking has waited longer."""
        task = tf.cast(actor_task, tf.int64)
        now = tf.timestamp()
        asked = tf.reshape(self._room_asks.lookup(task), [2])
        began, last_asked = asked[0], asked[1]
        began = tf.where(last_asked < now - ROOM_ASKING_SECS, now, began)
        with tf.control_dependencies([self._room_asks.insert(task, tf.stack([began, now]))]):
            _, asks = self._room_asks.export()
        asks = tf.reshape(asks, [-1, 2])
        asking = asks[:, 1] >= now - ROOM_ASKING_SECS
        first = began <= tf.reduce_min(tf.where(asking, asks[:, 0], np.inf))

        # Served, the actor keeps its place until its unroll arrives (`_enqueue` ends its wait)
        # or it stops asking: another actor given the same room in between would send its
        # megabytes only to meet a full store, or take the room from the actor that waited.
        return tf.logical_and(first, self._store.has_room())

    def _enqueue(self, secret, actor_task, weight_version, *fields):
        """Queues `n` trajectories; `fields` are the `Steps` fields then the core state."""
        steps, agent_state = _split_steps(fields)

        def checked():
            problem = self._trajectory_problem(actor_task, weight_version, steps, agent_state)
            return tf.cond(
                problem >= 0,
                lambda: self._refuse(problem, tf.constant(REFUSED)),
                lambda: self._queue(actor_task, weight_version, steps, agent_state),
            )

        def known():
            # Only from a task of ours that said hello to this learner: after a restart within
            # a call's deadline the RPC layer reconnects an actor on its own, unchecked by this
            # learner. Asked before the other checks, so that such an actor hears of a changed
            # spec from the hello it is sent back to (not as one refused chunk after another).
            task = tf.cast(actor_task, tf.int64)
            welcomed = self._welcomes.lookup(task) > 0
            # Whatever the answer, this actor no longer waits for room (see `_serve_in_line`).
            with tf.control_dependencies([self._room_asks.remove(tf.reshape(task, [1]))]):
                return tf.cond(
                    self._owns(actor_task) & tf.logical_not(welcomed),
                    lambda: tf.constant(UNKNOWN_ACTOR),
                    checked,
                )

        return tf.cond(
            self._authorized(secret),
            known,
            lambda: self._refuse(_WRONG_SECRET, tf.constant(UNAUTHORIZED)),
        )

    def _trajectory_problem(self, actor_task, weight_version, steps, agent_state):
        """The index of the first reason to refuse these trajectories, or -1 if they are sound.

        The RPC layer has checked dtypes and the shapes the signature fixes; this checks what it
        cannot: that this learner owns the actor, that every field holds the same trajectories,
        the observations' size, the actions' range, finite numbers and a weight version.
        """
        spec = self.spec
        count = tf.shape(steps.prev_action)[1]
        same_count = [tf.equal(tf.shape(f)[1], count) for f in steps if f is not steps.observation]
        same_count += [tf.equal(tf.shape(s)[0], count) for s in agent_state]
        observation_bytes = (
            (spec.unroll_length + 1)
            * tf.cast(count, tf.int64)
            * int(np.prod(spec.observation_shape, dtype=np.int64))
            * np.dtype(spec.observation_dtype).itemsize
        )
        sent_bytes = tf.cast(tf.strings.length(steps.observation), tf.int64)
        well_formed = tf.reduce_all([*same_count, tf.equal(sent_bytes, observation_bytes)])

        def in_range(actions):
            return tf.reduce_all((actions >= 0) & (actions < spec.num_actions))

        floats = [steps.reward, steps.policy_logits] + [
            s for s in agent_state if s.dtype.is_floating
        ]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(f)) for f in floats])
        checks = [
            (self._owns(actor_task), _NOT_OUR_TASK),
            (well_formed, _MALFORMED),
            (in_range(steps.action) & in_range(steps.prev_action), _ACTION_OUT_OF_RANGE),
            (finite, _NON_FINITE),
            (weight_version >= 0, _NEGATIVE_VERSION),
        ]
        problem = tf.constant(-1)
        for passed, reason in reversed(checks):  # so that the first failing check is reported
            problem = tf.where(passed, problem, reason)
        return problem

    def _queue(self, actor_task, weight_version, steps, agent_state):
        spec = self.spec
        count = tf.shape(steps.prev_action)[1]

        def accepted():
            self._received.assign_add(tf.cast(count, tf.int64))
            return tf.constant(ACCEPTED)

        def admit():
            # Observations arrive as one raw byte string (see the package docstring), decoded
            # only for a store with room: a chunk that met a full store costs no more here.
            observation = tf.reshape(
                tf.io.decode_raw(steps.observation, tf.as_dtype(spec.observation_dtype)),
                tf.concat([[spec.unroll_length + 1, count], spec.observation_shape], axis=0),
            )
            components = [
                tf.fill([count], actor_task),
                tf.fill([count], weight_version),
                *map(_swap_leading_axes, steps._replace(observation=observation)),
                *agent_state,
            ]
            admitted = self._store.admit(components)
            return tf.cond(admitted, accepted, lambda: tf.constant(QUEUE_FULL))

        # Never block a server thread on a full store: it refuses the chunk, and the actor asks
        # for room again (backpressure without RPCs that outlive a learner).
        def unless_full():
            return tf.cond(self._store.has_room(), admit, lambda: tf.constant(QUEUE_FULL))

        return tf.cond(self._finished, lambda: tf.constant(FINISHED), unless_full)

    def _report_episodes(
        self, secret, actor_task, episode_return, episode_steps, episode_frames, start_frames
    ):
        count = tf.shape(episode_return)[0]

        def record():
            self._episodes.enqueue_many(
                [
                    tf.fill([count], actor_task),
                    episode_return,
                    episode_steps,
                    episode_frames,
                    start_frames,
                ]
            )
            return tf.constant(ACCEPTED)

        def checked():
            well_formed = (
                tf.equal(tf.shape(episode_steps)[0], count)
                & tf.equal(tf.shape(episode_frames)[0], count)
                & tf.equal(tf.shape(start_frames)[0], count)
                & tf.reduce_all(episode_steps >= 0)
                & tf.reduce_all(episode_frames >= 0)
                & tf.reduce_all(start_frames >= -1)
            )
            problem = tf.where(well_formed, -1, _MALFORMED)
            finite = tf.reduce_all(tf.math.is_finite(episode_return))
            problem = tf.where(finite, problem, _NON_FINITE)
            problem = tf.where(self._owns(actor_task), problem, _NOT_OUR_TASK)
            return tf.cond(
                problem >= 0, lambda: self._refuse(problem, tf.constant(REFUSED)), record
            )

        return tf.cond(
            self._authorized(secret),
            checked,
            lambda: self._refuse(_WRONG_SECRET, tf.constant(UNAUTHORIZED)),
        )

    def _weights_version(self, secret):
        def version():
            return tf.where(
                self._finished, tf.constant(_FINISHED_VERSION, tf.int64), self._version.read_value()
            )

        refused = tf.constant(_UNAUTHORIZED_VERSION, tf.int64)
        return tf.cond(
            self._authorized(secret), version, lambda: self._refuse(_WRONG_SECRET, refused)
        )

    def _weights_chunk(self, secret, offset, length):
        """Returns (version, snapshot bytes, snapshot[offset:offset + length]) from one read."""

        def refuse(reason):
            answer = (tf.constant(_UNAUTHORIZED_VERSION, tf.int64), tf.constant(0, tf.int64), "")
            return lambda: self._refuse(reason, answer)

        def checked():
            sound = (offset >= 0) & (length >= 0)
            return tf.cond(sound, lambda: self._chunk(offset, length), refuse(_MALFORMED))

        return tf.cond(self._authorized(secret), checked, refuse(_WRONG_SECRET))

    def _chunk(self, offset, length):
        snapshot = self._snapshot.read_value()
        version = tf.strings.to_number(tf.strings.substr(snapshot, 0, _VERSION_DIGITS), tf.int64)
        body_size = tf.cast(tf.strings.length(snapshot), tf.int64) - _VERSION_DIGITS
        return version, body_size, tf.strings.substr(snapshot, _VERSION_DIGITS + offset, length)

    # ---- Learner-side functions ---------------------------------------------------------------

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
    def _publish(self, version):
        flat = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in self._variables], 0)
        # The version travels inside the snapshot so that every chunk says which one it is from.
        header = tf.strings.as_string(version, width=_VERSION_DIGITS, fill="0")
        stored = self._snapshot.assign(header + tf.io.serialize_tensor(flat))
        # TensorFlow orders assignments to one variable only: without this, actors could see
        # the new version before the snapshot it names exists.
        with tf.control_dependencies([stored]):
            self._version.assign(version)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def _dequeue(self, batch_size):
        actor_task, weight_version, *fields = self._store.take(batch_size)
        steps, agent_state = _split_steps(fields)
        return QueuedTrajectories(
            actor_task,
            weight_version,
            agent_state=agent_state,
            steps=Steps(*map(_swap_leading_axes, steps)),
        )


def check_listening_address(address: str) -> None:
    """Raises a one-line error unless a server can listen at `address` ("host:port") now.

    gRPC's own bind failures go unreported (it logs them and serves nothing), and it lets a
    second server share a port (SO_REUSEPORT): so binding is tried here first, without sharing.
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


_EMPTY_EPISODES = (
    np.zeros([0], np.int32),
    np.zeros([0], np.float32),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
)
