"""The actor's side of the transport: `ActorClient`, connected to its learner's `LearnerService`.

A new transport is a new server and client pair implementing the same methods (see the package
docstring).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import errors_impl

from impala import run_identity
from impala.trajectory import Steps, Unroll
from impala.transport.wire import (
    _FINISHED_VERSION,
    _UNAUTHORIZED_HELLO,
    _UNAUTHORIZED_VERSION,
    FINISHED,
    LEARNER_METHODS,
    MAX_MESSAGE_BYTES,
    QUEUE_FULL,
    REFUSED,
    UNAUTHORIZED,
    UNKNOWN_ACTOR,
    AuthenticationError,
    LearnerFinishedError,
    LearnerRestartedError,
    LearnerUnreachableError,
    MismatchError,
    UnrollSpec,
    _trajectory_bytes,
    observation_bytes,
)

_rpc = tf.distribute.experimental.rpc

# While the learner's queue stays full, an actor asks for room again after 2 ms, then twice as
# long each time, up to a pause of a tenth of how long it has waited so far or typically waits
# (a moving average), whichever is longer, kept within these bounds: each `room` call costs both
# sides CPU that the learner could have trained with, a slow learner keeps its actors waiting
# for most of a batch, and a learner tracing its first step for a minute keeps them waiting that
# long; the tenth bounds how late an actor hears of room to about a tenth of the time it spends
# waiting anyway. The learner serves its actors in the order they began to wait, and takes an
# actor that has not asked for `server.ROOM_ASKING_SECS` (1 s) to have stopped: the longest
# pause must stay well below that.
_ROOM_FIRST_PAUSE_SECS = 0.002
_ROOM_PAUSE_BOUNDS_SECS = (0.02, 0.2)


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
    ):
        """Connects to the learner at `address` and checks that both sides agree.

        Args:
          secret: the run secret (`impala/run_secret.py`), sent with every call.
          timeout_secs: the deadline of every call; the learner never holds a call for long.
          connect_timeout_secs: how long to try reaching the learner (default: timeout_secs).

        Raises:
          MismatchError: naming every setting that differs from the learner's, or if this
            actor belongs to another learner.
          AuthenticationError: the learner refused `secret`.
          LearnerUnreachableError: no learner answered.
        """
        self._address = address
        self._timeout_ms = int(timeout_secs * 1000)
        self._task = actor_task
        self._spec = spec
        self._variables = list(variables)
        self._secret = tf.constant(secret)
        # Chunks of trajectories the learner refused (it says why in its log); a sound actor
        # sees this only for unrolls acted with weights a restarted learner no longer has.
        self.refused_chunks = 0
        # Chunks sent, and those of them answered QUEUE_FULL and so sent again: the queue filled
        # between the answer to `room` and their arrival (with the other chunks of the same
        # unroll, which travel together, or another actor's).
        self.sent_chunks = 0
        self.full_chunks = 0
        # Seconds `send` spent waiting for the learner's queue to have room, and `room` calls.
        self.room_wait_secs = 0.0
        self.room_calls = 0
        self._typical_room_wait_secs = 0.0
        try:
            self._client = _rpc.Client.create(
                "grpc",
                address,
                # The name keys a shared resource: a second client under the same name would
                # delete this one's connection when it is garbage-collected.
                name=f"actor_{actor_task}_{uuid.uuid4().hex}",
                # Only connecting uses this; every call passes its own deadline.
                timeout_in_ms=int(1000 * (connect_timeout_secs or timeout_secs)),
            )
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
            raise LearnerUnreachableError(
                f"no learner answers at {address}: {error.message.splitlines()[0]}"
            ) from None
        missing = sorted(set(LEARNER_METHODS) - set(self._client._method_registry))
        if missing:
            raise MismatchError(
                f"the learner at {address} does not serve {', '.join(missing)}: it runs other "
                "code than this actor (start learners and actors from the same checkout)"
            )
        self.version = -1
        answer = (
            self._call(
                "hello",
                tf.constant(run_identity.encode(identity)),
                tf.constant(actor_task, tf.int32),
            )
            .numpy()
            .decode()
        )
        if answer == _UNAUTHORIZED_HELLO:
            raise self._unauthorized()
        if answer.startswith("MISMATCH:"):
            learner_identity = run_identity.decode(answer[len("MISMATCH:") :])
            raise MismatchError(
                f"actor {actor_task} does not match its learner at {address}: "
                + run_identity.mismatch(learner_identity, identity)
            )
        if answer:
            raise MismatchError(f"actor {actor_task} at learner {address}: {answer}")

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
        per_chunk = max(1, MAX_MESSAGE_BYTES // max(1, _trajectory_bytes(unroll)))
        chunks = [
            self._chunk_args(unroll, slice(start, min(start + per_chunk, num_envs)))
            for start in range(0, num_envs, per_chunk)
        ]
        while chunks:
            self._wait_for_room()
            # All chunks in flight at once; those refused for a full queue (filled meanwhile,
            # by this unroll's other chunks or another actor's) go again once there is room.
            pending = [(args, self._start_call("enqueue", args)) for args in chunks]
            statuses = [(args, int(self._check(result, "enqueue"))) for args, result in pending]
            self.sent_chunks += len(statuses)
            self.refused_chunks += sum(status == REFUSED for _, status in statuses)
            chunks = [args for args, status in statuses if status == QUEUE_FULL]
            self.full_chunks += len(chunks)
            self._raise_for(status for _, status in statuses)

    def _wait_for_room(self) -> None:
        """Returns once the learner's store would admit a chunk, asking with a small call.

        Unrolls are not sent to a full store to see whether it takes them: a refused unroll's
        megabytes would have travelled and been decoded and checked for nothing, on the
        learner's CPU (with a one-batch queue, most of the unrolls sent were refused).
        """
        low, high = _ROOM_PAUSE_BOUNDS_SECS
        pause, started = _ROOM_FIRST_PAUSE_SECS, time.monotonic()
        try:
            while True:
                self.room_calls += 1
                status = int(self._call("room", tf.constant(self._task, tf.int32)))
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
        """Raises for the statuses that end sending: the secret refused, the learner done or
        restarted."""
        statuses = list(statuses)
        if UNAUTHORIZED in statuses:
            raise self._unauthorized()
        if FINISHED in statuses:
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        if UNKNOWN_ACTOR in statuses:
            raise LearnerRestartedError(
                f"the learner at {self._address} restarted since actor {self._task} connected"
            )

    def _chunk_args(self, unroll: Unroll, envs: slice) -> list:
        """`enqueue`'s arguments for the trajectories of environments `envs`."""
        steps = Steps(*(field[:, envs] for field in unroll.steps))
        # A byte string travels far faster than a uint8 tensor (see the package docstring).
        observation = observation_bytes(steps.observation)
        return [
            tf.constant(self._task, tf.int32),
            tf.constant(unroll.weight_version, tf.int64),
            *steps._replace(observation=observation),
            *(state[envs] for state in tf.nest.flatten(unroll.agent_state)),
        ]

    def report_episodes(self, episodes) -> None:
        """Sends finished episodes' real scores, agent steps, frames and start frames (-1
        where the family has none) to the learner."""
        if not episodes:
            return
        status = self._call(
            "report_episodes",
            tf.constant(self._task, tf.int32),
            tf.constant([e.episode_return for e in episodes], tf.float32),
            tf.constant([e.episode_steps for e in episodes], tf.int64),
            tf.constant([e.episode_frames for e in episodes], tf.int64),
            tf.constant([e.start_frames for e in episodes], tf.int64),
        )
        if int(status) == UNAUTHORIZED:
            raise self._unauthorized()

    def learner_version(self) -> int:
        """The learner's weight version (-1 before it publishes any).

        Raises:
          LearnerFinishedError: the learner has finished.
        """
        version = int(self._call("weights_version"))
        if version == _UNAUTHORIZED_VERSION:
            raise self._unauthorized()
        if version == _FINISHED_VERSION:
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        return version

    def fetch_weights(self) -> tuple[list[np.ndarray], int] | None:
        """Fetches the learner's current weights if their version differs from `self.version`.

        Returns:
          (weights in variable order, version), or None if the actor is up to date or the
          learner has not published weights yet.
        """
        while True:
            version = self.learner_version()
            if version < 0 or version == self.version:
                return None
            fetched = self._fetch_snapshot()
            if fetched is not None:  # else the learner published a newer version meanwhile
                break
        flat, version = fetched
        weights, offset = [], 0
        for variable in self._variables:
            size = math.prod(variable.shape)
            weights.append(flat[offset : offset + size].reshape(variable.shape))
            offset += size
        self.version = version
        return weights, version

    def _fetch_snapshot(self) -> tuple[np.ndarray, int] | None:
        chunks, offset, total, version = [], 0, None, None
        while total is None or offset < total:
            chunk_version, body_size, chunk = self._call(
                "weights_chunk",
                tf.constant(offset, tf.int64),
                tf.constant(MAX_MESSAGE_BYTES, tf.int64),
            )
            if int(chunk_version) == _UNAUTHORIZED_VERSION:
                raise self._unauthorized()
            if version is None:
                version, total = int(chunk_version), int(body_size)
            elif int(chunk_version) != version:
                return None
            chunks.append(chunk.numpy())
            offset += MAX_MESSAGE_BYTES
        flat = tf.io.parse_tensor(b"".join(chunks), tf.float32).numpy()
        return flat, version

    def _unauthorized(self) -> AuthenticationError:
        return AuthenticationError(
            f"actor {self._task}: the learner at {self._address} refused this actor's run secret "
            "(--secret_file must hold the same secret as the learner's)"
        )

    def _call(self, method: str, *args):
        return self._check(self._start_call(method, list(args)), method)

    def _start_call(self, method: str, args: list):
        specs = self._client._method_registry[method]  # fetched from the server on connect
        # An explicit deadline on every call: without one, a call to a learner that died
        # waits forever.
        return self._client.call(
            method, [self._secret, *args], output_specs=specs, timeout_in_ms=self._timeout_ms
        )

    def _check(self, result, method: str):
        if result.is_ok():
            return result.get_value()
        code, message = result.get_error()
        message = message.numpy().decode(errors="replace").splitlines()[0]
        error_type = errors_impl.exception_type_from_error_code(int(code))
        if error_type in (tf.errors.UnavailableError, tf.errors.DeadlineExceededError):
            raise LearnerUnreachableError(
                f"{method} call to learner {self._address} failed: {message}"
            )
        if error_type is tf.errors.CancelledError or "closed" in message:
            # The learner closed its queue while this call was in flight.
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        raise error_type(None, None, f"{method} on learner {self._address}: {message}")
