"""The run secret, checked in every call's metadata before any handler runs or reads a byte.

A call is admitted only if its metadata holds the key `wire.SECRET_KEY` exactly once, with the
secret as its value, compared in time independent of where they differ. Refusals are counted,
by host too, and logged one by one up to `LOGGED_REFUSALS_PER_MINUTE` a host, then summed up
once a minute: a stranger calling in a loop cannot fill the learner's log.
"""

from __future__ import annotations

import collections
import hmac
import logging
import threading
import time
from collections.abc import Callable

import grpc

from impala.transport import wire
from impala.transport.roster import MAX_ACTOR_TASKS

# A host's refused calls are logged one by one up to this many a minute, then summed up.
LOGGED_REFUSALS_PER_MINUTE = 5

_log = logging.getLogger(__name__)


class Authenticator:
    """Admits calls that carry the run secret; refuses the others UNAUTHENTICATED, unread."""

    def __init__(self, secret: str, count: Callable[[], None]):
        """Checks calls for `secret`.

        Args:
          secret: the run secret.
          count: called once for each refused call.
        """
        self._secret = secret.encode()
        self._count = count
        self._lock = threading.Lock()
        self._by_host: collections.Counter[str] = collections.Counter()
        self._logged: dict[str, tuple[float, int]] = {}
        # A stream handler, so that gRPC does not wait for (or keep) the request to run it.
        self.refusal = grpc.stream_unary_rpc_method_handler(self._refuse)

    def admits(self, metadata) -> bool:
        given = [value for key, value in metadata or () if key == wire.SECRET_KEY]
        if len(given) != 1 or not isinstance(given[0], str):
            return False
        try:
            value = given[0].encode("ascii")
        except UnicodeEncodeError:
            return False
        return hmac.compare_digest(value, self._secret)

    def by_host(self) -> dict[str, int]:
        """Calls refused so far, by the caller's host."""
        with self._lock:
            return dict(self._by_host)

    def _refuse(self, request_iterator, context):
        self._count()
        host = _host_of(context.peer())
        if self._record(host) < LOGGED_REFUSALS_PER_MINUTE:
            _log.warning("refused a call without the run secret from %s", host)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "run secret refused")

    def _record(self, host: str) -> int:
        """Counts a refusal from `host`; how many of its refusals this minute came before."""
        now = time.monotonic()
        with self._lock:
            self._by_host[host] += 1
            if len(self._by_host) > MAX_ACTOR_TASKS:  # a bound, should hosts be spoofed
                self._by_host = collections.Counter(dict(self._by_host.most_common(1024)))
            since, logged = self._logged.get(host, (now, 0))
            if now - since > 60:
                if logged > LOGGED_REFUSALS_PER_MINUTE:
                    _log.warning(
                        "refused %d calls without the run secret from %s in the last minute",
                        logged,
                        host,
                    )
                since, logged = now, 0
            self._logged[host] = (since, logged + 1)
        return logged


def _host_of(peer: str) -> str:
    """'ipv4:10.0.0.2:5000' -> 'ipv4:10.0.0.2'; '[...]' IPv6 likewise."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer
