"""Horovod: everything the learners do to stay identical, in one place.

Learners run under `mpirun` (or alone, as a world of one). They start from rank 0's variables and
optimizer state, average their gradients every step, and so hold identical weights after every
step. Only rank 0 writes logs meant for people.

A learner alone (one of --learner_hosts, no `mpirun` world of several) never loads Horovod: each
operation here is then what Horovod's would be in a world of one (the average of one gradient is
itself), without Horovod's import, its MPI start and its background thread, or the Keras that its
module loads (`world.joins_others`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from impala import configs
from impala.learner import world

# Horovod's module once a learner of several has joined them (`init`); None for a learner alone.
_hvd = None


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this learner sits among all learners."""

    rank: int
    size: int
    local_rank: int
    local_size: int = 1  # learners of this world on this learner's host

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def init(num_learners: int) -> Topology:
    """Joins the `num_learners` learners (a world of one needs no Horovod) and picks this
    learner's GPU."""
    global _hvd
    if world.joins_others(num_learners):
        try:
            import horovod.tensorflow as hvd
        except ImportError as error:
            # TF_USE_LEGACY_KERAS set where tf_keras is not installed, for one: Horovod's module
            # needs Keras.
            raise ValueError(
                f"a learner of several needs Horovod, which failed to load: {error}"
            ) from None
        hvd.init()
        _hvd = hvd
        topology = Topology(
            rank=hvd.rank(),
            size=hvd.size(),
            local_rank=hvd.local_rank(),
            local_size=hvd.local_size(),
        )
    else:
        topology = Topology(rank=0, size=1, local_rank=0)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        # One GPU per learner process, chosen by its rank on this host.
        gpu = gpus[topology.local_rank % len(gpus)]
        tf.config.set_visible_devices(gpu, "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    return topology


def _compressor(compression: str):
    if compression not in configs.GRADIENT_COMPRESSIONS:
        raise ValueError(
            f"--gradient_compression={compression}: must be one of "
            f"{', '.join(configs.GRADIENT_COMPRESSIONS)}"
        )
    if _hvd is None:
        return None
    return _hvd.Compression.fp16 if compression == "fp16" else _hvd.Compression.none


def wrap_tape(tape: tf.GradientTape, compression: str = "none") -> tf.GradientTape:
    """Makes `tape.gradient` return gradients averaged over all learners, sent as float32
    (`compression` "none") or float16 ("fp16": half the bytes on the wire)."""
    # Horovod: each learner's loss sums over its own batch, so the average keeps the paper's
    # per-batch scale and the learning rates need no change with the number of learners.
    if _hvd is None:
        return tape
    return _hvd.DistributedGradientTape(tape, compression=_compressor(compression))


def tape_wrapper(compression: str):
    """`wrap_tape` with `compression` (`configs.GRADIENT_COMPRESSIONS`), for the Trainer."""
    _compressor(compression)
    return functools.partial(wrap_tape, compression=compression)


def gradient_reducer(compression: str = "none") -> Callable[[list[tf.Tensor]], list[tf.Tensor]]:
    """Asynchronous gradients' all-reduce (`Trainer`'s `delayed_reduce`): the average over all
    learners of a list of gradients, in one grouped all-reduce, sent as float32 or float16."""
    _compressor(compression)

    def reduce(gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        if _hvd is None:
            return gradients
        return _hvd.grouped_allreduce(
            gradients,
            op=_hvd.Average,
            compression=_compressor(compression),
            name="delayed_gradients",
        )

    return reduce


def every_learner(flag: tf.Tensor) -> tf.Tensor:
    """True where the bool scalar `flag` is True on every learner (inside the train step)."""
    # Horovod: the minimum of 0 and 1 over the learners, so that all take the same branch after
    # it (the train step's: apply this step or skip it). Every learner calls it once a step.
    if _hvd is None:
        return flag
    return _hvd.allreduce(tf.cast(flag, tf.float32), op=_hvd.Min, name="every_learner") > 0.5


def broadcast_from_chief(variables: list[tf.Variable]) -> None:
    """Overwrites `variables` with rank 0's values on every learner."""
    # Horovod: called once the network and the optimizer slots exist, so both are covered.
    if _hvd is not None:
        _hvd.broadcast_variables(variables, root_rank=0)


def broadcast_object_from_chief(value: Any) -> Any:
    """Rank 0's `value` (any picklable object), on every learner."""
    if _hvd is None:
        return value
    return _hvd.broadcast_object(value, root_rank=0, name="broadcast_object")


def wait_for_learners(name: str) -> None:
    """Returns once every learner has called it (a barrier)."""
    if _hvd is not None:
        _hvd.allreduce(tf.constant(0.0), op=_hvd.Sum, name=name)


def gather_from_learners(values: np.ndarray, name: str) -> np.ndarray:
    """Concatenates a [K_i, ...] array from every learner (K_i may differ) along axis 0."""
    if _hvd is None:
        return np.asarray(values)
    return _hvd.allgather(tf.convert_to_tensor(values), name=name).numpy()
