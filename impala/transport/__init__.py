"""Actors and learners talk over gRPC (`grpcio`), in messages of raw bytes whose layouts
`wire.py` fixes.

Each learner runs a `LearnerService` (`server.py`): a gRPC server whose methods put trajectories
into the learner's trajectory store (a bounded queue by default, see `impala/trajectory_store.py`)
and hand out its weights. Each actor holds an `ActorClient` (`client.py`) connected to its
learner. What both sides must agree on, the methods and their byte layouts, size limits, status
codes and errors, is in `wire.py`.

Every call carries the run secret (`impala/run_secret.py`) in its metadata. The learner checks
it, in constant time, before any handler runs or a byte of the request is read
(`authentication.py`): a call without it ends with gRPC's UNAUTHENTICATED, whatever method it
names, and gets nothing else (no weights, no list of methods, nothing queued, no episode
recorded). A request is then checked against its layout by its length before it is read, and
what it would queue is checked, so that nothing an actor sends can stop the learner: a bad
chunk is refused and counted (`LearnerService.refusals`, `refusals.py`). The learner bounds
what callers can make it hold: messages (gRPC refuses a request larger than the largest chunk
before the learner sees it), calls under way (`serving.MAX_CONCURRENT_CALLS`), trajectories
(the store's capacity) and episodes waiting (`episodes.MAX_WAITING_EPISODES`). Traffic is
encrypted and both ends are authenticated by the run's certificate with `--transport_tls`
(`impala/run_tls.py`); without it, it is plain TCP (see the threat model in docs/guide.md).

What travels how:
- `Hello`: the actor's identity and task; the learner answers whether it may connect.
- `Room`: whether the actor may send a chunk now; an actor asks before it sends an unroll, and
  again while the answer is `QUEUE_FULL` (after pauses that grow to a tenth of how long it has
  waited so far or typically waits), so that unrolls are not sent to a full store to see
  whether it takes them. Room goes to the actor that has waited longest among those still
  asking, so that an actor pausing longer between asks is not passed over again and again.
- `Enqueue`: chunks of whole trajectories, time-major, each under `wire.MAX_MESSAGE_BYTES`; the
  learner answers `ACCEPTED`, `QUEUE_FULL` (the store filled while the chunk travelled: refused
  after reading its header only, and the actor asks for room again), `FINISHED`, `REFUSED` or
  `UNKNOWN_ACTOR` (the actor's task has not said `Hello` to this learner: the learner restarted
  since the actor connected, and gRPC reconnected to it on its own; the actor connects again,
  so that the new learner checks it).
- `ReportEpisodes`: the real returns, agent steps and frames of finished episodes, and the
  frames each began with (Atari's no-ops and FIRE; -1 for other families).
- `WeightsVersion`, `Weights`: the learner's weight version, and its weights (one message,
  only when the actor's version is not the learner's).

A new transport is a new server and client pair implementing the same methods as
`LearnerService` and `ActorClient`, keeping `wire.py`'s spec, status codes and errors.
"""

from impala.transport.client import ActorClient
from impala.transport.episodes import EpisodeBatch
from impala.transport.queueing import QueuedTrajectories
from impala.transport.server import LearnerService
from impala.transport.wire import (
    ACCEPTED,
    FINISHED,
    MAX_MESSAGE_BYTES,
    QUEUE_FULL,
    REFUSAL_REASONS,
    REFUSED,
    UNKNOWN_ACTOR,
    AuthenticationError,
    LearnerFinishedError,
    LearnerRestartedError,
    LearnerUnreachableError,
    MismatchError,
    ProtocolError,
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
    "UNKNOWN_ACTOR",
    "ActorClient",
    "AuthenticationError",
    "EpisodeBatch",
    "LearnerFinishedError",
    "LearnerRestartedError",
    "LearnerService",
    "LearnerUnreachableError",
    "MismatchError",
    "ProtocolError",
    "QueuedTrajectories",
    "UnrollSpec",
    "describe",
]
