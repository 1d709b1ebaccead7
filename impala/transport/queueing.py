"""Trajectories between the wire and the learner's store, in TensorFlow.

Chunks come off the wire time-major ([T + 1, n, ...] steps); a `TrajectoryStore`
(`impala/trajectory_store.py`) keeps them batch-major; the learner takes batches time-major
again (`QueuedTrajectories`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from impala.trajectory import Steps
from impala.trajectory_store import TrajectoryStore
from impala.transport.wire import UnrollSpec


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


class TrajectoryQueue:
    """A store, fed the wire's chunks and read in the learner's batches."""

    def __init__(self, spec: UnrollSpec, store: TrajectoryStore):
        self.store = store
        self._admit = tf.function(self._admit_chunk, input_signature=_chunk_signature(spec))

    def admit(
        self, actor_task: int, weight_version: int, steps: Steps, agent_state: list[np.ndarray]
    ) -> bool:
        """Stores the `n` trajectories of a checked chunk (`Steps` fields [T + 1, n, ...], core
        state [n, ...]) from `actor_task`, made with weights `weight_version`; False if the
        store is full."""
        count = steps.prev_action.shape[1]
        steps = steps._replace(done=steps.done.view(bool))
        admitted = self._admit(
            np.full([count], actor_task, np.int32),
            np.full([count], weight_version, np.int64),
            *steps,
            *agent_state,
        )
        return bool(admitted)

    def has_room(self) -> bool:
        return bool(self.store.has_room())

    def dequeue(self, batch_size: int) -> QueuedTrajectories:
        """Blocks until `batch_size` trajectories are stored and returns them, time-major."""
        return self._dequeue(tf.constant(batch_size))

    def _admit_chunk(self, actor_task, weight_version, *fields):
        steps = Steps(*fields[: len(Steps._fields)])
        agent_state = list(fields[len(Steps._fields) :])
        return self.store.admit(
            [actor_task, weight_version, *map(_swap_leading_axes, steps), *agent_state]
        )

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def _dequeue(self, batch_size):
        actor_task, weight_version, *fields = self.store.take(batch_size)
        steps = Steps(*fields[: len(Steps._fields)])
        return QueuedTrajectories(
            actor_task,
            weight_version,
            agent_state=list(fields[len(Steps._fields) :]),
            steps=Steps(*map(_swap_leading_axes, steps)),
        )


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


def _swap_leading_axes(tensor: tf.Tensor) -> tf.Tensor:
    """[T, B, ...] <-> [B, T, ...]."""
    return tf.transpose(tensor, [1, 0, *range(2, len(tensor.shape))])
