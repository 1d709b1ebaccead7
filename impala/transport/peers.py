"""A policy's rank-0 learner asking another policy's (population-based training): `PolicyPeer`.

Calls carry the run secret, as an actor's do; the answers are only read up to the limits
`wire.py` sets for them and what the asking learner expects (`max_state_bytes`), and what they
say is checked by the caller (`impala/learner/pbt.py`), since a peer is another process that
may be anything.
"""

from __future__ import annotations

import grpc

from impala.transport import wire
from impala.transport.client import first_detail, open_channel


class PolicyPeer:
    """Another policy's rank-0 learner, as one learner asks it for its status and state."""

    def __init__(self, address: str, secret: str, max_state_bytes: int, tls=None):
        """A channel to the learner at `address` ("host:port"); nothing is sent yet.

        Args:
          max_state_bytes: the largest `PolicyState` answer read (larger ones end the call).
          tls: the run's TLS material (`impala.run_tls.Material`), or None for plain TCP.
        """
        self.address = address
        # Why the last call ended without an answer ("RESOURCE_EXHAUSTED: ..."), unless it ran
        # out of time; None if it did not fail so.
        self.last_failure: str | None = None
        self._metadata = ((wire.SECRET_KEY, secret),)
        self._channel = open_channel(
            address, [("grpc.max_receive_message_length", max_state_bytes)], tls
        )
        self._status = self._channel.unary_unary(wire.method_path("PolicyStatus"))
        self._state = self._channel.unary_unary(wire.method_path("PolicyState"))

    def status(self, timeout_secs: float) -> bytes | None:
        """Its `PolicyStatus` answer (unchecked JSON bytes), or None if it did not answer in
        time or answered more than `wire.MAX_STATUS_BYTES`."""
        answer = self._ask(self._status, timeout_secs)
        return answer if answer is not None and len(answer) <= wire.MAX_STATUS_BYTES else None

    def state(self, timeout_secs: float) -> bytes | None:
        """Its `PolicyState` answer (unchecked), or None if it did not answer in time or had
        no snapshot to give."""
        answer = self._ask(self._state, timeout_secs)
        return answer or None

    def _ask(self, method, timeout_secs: float) -> bytes | None:
        self.last_failure = None
        try:
            return method(b"", timeout=timeout_secs, metadata=self._metadata)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                details, name = first_detail(error), error.code().name
                self.last_failure = f"{name}: {details}" if details else name
            return None

    def close(self) -> None:
        self._channel.close()
