"""Horovod: everything the learners do to stay identical, in one place.

Learners run under `mpirun` (or alone, as a world of one). They start from rank 0's variables and
optimizer state, average their gradients every step, and so hold identical weights after every
step. Only rank 0 writes logs meant for people.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from impala import configs


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this learner sits among all learners."""

    rank: int
    size: int
    local_rank: int

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def init() -> Topology:
    """Joins the learners (a world of one without `mpirun`) and picks this learner's GPU."""
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        # Horovod: one GPU per learner process, chosen by its rank on this host.
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank() % len(gpus)], True)
    return Topology(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank())


def wrap_tape(tape: tf.GradientTape, compression: str = "none") -> tf.GradientTape:
    """Makes `tape.gradient` return gradients averaged over all learners, sent as float32
    (`compression` "none") or float16 ("fp16": half the bytes on the wire)."""
    # Horovod: each learner's loss sums over its own batch, so the average keeps the paper's
    # per-batch scale and the learning rates need no change with the number of learners.
    compressor = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
    return hvd.DistributedGradientTape(tape, compression=compressor)


def tape_wrapper(compression: str):
    """`wrap_tape` with `compression` (`configs.GRADIENT_COMPRESSIONS`), for the Trainer."""
    if compression not in configs.GRADIENT_COMPRESSIONS:
        raise ValueError(
            f"--gradient_compression={compression}: must be one of "
            f"{', '.join(configs.GRADIENT_COMPRESSIONS)}"
        )
    return functools.partial(wrap_tape, compression=compression)


def gradient_reducer(compression: str = "none") -> Callable[[list[tf.Tensor]], list[tf.Tensor]]:
    """Asynchronous gradients' all-reduce (`Trainer`'s `delayed_reduce`): the average over all
    learners of a list of gradients, in one grouped all-reduce, sent as float32 or float16."""
    if compression not in configs.GRADIENT_COMPRESSIONS:
        raise ValueError(
            f"--gradient_compression={compression}: must be one of "
            f"{', '.join(configs.GRADIENT_COMPRESSIONS)}"
        )
    compressor = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none

    def reduce(gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        return hvd.grouped_allreduce(
            gradients, op=hvd.Average, compression=compressor, name="delayed_gradients"
        )

    return reduce


def every_learner(flag: tf.Tensor) -> tf.Tensor:
    """True where the bool scalar `flag` is True on every learner (inside the train step)."""
    # Horovod: the minimum of 0 and 1 over the learners, so that all take the same branch after
    # it (the train step's: apply this step or skip it). Every learner calls it once a step.
    return hvd.allreduce(tf.cast(flag, tf.float32), op=hvd.Min, name="every_learner") > 0.5


def broadcast_from_chief(variables: list[tf.Variable]) -> None:
    """Overwrites `variables` with rank 0's values on every learner."""
    # Horovod: called once the network and the optimizer slots exist, so both are covered.
    hvd.broadcast_variables(variables, root_rank=0)


def broadcast_object_from_chief(value: Any) -> Any:
    """Rank 0's `value` (any picklable object), on every learner."""
    return hvd.broadcast_object(value, root_rank=0, name="broadcast_object")


def wait_for_learners(name: str) -> None:
    """Returns once every learner has called it (a barrier)."""
    hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name=name)


def gather_from_learners(values: np.ndarray, name: str) -> np.ndarray:
    """Concatenates a [K_i, ...] array from every learner (K_i may differ) along axis 0."""
    return hvd.allgather(tf.convert_to_tensor(values), name=name).numpy()
