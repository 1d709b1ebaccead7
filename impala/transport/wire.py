"""What an actor and its learner must agree on: the gRPC methods, the run secret's place in a
call, the byte layout of every request and reply, size limits, status codes and errors.

No protobuf and no TensorFlow travel: every message is raw bytes of a layout fixed here, and a
learner checks a request's length against the layout (and its limit) before it reads a field.
All integers and floats are little-endian. `T` is the unroll length, `n` a chunk's trajectory
count, `A` the number of actions, `K` an episode count.

Methods (`/impala.Learner/<name>`), each a request and its reply:
- `Hello`: `<i` actor task, then the actor's identity as UTF-8 JSON -> UTF-8 text: '' for a
  welcome, `MISMATCH:` and the learner's identity, or why the actor may not connect.
- `Room`: `<i` actor task -> `<i` status.
- `Enqueue`: `<iqi` actor task, weight version, n; then n trajectories' fields (below) ->
  `<i` status.
- `ReportEpisodes`: `<ii` actor task, K; then K `<f4` returns, K `<i8` agent steps, K `<i8`
  frames, K `<i8` start frames -> `<i` status.
- `WeightsVersion`: empty -> `<q` version (-1: none yet, -2: finished).
- `Weights`: `<q` the version the caller holds -> `<q` version; then, if it is >= 0 and not
  the caller's, every weight as `<f4`, the variables in order, each flattened.
- `PolicyStatus` (population-based training: another policy's rank-0 learner asks): empty ->
  UTF-8 JSON of the policy's state for ranking (`impala/learner/pbt.py`), `{}` before its
  first step; at most `MAX_STATUS_BYTES`.
- `PolicyState` (the same, to copy a policy): empty -> `<I` header length, a UTF-8 JSON header
  (at most `MAX_STATE_HEADER_BYTES`: the policy, its frames and hyperparameters, each
  variable's shape and dtype), then every variable's values in its dtype, little-endian; empty
  if the learner could not take a snapshot between two of its steps in time.

An `Enqueue` body holds, one after another and each C-ordered: `prev_action` `<i4` [T + 1, n],
`reward` `<f4` [T + 1, n], `done` `u1` [T + 1, n] (0 or 1), `observation` [T + 1, n, *shape]
in the spec's dtype, `action` `<i4` [T + 1, n], `policy_logits` `<f4` [T + 1, n, A], then each
component of the agent's core state, [n, *shape] in its dtype.

Every call carries the run secret in its metadata under `SECRET_KEY`. A learner compares it, in
constant time, before it runs any handler or reads the request (`authentication.py`); a call
without it ends with gRPC's UNAUTHENTICATED, whatever method it names, and learns nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from typing import Any

import numpy as np

from impala import run_identity
from impala.trajectory import Steps

SERVICE = "impala.Learner"
METHODS = (
    "Hello",
    "Room",
    "Enqueue",
    "ReportEpisodes",
    "WeightsVersion",
    "Weights",
    "PolicyStatus",
    "PolicyState",
)
# gRPC metadata key of the run secret (lower case, as gRPC requires).
SECRET_KEY = "impala-secret"

# An `Enqueue` chunk holds as many whole trajectories as fit in this many bytes (at least one):
# a call's memory on the learner is bounded by its message, so messages are kept small.
MAX_MESSAGE_BYTES = 3 << 20
# Limits of the small requests, checked before anything is read from them.
MAX_HELLO_BYTES = 64 << 10
MAX_EPISODES_PER_REPORT = 1024
# Limits of what population-based training's methods answer, checked by the asking learner.
MAX_STATUS_BYTES = 64 << 10
MAX_STATE_HEADER_BYTES = 1 << 20
STATE_HEADER = struct.Struct("<I")

TASK = struct.Struct("<i")
STATUS = struct.Struct("<i")
VERSION = struct.Struct("<q")
ENQUEUE_HEADER = struct.Struct("<iqi")
EPISODES_HEADER = struct.Struct("<ii")
# Bytes of one reported episode: its return, agent steps, frames and start frames.
EPISODE_BYTES = 4 + 8 + 8 + 8

# What `Room`, `Enqueue` and `ReportEpisodes` answer: REFUSED for trajectories or episodes that
# fail the learner's checks (`REFUSAL_REASONS`), UNKNOWN_ACTOR for trajectories from an actor
# task of this learner's that has not said `Hello` to it (the learner restarted since the actor
# connected).
ACCEPTED, QUEUE_FULL, FINISHED, REFUSED, UNKNOWN_ACTOR = 0, 1, 2, 4, 5
# What `WeightsVersion` and `Weights` answer before the first weights and once finished.
NO_WEIGHTS_VERSION = -1
FINISHED_VERSION = -2
# Why a learner refuses a call, in the order of its refusal counters.
REFUSAL_REASONS = (
    "wrong secret",
    "actor task not this learner's",
    "malformed",
    "action out of range",
    "non-finite value",
    "negative weight version",
    "value out of bounds",
    "too many episodes",
)


class LearnerFinishedError(RuntimeError):
    """The learner stopped accepting trajectories: training is over."""


class LearnerUnreachableError(ConnectionError):
    """The learner did not answer (it died, or the network between us failed)."""


class LearnerRestartedError(LearnerUnreachableError):
    """The learner at this address restarted since the actor connected: connect again.

    gRPC reconnects on its own to a learner that comes back, so calls can reach the new learner
    without its having checked the actor (`Hello`).
    """


class MismatchError(ValueError):
    """The actor and the learner were started with incompatible settings."""


class AuthenticationError(ValueError):
    """The learner refused this process's run secret."""


class ProtocolError(RuntimeError):
    """A request or reply that does not follow this module's layout."""


def method_path(name: str) -> str:
    """The gRPC path of a learner method, e.g. '/impala.Learner/Enqueue'."""
    return f"/{SERVICE}/{name}"


@dataclasses.dataclass(frozen=True)
class UnrollSpec:
    """Shapes of one trajectory as it travels and as it sits in a learner's queue.

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

    def step_fields(self) -> Steps:
        """Each `Steps` field's (wire dtype, shape of one step of one trajectory)."""
        return Steps(
            prev_action=(np.dtype("<i4"), ()),
            reward=(np.dtype("<f4"), ()),
            done=(np.dtype("u1"), ()),
            observation=(_little_endian(self.observation_dtype), tuple(self.observation_shape)),
            action=(np.dtype("<i4"), ()),
            policy_logits=(np.dtype("<f4"), (self.num_actions,)),
        )

    def state_fields(self) -> list[tuple[np.dtype, tuple[int, ...]]]:
        """Each core-state component's (wire dtype, shape of one trajectory's)."""
        return [
            (_little_endian(dtype), tuple(shape))
            for shape, dtype in zip(self.state_shapes, self.state_dtypes, strict=True)
        ]

    @property
    def trajectory_bytes(self) -> int:
        """Bytes of one trajectory on the wire, every field counted."""
        steps = (self.unroll_length + 1) * sum(
            dtype.itemsize * math.prod(shape) for dtype, shape in self.step_fields()
        )
        return steps + sum(
            dtype.itemsize * math.prod(shape) for dtype, shape in self.state_fields()
        )

    @property
    def chunk_trajectories(self) -> int:
        """The most trajectories one `Enqueue` carries: those that fit `MAX_MESSAGE_BYTES`."""
        return max(1, MAX_MESSAGE_BYTES // self.trajectory_bytes)

    @property
    def max_enqueue_bytes(self) -> int:
        """The largest `Enqueue` request: a full chunk."""
        return ENQUEUE_HEADER.size + self.chunk_trajectories * self.trajectory_bytes

    def queue_specs(self) -> list:
        """Per-trajectory components in queue order (see `queueing.QueuedTrajectories`), as
        `tf.TensorSpec`s: the actor task, the weight version, the `Steps` fields [T + 1, ...],
        the flattened core state."""
        import tensorflow as tf

        return [
            tf.TensorSpec([], tf.int32),  # actor task
            tf.TensorSpec([], tf.int64),  # weight version
            *(
                tf.TensorSpec([self.unroll_length + 1, *shape], _tensor_dtype(name, dtype))
                for name, (dtype, shape) in zip(Steps._fields, self.step_fields(), strict=True)
            ),
            *(
                tf.TensorSpec(shape, dtype.newbyteorder("="))
                for dtype, shape in self.state_fields()
            ),
        ]


def _little_endian(dtype_name: str) -> np.dtype:
    return np.dtype(dtype_name).newbyteorder("<")


def _tensor_dtype(field: str, wire_dtype: np.dtype) -> np.dtype:
    """The dtype a field has on the learner: `done` travels as bytes and is a bool there."""
    return np.dtype(bool) if field == "done" else wire_dtype.newbyteorder("=")


def describe(
    env, agent, unroll_length: int, level_name: str, num_action_repeats: int
) -> tuple[UnrollSpec, dict[str, Any]]:
    """The trajectory spec and the identity an actor and its learner must share.

    Args:
      env: an `environments.VectorEnvironment` (its observation spec, actions, frame skip and
        frame pooling).
      agent: a `networks.Agent` (its class and core state).
    """
    import tensorflow as tf

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


# ---- Requests and replies ---------------------------------------------------------------------


def encode_hello(actor_task: int, identity: dict[str, Any]) -> bytes:
    return TASK.pack(actor_task) + run_identity.encode(identity).encode()


def decode_hello(request: bytes) -> tuple[int, dict[str, Any] | None]:
    """(actor task, identity, or None if it is not a JSON object).

    Raises:
      ProtocolError: too short or too long.
    """
    if not TASK.size <= len(request) <= MAX_HELLO_BYTES:
        raise ProtocolError(f"Hello of {len(request)} bytes")
    (actor_task,) = TASK.unpack_from(request)
    try:
        identity = json.loads(request[TASK.size :].decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        return actor_task, None
    return actor_task, identity if isinstance(identity, dict) else None


def encode_enqueue(
    actor_task: int, weight_version: int, steps: Steps, agent_state: list[np.ndarray]
) -> bytes:
    """An `Enqueue` request: the trajectories of `steps` ([T + 1, n, ...]) and `agent_state`
    ([n, ...] each), written as they are (the learner checks them)."""
    count = np.shape(steps.prev_action)[1]
    fields = [*steps._replace(done=np.asarray(steps.done).astype(np.uint8)), *agent_state]
    return b"".join(
        [ENQUEUE_HEADER.pack(actor_task, weight_version, count)]
        + [memoryview(np.ascontiguousarray(field)).cast("B") for field in fields]
    )


def enqueue_header(request: bytes) -> tuple[int, int, int]:
    """(actor task, weight version, trajectory count) of an `Enqueue` request.

    Raises:
      ProtocolError: the request is shorter than its header.
    """
    if len(request) < ENQUEUE_HEADER.size:
        raise ProtocolError(f"Enqueue of {len(request)} bytes")
    return ENQUEUE_HEADER.unpack_from(request)


def decode_enqueue(spec: UnrollSpec, request: bytes) -> tuple[Steps, list[np.ndarray]]:
    """The `Steps` ([T + 1, n, ...]) and core state ([n, ...]) of an `Enqueue` request, as
    read-only views of `request` (nothing is copied).

    Raises:
      ProtocolError: the count is outside 1..`spec.chunk_trajectories` or the length is not
        exactly what the count implies.
    """
    _, _, count = enqueue_header(request)
    if not 1 <= count <= spec.chunk_trajectories:
        raise ProtocolError(f"Enqueue of {count} trajectories")
    expected = ENQUEUE_HEADER.size + count * spec.trajectory_bytes
    if len(request) != expected:
        raise ProtocolError(f"Enqueue of {len(request)} bytes for {count} trajectories")
    offset = ENQUEUE_HEADER.size
    fields = []
    time_major = (spec.unroll_length + 1, count)
    for leading, (dtype, shape) in [(time_major, field) for field in spec.step_fields()] + [
        ((count,), field) for field in spec.state_fields()
    ]:
        size = math.prod(leading) * math.prod(shape)
        fields.append(np.frombuffer(request, dtype, size, offset).reshape(*leading, *shape))
        offset += size * dtype.itemsize
    num_steps = len(Steps._fields)
    return Steps(*fields[:num_steps]), fields[num_steps:]


def encode_episodes(actor_task: int, returns, steps, frames, start_frames) -> bytes:
    count = len(returns)
    return b"".join(
        [
            EPISODES_HEADER.pack(actor_task, count),
            np.asarray(returns, "<f4").tobytes(),
            np.asarray(steps, "<i8").tobytes(),
            np.asarray(frames, "<i8").tobytes(),
            np.asarray(start_frames, "<i8").tobytes(),
        ]
    )


def decode_episodes(request: bytes) -> tuple[int, tuple[np.ndarray, ...]]:
    """(actor task, (returns, agent steps, frames, start frames)) of a `ReportEpisodes`.

    Raises:
      ProtocolError: the count is outside 1..`MAX_EPISODES_PER_REPORT` or the length is not
        what it implies.
    """
    if len(request) < EPISODES_HEADER.size:
        raise ProtocolError(f"ReportEpisodes of {len(request)} bytes")
    actor_task, count = EPISODES_HEADER.unpack_from(request)
    if not 1 <= count <= MAX_EPISODES_PER_REPORT:
        raise ProtocolError(f"ReportEpisodes of {count} episodes")
    if len(request) != EPISODES_HEADER.size + count * EPISODE_BYTES:
        raise ProtocolError(f"ReportEpisodes of {len(request)} bytes for {count} episodes")
    offset = EPISODES_HEADER.size
    fields = []
    for dtype in ("<f4", "<i8", "<i8", "<i8"):
        fields.append(np.frombuffer(request, dtype, count, offset))
        offset += count * np.dtype(dtype).itemsize
    return actor_task, tuple(fields)


def unpack_exact(layout: struct.Struct, message: bytes, what: str) -> tuple:
    """`layout.unpack(message)`, or ProtocolError naming `what` if the length differs."""
    if len(message) != layout.size:
        raise ProtocolError(f"{what} of {len(message)} bytes, not {layout.size}")
    return layout.unpack(message)
