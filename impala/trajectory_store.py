"""Where a learner keeps the trajectories actors send until it trains on them.

`TrajectoryStore` is the seam: the learner's service (`impala.transport.server.LearnerService`)
admits every chunk an actor sends into its store and takes its training batches from it.
`FifoStore` is today's store, a first-in first-out queue: every trajectory is trained on once.
A replay scheme (a buffer mixing stored unrolls with fresh ones, say) is a new `TrajectoryStore`
registered in `STORES` under its name; `make_store` builds a store by name, and the service
takes the store it is handed (or builds the default, `DEFAULT_STORE`, from a capacity).

A trajectory is a list of components in `UnrollSpec.queue_specs()` order: the actor task, the
weight version, the `Steps` fields [T + 1, ...], the flattened core state. Stores move them
batch-major, [n, ...] per component.

Shared by the transport (which fills the store) and the learner (which sizes it): neither
imports the other for it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence

import tensorflow as tf


class TrajectoryStore(abc.ABC):
    """Trajectories between the actors' RPCs and the learner's batches.

    `admit` runs inside a TensorFlow function that the transport calls on its server threads,
    and `take` inside the learner's dequeue function: both build graph-mode TensorFlow ops
    (which also run eagerly). The store must be safe to call from several server threads at
    once.
    """

    @abc.abstractmethod
    def admit(self, components: Sequence[tf.Tensor]) -> tf.Tensor:
        """Stores a chunk of `n` trajectories unless the store is full.

        Never blocks: a full store answers False, and the actor asks for room (`has_room`)
        until there is some (backpressure without RPCs that outlive a learner).

        Args:
          components: the chunk, each component [n, ...] in `UnrollSpec.queue_specs()` order.

        Returns:
          A scalar bool tensor: True if the chunk was stored, False if the store is full.
        """

    @abc.abstractmethod
    def has_room(self) -> tf.Tensor:
        """A scalar bool tensor: whether `admit` would store a chunk now.

        Actors ask this before they send an unroll, so that a full store costs them a small
        call rather than a refused unroll of megabytes. It must answer False whenever `admit`
        would refuse any chunk: an actor told there is room sends at once.
        """

    @abc.abstractmethod
    def take(self, batch_size: tf.Tensor) -> list[tf.Tensor]:
        """Blocks until a batch can be taken and returns it, each component [batch_size, ...].

        After `close`, still returns what is stored; fails once too little is left.
        """

    @abc.abstractmethod
    def size(self) -> tf.Tensor:
        """Scalar int32 tensor: the trajectories stored now. Only `admit` may make it grow:
        the learner sleeps until the service that admits a chunk wakes it."""

    @property
    @abc.abstractmethod
    def capacity(self) -> int:
        """Trajectories the store holds before `admit` says it is full."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stops admitting trajectories; what is stored can still be taken."""


class FifoStore(TrajectoryStore):
    """A first-in first-out queue: each trajectory is taken once, in the order it came."""

    def __init__(self, specs: Sequence[tf.TensorSpec], capacity: int):
        """An empty queue.

        Args:
          specs: one trajectory's components, `UnrollSpec.queue_specs()`.
          capacity: trajectories the queue holds before it refuses chunks (actors then wait for
            room). A chunk is accepted while fewer are queued, so the queue may pass it (by up to
            an unroll, whose chunks arrive together on several server threads); that way a
            capacity of one batch cannot leave the learner short of a batch while every actor
            waits for room.
        """
        self._capacity = capacity
        # Unbounded underneath: `admit` bounds it, and never blocks a server thread.
        self._queue = tf.queue.FIFOQueue(
            -1, [s.dtype for s in specs], shapes=[s.shape for s in specs]
        )

    def admit(self, components: Sequence[tf.Tensor]) -> tf.Tensor:
        def insert():
            self._queue.enqueue_many(components)
            return tf.constant(True)

        return tf.cond(self.has_room(), insert, lambda: tf.constant(False))

    def has_room(self) -> tf.Tensor:
        # A chunk that does not fit whole is still let in while the queue is not full: refusing
        # it could leave fewer than a batch queued and every actor waiting for room (a deadlock
        # when the capacity is close to a batch).
        return self._queue.size() < self._capacity

    def take(self, batch_size: tf.Tensor) -> list[tf.Tensor]:
        return self._queue.dequeue_many(batch_size)

    def size(self) -> tf.Tensor:
        return self._queue.size()

    @property
    def capacity(self) -> int:
        return self._capacity

    def close(self) -> None:
        self._queue.close(cancel_pending_enqueues=True)


# Every kind of store, by name: each is made from one trajectory's components
# (`UnrollSpec.queue_specs()`) and the trajectories it holds before actors wait for room.
STORES: dict[str, Callable[[Sequence[tf.TensorSpec], int], TrajectoryStore]] = {
    "fifo": FifoStore,
}
DEFAULT_STORE = "fifo"


def make_store(kind: str, specs: Sequence[tf.TensorSpec], capacity: int) -> TrajectoryStore:
    """An empty store of `kind` (a name in `STORES`).

    Raises:
      ValueError: `kind` names no store.
    """
    if kind not in STORES:
        raise ValueError(f"trajectory store {kind!r}: not one of {', '.join(sorted(STORES))}")
    return STORES[kind](specs, capacity)
