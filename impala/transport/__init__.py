"""Actors and learners talk over TensorFlow's own gRPC runtime (`tf.distribute.experimental.rpc`).

Each learner runs a `LearnerService` (`server.py`): an RPC server whose registered TensorFlow
functions put trajectories into the learner's trajectory store (a bounded queue by default, see
`impala/learner/store.py`) and hand out its weights. Each actor holds an `ActorClient`
(`client.py`) connected to its learner. What both sides must agree on, the trajectory spec and
the arguments it implies, status codes, errors and encoding helpers, is in `wire.py`.

Every call carries the run secret (`impala/run_secret.py`) as its first argument: the learner
compares it in constant time and answers a call without it with a refusal, and nothing else (no
weights, nothing queued, no episode recorded). Everything an actor sends is checked on arrival,
and a bad chunk is refused and counted (`LearnerService.refusals`), so that the learner keeps
training whatever arrives. Traffic is not encrypted (see the README's threat model).

What travels how:
- `hello`: the actor's identity and task; the learner answers whether it may connect.
- `room`: whether the actor may send a chunk now; an actor asks before it sends an unroll, and
  again while the answer is `QUEUE_FULL` (after pauses that grow to a tenth of how long it has
  waited so far or typically waits), so that unrolls are not sent to a full store to see
  whether it takes them. Room goes to the actor that has waited longest among those still
  asking, so that an actor pausing longer between asks is not passed over again and again.
- `enqueue`: chunks of whole trajectories, time-major; the learner answers `ACCEPTED`,
  `QUEUE_FULL` (the store filled while the chunk travelled: refused before it is decoded, and
  the actor asks for room again),
  `FINISHED`, `UNAUTHORIZED`, `REFUSED` or `UNKNOWN_ACTOR` (the actor's task has not said
  `hello` to this learner: the learner restarted since the actor connected, and the RPC layer
  reconnected to it on its own; the actor connects again, so that the new learner checks it).
- `report_episodes`: the real returns, agent steps and frames of finished episodes, and the
  frames each began with (Atari's no-ops and FIRE; -1 for other families).
- `weights_version`, `weights_chunk`: the learner's weights, as a versioned snapshot string
  fetched in chunks.

Two facts about the RPC layer shape this package (both measured, see README):
- A message may not exceed 4 MiB (gRPC's default, which TensorFlow does not let us raise), so
  unrolls travel in chunks of whole trajectories, and weights as a snapshot string fetched in
  chunks.
- A uint8 tensor is encoded element by element (about 1.5 bytes per byte, and slowly), while a
  string travels as raw bytes: observations are sent as a byte string and decoded on the learner,
  which benchmarks/transport_encoding.py measures 8-10x faster.

A new transport is a new server and client pair implementing the same methods as
`LearnerService` and `ActorClient`, keeping `wire.py`'s spec, status codes and errors.
"""

from impala.transport.client import ActorClient
from impala.transport.server import EpisodeBatch, LearnerService, QueuedTrajectories
from impala.transport.wire import (
    ACCEPTED,
    FINISHED,
    MAX_MESSAGE_BYTES,
    QUEUE_FULL,
    REFUSAL_REASONS,
    REFUSED,
    UNAUTHORIZED,
    UNKNOWN_ACTOR,
    AuthenticationError,
    LearnerFinishedError,
    LearnerRestartedError,
    LearnerUnreachableError,
    MismatchError,
    UnrollSpec,
    describe,
)

__all__ = [
    "ACCEPTED",
    "FINISHED",
    "MAX_MESSAGE_BYTES",
    "QUEUE_FULL",
    "REFUSAL_REASONS",
    "REFUSED",
    "UNAUTHORIZED",
    "UNKNOWN_ACTOR",
    "ActorClient",
    "AuthenticationError",
    "EpisodeBatch",
    "LearnerFinishedError",
    "LearnerRestartedError",
    "LearnerService",
    "LearnerUnreachableError",
    "MismatchError",
    "QueuedTrajectories",
    "UnrollSpec",
    "describe",
]
