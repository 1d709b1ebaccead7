"""The actor's side of the transport: `ActorClient`, connected to its learner's `LearnerService`.

A new transport is a new server and client pair implementing the same methods (see the package
docstring).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import grpc
import numpy as np
import tensorflow as tf

from impala import run_identity
from impala.printable import printable
from impala.trajectory import Steps, Unroll
from impala.transport import wire
from impala.transport.serving import BUSY_DETAILS
from impala.transport.wire import (
    FINISHED,
    FINISHED_VERSION,
    MAX_EPISODES_PER_REPORT,
    QUEUE_FULL,
    REFUSED,
    STATUS,
    UNKNOWN_ACTOR,
    VERSION,
    AuthenticationError,
    LearnerFinishedError,
    LearnerRestartedError,
    LearnerUnreachableError,
    MismatchError,
    ProtocolError,
    UnrollSpec,
)

# While the learner's queue stays full, an actor asks for room again after 2 ms, then twice as
# long each time, up to a pause of a tenth of how long it has waited so far or typically waits
# (a moving average), whichever is longer, kept within these bounds: each `Room` call costs both
# sides CPU that the learner could have trained with, a slow learner keeps its actors waiting
# for most of a batch, and a learner tracing its first step for a minute keeps them waiting that
# long; the tenth bounds how late an actor hears of room to about a tenth of the time it spends
# waiting anyway. The learner serves its actors in the order they began to wait, and takes an
# actor that has not asked for `roster.ROOM_ASKING_SECS` (1 s) to have stopped: the longest
# pause must stay well below that.
_ROOM_FIRST_PAUSE_SECS = 0.002
_ROOM_PAUSE_BOUNDS_SECS = (0.02, 0.2)
# A learner at its bound of calls under way, or of replies not yet read, answers
# RESOURCE_EXHAUSTED: the call is tried again after a pause, doubling up to the most, each drawn
# between half and all of it so that actors refused together do not all come back together,
# until the call's deadline; then the actor reconnects (`LearnerUnreachableError`).
_BUSY_FIRST_PAUSE_SECS = 0.01
_BUSY_MAX_PAUSE_SECS = 1.0


def first_detail(error: grpc.RpcError) -> str:
    """The first line of a failed call's details, printable ('' if none)."""
    lines = (error.details() or "").splitlines()
    return printable(lines[0]) if lines else ""


def _busy(error: grpc.RpcError) -> bool:
    """Whether a call ended RESOURCE_EXHAUSTED for the learner's bounds of calls under way or
    of replies not yet read (worth trying again), not for a message too large (which is not)."""
    details = error.details() or ""
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and (
        details.startswith(BUSY_DETAILS) or details.startswith("Concurrent RPC limit")
    )


def open_channel(address: str, options: list[tuple[str, int]], tls=None) -> grpc.Channel:
    """A channel to the learner at `address` with gRPC `options`: plain TCP, or with `tls`
    (the run's `impala.run_tls.Material`) mutual TLS."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    from impala import run_tls

    return grpc.secure_channel(
        address,
        run_tls.channel_credentials(tls),
        options=options + list(run_tls.CHANNEL_OPTIONS),
    )


class ActorClient:
    """The actor's side: connects to its learner, sends unrolls, fetches weights."""

    def __init__(
        self,
        address: str,
        actor_task: int,
        spec: UnrollSpec,
        identity: dict[str, Any],
        variables: list[tf.Variable],
        timeout_secs: float = 30.0,
        connect_timeout_secs: float | None = None,
        *,
        secret: str,
        tls=None,
    ):
        """Connects to the learner at `address` and checks that both sides agree.

        Args:
          secret: the run secret (`impala/run_secret.py`), sent with every call.
          timeout_secs: the deadline of every call; the learner never holds a call for long.
          connect_timeout_secs: how long to try reaching the learner (default: timeout_secs).
          tls: the run's TLS material (`impala.run_tls.Material`), or None for plain TCP.

        Raises:
          MismatchError: naming every setting that differs from the learner's, or if this
            actor belongs to another learner.
          AuthenticationError: the learner refused `secret`.
          LearnerUnreachableError: no learner answered.
        """
        self._address = address
        self._timeout_secs = timeout_secs
        self._task = actor_task
        self._spec = spec
        self._variables = list(variables)
        self._num_weights = sum(math.prod(v.shape) for v in self._variables)
        self._metadata = ((wire.SECRET_KEY, secret),)
        # Chunks of trajectories the learner refused (it says why in its log); a sound actor
        # sees this only for unrolls acted with weights a restarted learner no longer has.
        self.refused_chunks = 0
        # Chunks sent, and those of them answered QUEUE_FULL and so sent again: the queue filled
        # between the answer to `Room` and their arrival (with the other chunks of the same
        # unroll, which travel together, or another actor's).
        self.sent_chunks = 0
        self.full_chunks = 0
        # Seconds `send` spent waiting for the learner's queue to have room, and `Room` calls.
        self.room_wait_secs = 0.0
        self.room_calls = 0
        self._typical_room_wait_secs = 0.0
        self._channel = self._open_channel(address, tls)
        try:
            grpc.channel_ready_future(self._channel).result(
                timeout=connect_timeout_secs or timeout_secs
            )
        except grpc.FutureTimeoutError:
            self._channel.close()
            # A learner that serves TLS when this actor does not (or the other way round, or
            # with another run's certificate) looks the same as none from here.
            hint = (
                "over TLS (a learner without --transport_tls, or with another run's tls.pem, "
                "does not answer it)"
                if tls is not None
                else "(a learner started with --transport_tls answers only actors given it too)"
            )
            raise LearnerUnreachableError(f"no learner answers at {address} {hint}") from None
        self._methods = {
            name: self._channel.unary_unary(wire.method_path(name)) for name in wire.METHODS
        }
        self.version = -1
        try:
            self._hello(identity)
        except BaseException:
            self._channel.close()
            raise

    def _hello(self, identity: dict[str, Any]) -> None:
        """Introduces this actor; raises MismatchError unless the learner welcomes it."""
        address, actor_task = self._address, self._task
        answer = self._call("Hello", wire.encode_hello(actor_task, identity)).decode(
            errors="replace"
        )
        # What the learner says is printed as printable text: without --transport_tls, whoever
        # holds its address may say anything.
        if answer.startswith("MISMATCH:"):
            try:
                learner_identity = run_identity.decode(answer[len("MISMATCH:") :])
                differences = run_identity.mismatch(learner_identity, identity)
            except (ValueError, AttributeError, TypeError, RecursionError):
                raise MismatchError(
                    f"actor {actor_task} at learner {address}: the learner's identity is not "
                    f"one: {printable(answer[:200])}"
                ) from None
            raise MismatchError(
                f"actor {actor_task} does not match its learner at {address}: "
                + printable(differences)
            )
        if answer:
            raise MismatchError(f"actor {actor_task} at learner {address}: {printable(answer)}")

    def _open_channel(self, address: str, tls) -> grpc.Channel:
        options = [
            # Replies are small but for the weights, whose size this actor knows.
            ("grpc.max_receive_message_length", max(1 << 20, VERSION.size + 4 * self._num_weights)),
            ("grpc.max_send_message_length", self._spec.max_enqueue_bytes),
        ]
        return open_channel(address, options, tls)

    def close(self) -> None:
        self._channel.close()

    def send(self, unroll: Unroll) -> None:
        """Sends one unroll (all of the actor's environments), in chunks under the size limit.

        Waits while the learner's queue is full.

        Raises:
          LearnerFinishedError: the learner has finished.
          LearnerRestartedError: the learner restarted since this client connected (the
            unroll was not queued): connect again.
          LearnerUnreachableError: the learner did not answer.
        """
        num_envs = unroll.steps.prev_action.shape[1]
        per_chunk = self._spec.chunk_trajectories
        chunks = [
            self._chunk(unroll, slice(start, min(start + per_chunk, num_envs)))
            for start in range(0, num_envs, per_chunk)
        ]
        while chunks:
            self._wait_for_room()
            # All chunks in flight at once; those refused for a full queue (filled meanwhile,
            # by this unroll's other chunks or another actor's) go again once there is room.
            pending = [(chunk, self._start_call("Enqueue", chunk)) for chunk in chunks]
            statuses = [(chunk, self._status(future, chunk)) for chunk, future in pending]
            self.sent_chunks += len(statuses)
            self.refused_chunks += sum(status == REFUSED for _, status in statuses)
            chunks = [chunk for chunk, status in statuses if status == QUEUE_FULL]
            self.full_chunks += len(chunks)
            self._raise_for(status for _, status in statuses)

    def _wait_for_room(self) -> None:
        """Returns once the learner's store would admit a chunk, asking with a small call.

        Unrolls are not sent to a full store to see whether it takes them: a refused unroll's
        megabytes would have travelled and been checked for nothing, on the learner's CPU (with
        a one-batch queue, most of the unrolls sent were refused).
        """
        low, high = _ROOM_PAUSE_BOUNDS_SECS
        pause, started = _ROOM_FIRST_PAUSE_SECS, time.monotonic()
        request = wire.TASK.pack(self._task)
        try:
            while True:
                self.room_calls += 1
                (status,) = STATUS.unpack(self._call("Room", request))
                self._raise_for([status])
                if status != QUEUE_FULL:
                    return
                time.sleep(pause)
                waited = max(time.monotonic() - started, self._typical_room_wait_secs)
                pause = min(2 * pause, high, max(low, waited / 10))
        finally:
            waited = time.monotonic() - started
            self.room_wait_secs += waited
            # Slow to forget a long wait: two actors may take turns finding room at once.
            self._typical_room_wait_secs += 0.2 * (waited - self._typical_room_wait_secs)

    def _raise_for(self, statuses) -> None:
        """Raises for the statuses that end sending: the learner done or restarted."""
        statuses = list(statuses)
        if FINISHED in statuses:
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        if UNKNOWN_ACTOR in statuses:
            raise LearnerRestartedError(
                f"the learner at {self._address} restarted since actor {self._task} connected"
            )

    def _chunk(self, unroll: Unroll, envs: slice) -> bytes:
        """The `Enqueue` request for the trajectories of environments `envs`."""
        return wire.encode_enqueue(
            self._task,
            unroll.weight_version,
            Steps(*(field[:, envs] for field in unroll.steps)),
            [np.asarray(state)[envs] for state in tf.nest.flatten(unroll.agent_state)],
        )

    def report_episodes(self, episodes) -> None:
        """Sends finished episodes' real scores, agent steps, frames and start frames (-1
        where the family has none) to the learner."""
        for start in range(0, len(episodes), MAX_EPISODES_PER_REPORT):
            part = episodes[start : start + MAX_EPISODES_PER_REPORT]
            reply = self._call(
                "ReportEpisodes",
                wire.encode_episodes(
                    self._task,
                    [e.episode_return for e in part],
                    [e.episode_steps for e in part],
                    [e.episode_frames for e in part],
                    [e.start_frames for e in part],
                ),
            )
            self._raise_for([STATUS.unpack(reply)[0]])

    def learner_version(self) -> int:
        """The learner's weight version (-1 before it publishes any).

        Raises:
          LearnerFinishedError: the learner has finished.
        """
        (version,) = wire.unpack_exact(VERSION, self._call("WeightsVersion", b""), "version")
        if version == FINISHED_VERSION:
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        return version

    def fetch_weights(self) -> tuple[list[np.ndarray], int] | None:
        """Fetches the learner's current weights if their version differs from `self.version`.

        Returns:
          (weights in variable order, version), or None if the actor is up to date or the
          learner has not published weights yet.

        Raises:
          LearnerFinishedError: the learner has finished.
          ProtocolError: the learner sent weights of another size than this actor's.
        """
        reply = self._call("Weights", VERSION.pack(self.version))
        (version,) = VERSION.unpack_from(reply)
        if version == FINISHED_VERSION:
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        if len(reply) == VERSION.size:
            return None
        if len(reply) != VERSION.size + 4 * self._num_weights:
            raise ProtocolError(
                f"the learner at {self._address} sent {len(reply) - VERSION.size} bytes of "
                f"weights; this actor's network has {4 * self._num_weights}"
            )
        flat = np.frombuffer(reply, "<f4", offset=VERSION.size)
        weights, offset = [], 0
        for variable in self._variables:
            size = math.prod(variable.shape)
            weights.append(flat[offset : offset + size].reshape(variable.shape))
            offset += size
        self.version = version
        return weights, version

    def _call(self, method: str, request: bytes) -> bytes:
        return self._result(self._start_call(method, request), method, request)

    def _start_call(self, method: str, request: bytes):
        # An explicit deadline on every call: without one, a call to a learner that died
        # waits forever.
        return self._methods[method].future(
            request, timeout=self._timeout_secs, metadata=self._metadata
        )

    def _status(self, future, chunk: bytes) -> int:
        (status,) = STATUS.unpack(self._result(future, "Enqueue", chunk))
        return status

    def _result(self, future, method: str, request: bytes) -> bytes:
        """The reply of a call begun with `_start_call`, tried again while the learner is at
        its bound of calls under way (RESOURCE_EXHAUSTED), until the call's deadline."""
        pause, deadline = _BUSY_FIRST_PAUSE_SECS, time.monotonic() + self._timeout_secs
        while True:
            try:
                return future.result()
            except grpc.RpcError as error:
                if not _busy(error) or time.monotonic() + pause > deadline:
                    raise self._translated(error, method) from None
            time.sleep(random.uniform(pause / 2, pause))
            pause = min(2 * pause, _BUSY_MAX_PAUSE_SECS)
            future = self._start_call(method, request)

    def _translated(self, error: grpc.RpcError, method: str) -> Exception:
        code = error.code()
        details = first_detail(error)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return LearnerUnreachableError(
                f"{method} call to learner {self._address} failed: {details or code.name}"
            )
        if _busy(error):
            return LearnerUnreachableError(
                f"learner {self._address} was too busy to answer {method} for "
                f"{self._timeout_secs:g} s ({details or code.name})"
            )
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return AuthenticationError(
                f"actor {self._task}: the learner at {self._address} refused this actor's run "
                "secret (--secret_file must hold the same secret as the learner's)"
            )
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return MismatchError(
                f"the learner at {self._address} does not serve {method}: it runs other code "
                "than this actor (start learners and actors from the same checkout)"
            )
        if code == grpc.StatusCode.CANCELLED:
            return LearnerFinishedError(f"learner at {self._address} has finished")
        return ProtocolError(f"{method} on learner {self._address}: {code.name}: {details}")
