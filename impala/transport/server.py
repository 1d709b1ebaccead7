"""The learner's side of the transport: `LearnerService`, a gRPC server over its trajectory store.

What the service is built of, each in its own module: the secret check (`authentication.py`),
the gRPC server and its caps (`serving.py`), what is refused and why (`refusals.py`), the actor
tasks it knows and the line for room (`roster.py`), the episodes waiting (`episodes.py`), and
the trajectories between the wire and the store (`queueing.py`). A new transport is a new server
and client pair implementing the same methods (see the package docstring).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import tensorflow as tf

from impala import run_identity, run_secret, trajectory_store
from impala.trajectory_store import TrajectoryStore
from impala.transport import refusals, serving, wire
from impala.transport.authentication import Authenticator
from impala.transport.episodes import EpisodeBatch, EpisodeInbox
from impala.transport.queueing import QueuedTrajectories, TrajectoryQueue
from impala.transport.refusals import RefusalCounts, RefusedError
from impala.transport.roster import Roster
from impala.transport.wire import (
    ACCEPTED,
    FINISHED,
    FINISHED_VERSION,
    NO_WEIGHTS_VERSION,
    QUEUE_FULL,
    REFUSED,
    STATUS,
    UNKNOWN_ACTOR,
    VERSION,
    ProtocolError,
    UnrollSpec,
)


class LearnerService:
    """The learner's side: a trajectory store and a weight snapshot, served over gRPC.

    Trajectories go into a `TrajectoryStore` (`impala/trajectory_store.py`): a bounded FIFO
    queue by default. A replay scheme is a new store registered there, passed as `store`.

    A call is authenticated before anything else (`authentication.Authenticator`): without the
    run secret it ends UNAUTHENTICATED, its request unread. Every request is then checked
    against the layout in `wire.py` by its length before a field is read, and what it would
    queue or record is checked (`refusals.check_trajectories`, `refusals.check_episodes`), so
    that nothing an actor sends can stop the learner. Each refused call is counted by reason
    (`refusals`).
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
        synchronous: bool = False,
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
          queue_capacity: trajectories the queue holds before actors wait for room, for a store
            of the default kind (`trajectory_store.DEFAULT_STORE`) made here; give either this
            or `store`.
          secret: the run secret (`run_secret.LENGTH` hexadecimal digits) every call carries.
          store: where trajectories wait for the learner; its `capacity` is `queue_capacity`.
          tls: the run's TLS material (`impala.run_tls.Material`), or None for plain TCP.
          synchronous: synchronous collection (`--col_workers_communication`): only
            trajectories acted with the weights last published are queued, and publishing new
            weights drops those still queued (counted in `stale_trajectories`).

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
        serving.check_listening_address(address)
        self.spec = spec
        self._identity = run_identity.encode(identity)
        self._variables = list(variables)
        self._learner_index = learner_index
        self._num_learners = num_learners
        if store is None:
            store = trajectory_store.make_store(
                trajectory_store.DEFAULT_STORE, spec.queue_specs(), queue_capacity
            )
        self._queue = TrajectoryQueue(spec, store)
        self._refusals = RefusalCounts()
        self._roster = Roster()
        self._episodes = EpisodeInbox()
        self._lock = threading.Lock()
        # Notified after each chunk is queued: the learner sleeps on it until its batch is in
        # (`wait_for_trajectories`) rather than asking the store its size again and again.
        # Only `_enqueue` adds to the store (`TrajectoryStore.size` says so); anything else that
        # did would have to notify it. `close` and `stop` notify it too.
        self._arrivals = threading.Condition()
        self._received = 0
        self._synchronous = synchronous
        # Synchronous collection: a chunk's version is checked and the chunk queued under this
        # lock, and new weights published under it, so that no chunk of an older version is
        # queued after the weights that make it stale.
        self._admission = threading.Lock()
        self._published_version = NO_WEIGHTS_VERSION
        self._stale = 0
        self._finished = False
        # The reply to `Weights`: the version, then the weights (see `publish_weights`).
        self._weights_reply = VERSION.pack(NO_WEIGHTS_VERSION)
        # Population-based training: this policy's status, and snapshots of its whole state,
        # taken between two steps when another policy's learner asks (`publish_state`).
        self._status_reply = b"{}"  # `{}` until the learner takes part in a population
        self._state = threading.Condition()
        self._state_wanted = False
        self._state_reply = b""
        self._state_count = 0
        self._state_waiters = 0
        self._replies = serving.ReplyBudget()
        self._authenticator = Authenticator(secret, self._refusals.count_wrong_secret)
        self._server = serving.serve(
            address,
            self._behaviours(),
            self._authenticator,
            spec.max_enqueue_bytes,
            tls,
            self._replies,
        )

    # ---- The learner's side ------------------------------------------------------------------

    @property
    def queue_size(self) -> int:
        return int(self._queue.store.size())

    @property
    def queue_capacity(self) -> int:
        return self._queue.store.capacity

    @property
    def refusals(self) -> dict[str, int]:
        """Calls refused since this learner started, by reason (`wire.REFUSAL_REASONS`)."""
        return self._refusals.by_reason()

    @property
    def refusing_hosts(self) -> dict[str, int]:
        """Calls refused for the secret since this learner started, by the caller's host."""
        return self._authenticator.by_host()

    @property
    def unread_replies(self) -> dict[str, int]:
        """Calls since this learner started whose reply was refused while those unread filled
        `serving.MAX_REPLY_BYTES_OUT`, or cancelled after long unread."""
        return {"refused": self._replies.refused, "cancelled": self._replies.cancelled}

    @property
    def connections(self) -> dict[int, int]:
        """How many times each actor task has connected since this learner started."""
        return self._roster.connections()

    @property
    def trajectories_received(self) -> int:
        """Trajectories actors have put into the queue since this learner started."""
        return self._received

    @property
    def stale_trajectories(self) -> int:
        """Synchronous collection: trajectories dropped for having been acted with weights older
        than the learner's (refused on arrival, or left queued when new weights came)."""
        return self._stale

    def publish_weights(self, version: int) -> None:
        """Makes the current variable values available to actors as `version`. In synchronous
        collection, the trajectories still queued are stale from now on: they are dropped."""
        flat = _flat_weights(self._variables).numpy() if self._variables else np.zeros(0)
        reply = VERSION.pack(version) + flat.astype("<f4").tobytes()
        with self._admission:
            self._weights_reply = reply
            self._published_version = version
            stale = self.queue_size if self._synchronous else 0
        if stale:  # the oldest `stale` (first in, first out); only this thread dequeues
            self._queue.dequeue(stale)
            with self._lock:
                self._stale += stale

    def publish_status(self, status: bytes) -> None:
        """Makes `status` (UTF-8 JSON) the answer to `PolicyStatus`."""
        self._status_reply = status

    @property
    def state_wanted(self) -> bool:
        """Whether a `PolicyState` call waits for a snapshot (`publish_state`)."""
        return self._state_wanted

    def publish_state(self, state: bytes) -> None:
        """Answers the `PolicyState` calls waiting with `state` (taken between two steps)."""
        with self._state:
            self._state_reply = state
            self._state_count += 1
            self._state_wanted = False
            self._state.notify_all()

    @property
    def finished(self) -> bool:
        """Whether the service was closed or stopped."""
        return self._finished

    def wait_for_trajectories(self, count: int, timeout_secs: float) -> bool:
        """Sleeps until at least `count` trajectories are queued (woken as each chunk is),
        `timeout_secs` have passed or the service is closed; whether they are queued."""
        deadline = time.monotonic() + timeout_secs
        with self._arrivals:
            while self.queue_size < count:
                left = deadline - time.monotonic()
                if left <= 0 or self._finished:
                    return False
                self._arrivals.wait(left)
        return True

    def dequeue(self, batch_size: int) -> QueuedTrajectories:
        """Blocks until `batch_size` trajectories are queued and returns them, time-major."""
        return self._queue.dequeue(batch_size)

    def pop_episodes(self) -> EpisodeBatch:
        """Episodes reported since the last call (never blocks)."""
        return self._episodes.pop()

    def close(self, linger_secs: float = 0.0) -> None:
        """Tells actors that training is over and stops accepting trajectories.

        Args:
          linger_secs: keep answering for this long, so that every actor hears that the learner
            finished (on its next call) rather than finding it gone.
        """
        self._finished = True
        self._queue.store.close()
        self._wake_waiters()
        time.sleep(linger_secs)

    def stop(self) -> None:
        """Stops serving: calls under way end, and the port is free again."""
        self._finished = True
        self._wake_waiters()
        self._server.stop(grace=None).wait()
        self._authenticator.sum_up()

    def _wake_waiters(self) -> None:
        """Ends the waits for trajectories and the `PolicyState` calls under way (after
        `_finished` is set)."""
        with self._arrivals:
            self._arrivals.notify_all()
        with self._state:
            self._state.notify_all()

    # ---- Methods: run on the server's threads, after the secret was checked --------------------

    def _behaviours(self) -> dict[str, serving.Behaviour]:
        return {
            wire.method_path("Hello"): self._hello,
            wire.method_path("Room"): self._room,
            wire.method_path("Enqueue"): self._enqueue,
            wire.method_path("ReportEpisodes"): self._report_episodes,
            wire.method_path("WeightsVersion"): self._weights_version,
            wire.method_path("Weights"): self._weights,
            wire.method_path("PolicyStatus"): self._policy_status,
            wire.method_path("PolicyState"): self._policy_state,
        }

    def _owns(self, actor_task: int) -> bool:
        return actor_task >= 0 and actor_task % self._num_learners == self._learner_index

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
        return self._roster.welcome(actor_task).encode()

    def _room(self, request: bytes, context) -> bytes:
        """Whether the actor may send a chunk now: ACCEPTED, QUEUE_FULL or FINISHED.

        Actors ask before sending an unroll: sent to a full store, its megabytes would travel
        and be checked only to be refused. Room goes to the actor that began waiting first
        among those still asking (`roster.py` says why).
        """
        (actor_task,) = wire.unpack_exact(wire.TASK, request, "Room")
        if self._finished:
            return STATUS.pack(FINISHED)
        # An actor of another learner takes no place in line: refused at `Enqueue`.
        if self._owns(actor_task):
            served = self._roster.first_in_line(actor_task) and self._queue.has_room()
        else:
            served = self._queue.has_room()
        return STATUS.pack(ACCEPTED if served else QUEUE_FULL)

    def _enqueue(self, request: bytes, context) -> bytes:
        """Queues the trajectories of one chunk (`wire.py` has the layout)."""
        actor_task, weight_version, _ = wire.enqueue_header(request)
        # Whatever the answer, an actor of ours no longer waits for room. Only from a task of
        # ours that said hello to this learner: after a restart gRPC reconnects an actor on its
        # own, unchecked by this learner. Asked before the other checks, so that such an actor
        # hears of a changed spec from the hello it is sent back to (not as one refused chunk
        # after another).
        if self._owns(actor_task) and not self._roster.stop_waiting(actor_task):
            return STATUS.pack(UNKNOWN_ACTOR)
        if self._finished:
            return STATUS.pack(FINISHED)
        # Never block a server thread on a full store: it refuses the chunk, read no further
        # than its header, and the actor asks for room again.
        if not self._queue.has_room():
            return STATUS.pack(QUEUE_FULL)
        try:
            steps, agent_state = self._read_chunk(actor_task, weight_version, request)
        except RefusedError as refused:
            self._refusals.count(refused.reason)
            return STATUS.pack(REFUSED)
        trajectories = steps.prev_action.shape[1]
        try:
            if self._synchronous:
                with self._admission:
                    if weight_version != self._published_version:  # acted with older weights
                        with self._lock:
                            self._stale += trajectories
                        return STATUS.pack(ACCEPTED)  # and dropped: the actor acts again
                    admitted = self._queue.admit(actor_task, weight_version, steps, agent_state)
            else:
                admitted = self._queue.admit(actor_task, weight_version, steps, agent_state)
        except tf.errors.OpError:
            # The learner finished between the check above and here, and closed its store.
            if not self._finished:
                raise
            return STATUS.pack(FINISHED)
        if not admitted:
            return STATUS.pack(QUEUE_FULL)
        with self._lock:
            self._received += trajectories
        with self._arrivals:
            self._arrivals.notify_all()
        return STATUS.pack(ACCEPTED)

    def _read_chunk(self, actor_task: int, weight_version: int, request: bytes):
        """The chunk's `Steps` and core state, checked; raises `RefusedError` if refused."""
        if not self._owns(actor_task):
            raise RefusedError(refusals.NOT_OUR_TASK)
        try:
            steps, agent_state = wire.decode_enqueue(self.spec, request)
        except ProtocolError:
            raise RefusedError(refusals.MALFORMED) from None
        refusals.check_trajectories(self.spec, weight_version, steps, agent_state)
        return steps, agent_state

    def _report_episodes(self, request: bytes, context) -> bytes:
        """Records finished episodes' returns, agent steps, frames and start frames."""
        if self._finished:
            return STATUS.pack(FINISHED)
        try:
            try:
                actor_task, fields = wire.decode_episodes(request)
            except ProtocolError:
                raise RefusedError(refusals.MALFORMED) from None
            if not self._owns(actor_task):
                raise RefusedError(refusals.NOT_OUR_TASK)
            refusals.check_episodes(*fields)
            self._episodes.put(actor_task, *fields)
        except RefusedError as refused:
            self._refusals.count(refused.reason)
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

    def _policy_status(self, request: bytes, context) -> bytes:
        if request:
            raise ProtocolError(f"PolicyStatus of {len(request)} bytes")
        return self._status_reply

    def _policy_state(self, request: bytes, context) -> bytes:
        """A snapshot of the learner's state taken after this call came (the learner takes it
        between two steps), or b'' if none came within `STATE_WAIT_SECS` or the learner takes
        no part in population-based training."""
        if request:
            raise ProtocolError(f"PolicyState of {len(request)} bytes")
        if self._status_reply == b"{}":
            # Not (yet) in a population: no step of this learner would take a snapshot, and
            # the call would hold one of the server's few threads for `STATE_WAIT_SECS`.
            return b""
        with self._state:
            if self._state_waiters >= MAX_STATE_WAITERS:
                # The others wait on the server's few threads, which the actors' calls that
                # let the learner step also need: more would stall the policy's training.
                return b""
            asked = self._state_count
            self._state_wanted = True
            self._state_waiters += 1
            try:
                if not self._state.wait_for(
                    lambda: self._state_count > asked or self._finished, STATE_WAIT_SECS
                ):
                    return b""
            finally:
                self._state_waiters -= 1
            return self._state_reply if self._state_count > asked else b""


# How long a `PolicyState` call waits for the learner to take its snapshot: a step, or the
# learner's own look at the population (calls to the other policies).
STATE_WAIT_SECS = 60.0
# `PolicyState` calls that may wait at once (of `serving.SERVER_THREADS`); one more is answered
# b'' at once, as if no snapshot came, and its caller sits that look out.
MAX_STATE_WAITERS = 2


@tf.function
def _flat_weights(variables):
    return tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in variables], 0)


_FINISHED_REPLY = VERSION.pack(FINISHED_VERSION)
