"""The learner's side of the transport: `LearnerService`, an RPC server over its trajectory store.

A new transport is a new server and client pair implementing the same methods (see the package
docstring).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from impala import run_identity
from impala.learner.store import FifoStore, TrajectoryStore
from impala.trajectory import Steps
from impala.transport.wire import (
    _FINISHED_VERSION,
    _VERSION_DIGITS,
    ACCEPTED,
    FINISHED,
    QUEUE_FULL,
    UnrollSpec,
    _split_steps,
    _swap_leading_axes,
)

_rpc = tf.distribute.experimental.rpc


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
    """The learner's side: a trajectory store and a weight snapshot, served over RPC.

    Trajectories go into a `TrajectoryStore` (`impala/learner/store.py`): a bounded FIFO queue
    by default. A replay scheme is a new `TrajectoryStore` in that file, passed as `store`.
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
        store: TrajectoryStore | None = None,
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
          queue_capacity: trajectories the queue holds before `enqueue` asks actors to wait,
            for a `FifoStore` (see there) made here; give either this or `store`.
          store: where trajectories wait for the learner; its `capacity` is `queue_capacity`.
        """
        if (queue_capacity is None) == (store is None):
            raise ValueError(
                "LearnerService needs either queue_capacity (for a FIFO queue) or a store, "
                f"not both or neither: got queue_capacity={queue_capacity}, store={store}"
            )
        self.spec = spec
        self._identity = run_identity.encode(identity)
        self._variables = list(variables)
        self._learner_index = learner_index
        self._num_learners = num_learners
        self._store = store if store is not None else FifoStore(spec.queue_specs(), queue_capacity)
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
        return int(self._store.size())

    @property
    def queue_capacity(self) -> int:
        return self._store.capacity

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
        # Observations arrive as one raw byte string (see the package docstring).
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

        def accepted():
            self._received.assign_add(tf.cast(count, tf.int64))
            return tf.constant(ACCEPTED)

        # Never block a server thread on a full store: `admit` refuses the chunk, and the actor
        # retries shortly (backpressure without RPCs that outlive a learner).
        def admit():
            admitted = self._store.admit(components)
            return tf.cond(admitted, accepted, lambda: tf.constant(QUEUE_FULL))

        return tf.cond(self._finished, lambda: tf.constant(FINISHED), admit)

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
        actor_task, weight_version, *fields = self._store.take(batch_size)
        steps, agent_state = _split_steps(fields)
        return QueuedTrajectories(
            actor_task,
            weight_version,
            agent_state=agent_state,
            steps=Steps(*map(_swap_leading_axes, steps)),
        )


_EMPTY_EPISODES = (
    np.zeros([0], np.int32),
    np.zeros([0], np.float32),
    np.zeros([0], np.int64),
    np.zeros([0], np.int64),
)
