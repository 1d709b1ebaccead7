"""Actors and learners talk over TensorFlow's own gRPC runtime (`tf.distribute.experimental.rpc`).

Each learner runs a `LearnerService`: an RPC server whose registered TensorFlow functions put
trajectories into the learner's bounded queue and hand out its weights. Each actor holds an
`ActorClient` connected to its learner.

Two facts about the RPC layer shape this module (both measured, see README):
- A message may not exceed 4 MiB (gRPC's default, which TensorFlow does not let us raise), so
  unrolls travel in chunks of whole trajectories, and weights as a snapshot string fetched in
  chunks.
- A uint8 tensor is encoded element by element (about 1.5 bytes per byte, and slowly), while a
  string travels as raw bytes: observations are sent as a byte string and decoded on the learner,
  which benchmarks/transport_encoding.py measures 8-10x faster.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import errors_impl

from impala import run_identity
from impala.trajectory import Steps, Unroll

# Under gRPC's 4 MiB limit, leaving room for the other fields and the message framing.
MAX_MESSAGE_BYTES = 3 << 20
# Width of the zero-padded weight version that prefixes each weight chunk.
_VERSION_DIGITS = 20
_rpc = tf.distribute.experimental.rpc


class LearnerFinishedError(RuntimeError):
    """The learner stopped accepting trajectories: training is over."""


class LearnerUnreachableError(ConnectionError):
    """The learner did not answer (it died, or the network between us failed)."""


# What `enqueue` answers.
ACCEPTED, QUEUE_FULL, FINISHED = 0, 1, 2
# What `weights_version` answers once the learner has finished.
_FINISHED_VERSION = -2


class MismatchError(ValueError):
    """The actor and the learner were started with incompatible settings."""


@dataclasses.dataclass(frozen=True)
class UnrollSpec:
    """Shapes of one trajectory as it sits in a learner's queue.

    Attributes:
      unroll_length: T; trajectories hold T + 1 steps.
      observation_shape: shape of one observation.
      observation_dtype: numpy dtype name of observations, e.g. "uint8".
      num_actions: size of the discrete action space.
      state_shapes: shapes (without batch) of the flattened agent core state.
      state_dtypes: dtype names of the flattened agent core state.
    """

    unroll_length: int
    observation_shape: tuple[int, ...]
    observation_dtype: str
    num_actions: int
    state_shapes: tuple[tuple[int, ...], ...] = ()
    state_dtypes: tuple[str, ...] = ()

    @property
    def trajectory_bytes(self) -> int:
        """Bytes of one trajectory's observations, the bulk of what travels."""
        steps = self.unroll_length + 1
        return steps * math.prod(self.observation_shape) * np.dtype(self.observation_dtype).itemsize

    def queue_specs(self) -> list[tf.TensorSpec]:
        """Per-trajectory components in queue order (see `QueuedTrajectories`).

        The actor task, the weight version, the `Steps` fields [T + 1, ...], the flattened core
        state.
        """
        return [
            tf.TensorSpec([], tf.int32),  # actor task
            tf.TensorSpec([], tf.int64),  # weight version
            *self._step_specs([self.unroll_length + 1]),
            *(
                tf.TensorSpec(shape, dtype)
                for shape, dtype in zip(self.state_shapes, self.state_dtypes, strict=True)
            ),
        ]

    def enqueue_signature(self) -> list[tf.TensorSpec]:
        """RPC arguments of `enqueue`: the time-major fields of `n` trajectories.

        The actor task, the weight version, the `Steps` fields [T + 1, n, ...] (observations as
        one raw byte string), the flattened core state [n, ...].
        """
        step_specs = self._step_specs([self.unroll_length + 1, None])
        return [
            tf.TensorSpec([], tf.int32),  # actor task
            tf.TensorSpec([], tf.int64),  # weight version
            *step_specs._replace(observation=tf.TensorSpec([], tf.string)),
            *(
                tf.TensorSpec([None, *shape], dtype)
                for shape, dtype in zip(self.state_shapes, self.state_dtypes, strict=True)
            ),
        ]

    def _step_specs(self, leading: list[int | None]) -> Steps:
        """Specs of the `Steps` fields, each shaped `leading` + the field's own dimensions."""
        return Steps(
            prev_action=tf.TensorSpec(leading, tf.int32),
            reward=tf.TensorSpec(leading, tf.float32),
            done=tf.TensorSpec(leading, tf.bool),
            observation=tf.TensorSpec([*leading, *self.observation_shape], self.observation_dtype),
            action=tf.TensorSpec(leading, tf.int32),
            policy_logits=tf.TensorSpec([*leading, self.num_actions], tf.float32),
        )


def describe(
    env, agent, unroll_length: int, level_name: str, num_action_repeats: int
) -> tuple[UnrollSpec, dict[str, Any]]:
    """The trajectory spec and the identity an actor and its learner must share.

    Args:
      env: an `environments.VectorEnvironment` (its observation spec, actions, frame skip).
      agent: a `networks.Agent` (its class and core state).
    """
    flat_state = tf.nest.flatten(agent.initial_state(1))
    spec = UnrollSpec(
        unroll_length=unroll_length,
        observation_shape=tuple(int(d) for d in env.observation_shape),
        observation_dtype=np.dtype(env.observation_dtype).name,
        num_actions=int(env.num_actions),
        state_shapes=tuple(tuple(int(d) for d in s.shape[1:]) for s in flat_state),
        state_dtypes=tuple(s.dtype.name for s in flat_state),
    )
    identity = run_identity.make(
        level_name=level_name,
        agent_name=type(agent).__name__,
        num_actions=spec.num_actions,
        observation_shape=spec.observation_shape,
        observation_dtype=spec.observation_dtype,
        unroll_length=unroll_length,
        num_action_repeats=num_action_repeats,
        frames_per_step=env.frames_per_step,
    )
    return spec, identity


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
    """Episodes reported by actors: [K] arrays of real game returns, agent steps and frames."""

    actor_task: np.ndarray
    episode_return: np.ndarray
    episode_steps: np.ndarray
    episode_frames: np.ndarray


class LearnerService:
    """The learner's side: a bounded trajectory queue and a weight snapshot, served over RPC."""

    def __init__(
        self,
        address: str,
        spec: UnrollSpec,
        identity: dict[str, Any],
        variables: list[tf.Variable],
        learner_index: int,
        num_learners: int,
        queue_capacity: int,
    ):
        """Starts serving at `address` ("host:port").

        Args:
          address: where to listen; "0.0.0.0:port" listens on every interface.
          spec: trajectory shapes.
          identity: settings that an actor must share with this learner (environment, network,
            unroll length...), compared field by field when an actor connects.
          variables: the weights actors fetch, in a fixed order.
          learner_index: this learner's index; actor task i belongs to learner i % num_learners.
          num_learners: the number of learners.
          queue_capacity: trajectories the queue holds before `enqueue` asks actors to wait. A
            chunk is accepted while fewer are queued, so the queue may pass it by one chunk;
            that way a capacity of one batch cannot leave the learner short of a batch while
            every actor waits for room.
        """
        self.spec = spec
        self._identity = run_identity.encode(identity)
        self._variables = list(variables)
        self._learner_index = learner_index
        self._num_learners = num_learners
        self._queue_capacity = queue_capacity
        specs = spec.queue_specs()
        # Unbounded underneath: `_enqueue` bounds it, and never blocks a server thread.
        self._queue = tf.queue.FIFOQueue(
            -1, [s.dtype for s in specs], shapes=[s.shape for s in specs]
        )
        self._episodes = tf.queue.FIFOQueue(
            1 << 20, [tf.int32, tf.float32, tf.int64, tf.int64], shapes=[[], [], [], []]
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
        return int(self._queue.size())

    @property
    def queue_capacity(self) -> int:
        return self._queue_capacity

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
        self._queue.close(cancel_pending_enqueues=True)
        self._episodes.close(cancel_pending_enqueues=True)
        time.sleep(linger_secs)

    def _register_methods(self) -> None:
        scalar = tf.TensorSpec([], tf.int32)
        methods = {
            "hello": (self._hello, [tf.TensorSpec([], tf.string), scalar]),
            "enqueue": (self._enqueue, self.spec.enqueue_signature()),
            "report_episodes": (
                self._report_episodes,
                [scalar] + [tf.TensorSpec([None], t) for t in (tf.float32, tf.int64, tf.int64)],
            ),
            "weights_version": (self._weights_version, []),
            "weights_chunk": (self._weights_chunk, [tf.TensorSpec([], tf.int64)] * 2),
        }
        for name, (method, signature) in methods.items():
            self._server.register(name, tf.function(method, input_signature=signature))

    # ---- RPC methods: run by the server's threads as TensorFlow functions -------------------

    def _hello(self, actor_identity, actor_task):
        """Returns '' if the actor may connect, else the reason it may not."""
        owner = actor_task % self._num_learners
        wrong_learner = tf.strings.format(
            "actor task {} belongs to learner {} (task mod {} learners), not to learner {}",
            (actor_task, owner, self._num_learners, self._learner_index),
        )
        mismatch = tf.where(
            tf.equal(actor_identity, self._identity), "", "MISMATCH:" + self._identity
        )
        return tf.where(tf.equal(owner, self._learner_index), mismatch, wrong_learner)

    def _enqueue(self, actor_task, weight_version, *fields):
        """Queues `n` trajectories; `fields` are the `Steps` fields then the core state."""
        spec = self.spec
        steps, agent_state = _split_steps(fields)
        count = tf.shape(steps.prev_action)[1]
        # Observations arrive as one raw byte string (see the module docstring).
        observation = tf.reshape(
            tf.io.decode_raw(steps.observation, tf.as_dtype(spec.observation_dtype)),
            tf.concat([[spec.unroll_length + 1, count], spec.observation_shape], axis=0),
        )
        steps = steps._replace(observation=observation)
        components = [
            tf.fill([count], actor_task),
            tf.fill([count], weight_version),
            *map(_swap_leading_axes, steps),
            *agent_state,
        ]

        def accept():
            self._queue.enqueue_many(components)
            self._received.assign_add(tf.cast(count, tf.int64))
            return tf.constant(ACCEPTED)

        # Never block a server thread on a full queue: the actor retries shortly (backpressure
        # without RPCs that outlive a learner). A chunk that does not fit whole is still let in
        # while the queue is not full: refusing it could leave fewer than a batch queued and
        # every actor waiting for room (a deadlock when the capacity is close to a batch).
        full = self._queue.size() >= self._queue_capacity
        return tf.cond(
            self._finished,
            lambda: tf.constant(FINISHED),
            lambda: tf.cond(full, lambda: tf.constant(QUEUE_FULL), accept),
        )

    def _report_episodes(self, actor_task, episode_return, episode_steps, episode_frames):
        count = tf.shape(episode_return)[0]
        self._episodes.enqueue_many(
            [tf.fill([count], actor_task), episode_return, episode_steps, episode_frames]
        )
        return tf.constant(True)

    def _weights_version(self):
        return tf.where(self._finished, tf.constant(_FINISHED_VERSION, tf.int64), self._version)

    def _weights_chunk(self, offset, length):
        """Returns (version, snapshot bytes, snapshot[offset:offset + length]) from one read."""
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
        actor_task, weight_version, *fields = self._queue.dequeue_many(batch_size)
        steps, agent_state = _split_steps(fields)
        return QueuedTrajectories(
            actor_task,
            weight_version,
            agent_state=agent_state,
            steps=Steps(*map(_swap_leading_axes, steps)),
        )


def _split_steps(fields: Sequence[tf.Tensor]) -> tuple[Steps, list[tf.Tensor]]:
    """Splits the `Steps` fields off the front of a flat list; the rest is the core state."""
    num_step_fields = len(Steps._fields)
    return Steps(*fields[:num_step_fields]), list(fields[num_step_fields:])


def _trajectory_bytes(unroll: Unroll) -> int:
    """Bytes one trajectory of `unroll` takes, all fields counted (about its size on the wire)."""
    fields = [*unroll.steps, *tf.nest.flatten(unroll.agent_state)]
    return sum(np.asarray(field).nbytes for field in fields) // unroll.steps.prev_action.shape[1]


_EMPTY_EPISODES = (
    np.zeros([0], np.int32),
    np.zeros([0], np.float32),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
)


def _swap_leading_axes(tensor: tf.Tensor) -> tf.Tensor:
    """[T, B, ...] <-> [B, T, ...]."""
    return tf.transpose(tensor, [1, 0, *range(2, len(tensor.shape))])


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
    ):
        """Connects to the learner at `address` and checks that both sides agree.

        Args:
          timeout_secs: the deadline of every call; the learner never holds a call for long.
          connect_timeout_secs: how long to try reaching the learner (default: timeout_secs).

        Raises:
          MismatchError: naming every setting that differs from the learner's, or if this
            actor belongs to another learner.
          LearnerUnreachableError: no learner answered.
        """
        self._address = address
        self._timeout_ms = int(timeout_secs * 1000)
        self._task = actor_task
        self._spec = spec
        self._variables = list(variables)
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
          LearnerUnreachableError: the learner did not answer.
        """
        num_envs = unroll.steps.prev_action.shape[1]
        per_chunk = max(1, MAX_MESSAGE_BYTES // max(1, _trajectory_bytes(unroll)))
        chunks = [
            self._chunk_args(unroll, slice(start, min(start + per_chunk, num_envs)))
            for start in range(0, num_envs, per_chunk)
        ]
        backoff = 0.002
        while chunks:
            # All chunks in flight at once; those refused for a full queue go again.
            pending = [(args, self._start_call("enqueue", args)) for args in chunks]
            statuses = [(args, int(self._check(result, "enqueue"))) for args, result in pending]
            if any(status == FINISHED for _, status in statuses):
                raise LearnerFinishedError(f"learner at {self._address} has finished")
            chunks = [args for args, status in statuses if status == QUEUE_FULL]
            if chunks:
                time.sleep(backoff)
                backoff = min(2 * backoff, 0.05)

    def _chunk_args(self, unroll: Unroll, envs: slice) -> list:
        """`enqueue`'s arguments for the trajectories of environments `envs`."""
        steps = Steps(*(field[:, envs] for field in unroll.steps))
        # A byte string travels far faster than a uint8 tensor (see the module docstring).
        observation = tf.constant(np.ascontiguousarray(steps.observation).tobytes())
        return [
            tf.constant(self._task, tf.int32),
            tf.constant(unroll.weight_version, tf.int64),
            *steps._replace(observation=observation),
            *(state[envs] for state in tf.nest.flatten(unroll.agent_state)),
        ]

    def report_episodes(self, episodes) -> None:
        """Sends finished episodes' real scores, agent steps and frames to the learner."""
        if not episodes:
            return
        self._call(
            "report_episodes",
            tf.constant(self._task, tf.int32),
            tf.constant([e.episode_return for e in episodes], tf.float32),
            tf.constant([e.episode_steps for e in episodes], tf.int64),
            tf.constant([e.episode_frames for e in episodes], tf.int64),
        )

    def learner_version(self) -> int:
        """The learner's weight version (-1 before it publishes any).

        Raises:
          LearnerFinishedError: the learner has finished.
        """
        version = int(self._call("weights_version"))
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
            if version is None:
                version, total = int(chunk_version), int(body_size)
            elif int(chunk_version) != version:
                return None
            chunks.append(chunk.numpy())
            offset += MAX_MESSAGE_BYTES
        flat = tf.io.parse_tensor(b"".join(chunks), tf.float32).numpy()
        return flat, version

    def _call(self, method: str, *args):
        return self._check(self._start_call(method, list(args)), method)

    def _start_call(self, method: str, args: list):
        specs = self._client._method_registry[method]  # fetched from the server on connect
        # An explicit deadline on every call: without one, a call to a learner that died
        # waits forever.
        return self._client.call(method, args, output_specs=specs, timeout_in_ms=self._timeout_ms)

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
            # The learner closed its queue while this enqueue waited for room in it.
            raise LearnerFinishedError(f"learner at {self._address} has finished")
        raise error_type(None, None, f"{method} on learner {self._address}: {message}")
