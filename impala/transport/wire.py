"""What an actor and its learner must agree on: the trajectory spec and the RPC arguments it
implies, the size limit of a message, status codes, errors and the encoding helpers both sides use.

How things travel, and why, is in the package docstring (`impala.transport`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from impala import run_identity
from impala.trajectory import Steps, Unroll

# Under gRPC's 4 MiB limit, leaving room for the other fields and the message framing.
MAX_MESSAGE_BYTES = 3 << 20
# Width of the zero-padded weight version that prefixes each weight chunk.
_VERSION_DIGITS = 20


class LearnerFinishedError(RuntimeError):
    """The learner stopped accepting trajectories: training is over."""


class LearnerUnreachableError(ConnectionError):
    """The learner did not answer (it died, or the network between us failed)."""


class LearnerRestartedError(LearnerUnreachableError):
    """The learner at this address restarted since the actor connected: connect again.

    The RPC layer reconnects on its own to a learner that comes back within a call's deadline,
    so calls can reach the new learner without its having checked the actor (`hello`).
    """


# The RPC methods a learner serves (see the package docstring).
LEARNER_METHODS = (
    "hello",
    "room",
    "enqueue",
    "report_episodes",
    "weights_version",
    "weights_chunk",
)
# What `room`, `enqueue` and `report_episodes` answer: UNAUTHORIZED for a call without the run's
# secret, REFUSED for trajectories or episodes that fail the learner's checks (`REFUSAL_REASONS`),
# UNKNOWN_ACTOR for trajectories from an actor task of this learner's that has not said `hello`
# to it (the learner restarted since the actor connected).
ACCEPTED, QUEUE_FULL, FINISHED, UNAUTHORIZED, REFUSED, UNKNOWN_ACTOR = 0, 1, 2, 3, 4, 5
# What `weights_version` answers once the learner has finished, and to a call without the secret.
_FINISHED_VERSION = -2
_UNAUTHORIZED_VERSION = -3
# What `hello` answers to a call without the secret.
_UNAUTHORIZED_HELLO = "UNAUTHORIZED"
# Why a learner refuses a call, in the order of its refusal counters.
REFUSAL_REASONS = (
    "wrong secret",
    "actor task not this learner's",
    "malformed",
    "action out of range",
    "non-finite value",
    "negative weight version",
)


class MismatchError(ValueError):
    """The actor and the learner were started with incompatible settings."""


class AuthenticationError(ValueError):
    """The learner refused this process's run secret."""


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
        """Per-trajectory components in queue order (see `server.QueuedTrajectories`).

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

        The run secret, the actor task, the weight version, the `Steps` fields [T + 1, n, ...]
        (observations as one raw byte string), the flattened core state [n, ...].
        """
        step_specs = self._step_specs([self.unroll_length + 1, None])
        return [
            tf.TensorSpec([], tf.string),  # run secret
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
      env: an `environments.VectorEnvironment` (its observation spec, actions, frame skip and
        frame pooling).
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
        frame_pooling=env.frame_pooling,
    )
    return spec, identity


def _split_steps(fields: Sequence[tf.Tensor]) -> tuple[Steps, list[tf.Tensor]]:
    """Splits the `Steps` fields off the front of a flat list; the rest is the core state."""
    num_step_fields = len(Steps._fields)
    return Steps(*fields[:num_step_fields]), list(fields[num_step_fields:])


def _trajectory_bytes(unroll: Unroll) -> int:
    """Bytes one trajectory of `unroll` takes, all fields counted (about its size on the wire)."""
    fields = [*unroll.steps, *tf.nest.flatten(unroll.agent_state)]
    return sum(np.asarray(field).nbytes for field in fields) // unroll.steps.prev_action.shape[1]


def observation_bytes(observation: np.ndarray) -> tf.Tensor:
    """Observations as the scalar string tensor they travel as (see the package docstring).

    Made a tensor through a 0-d NumPy object array: `tf.constant` of the bytes themselves takes
    several times as long (benchmarks/transport_encoding.py measures both).
    """
    return tf.constant(np.array(np.ascontiguousarray(observation).tobytes(), dtype=object))


def _swap_leading_axes(tensor: tf.Tensor) -> tf.Tensor:
    """[T, B, ...] <-> [B, T, ...]."""
    return tf.transpose(tensor, [1, 0, *range(2, len(tensor.shape))])
