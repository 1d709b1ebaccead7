"""The run secret, checked in every call's metadata before any handler runs or reads a byte.

A call is admitted only if its metadata holds the key `wire.SECRET_KEY` exactly once, with the
secret as its value, compared in time independent of where they differ. Refusals are counted,
by host too, and logged one by one up to `LOGGED_REFUSALS_PER_MINUTE` a host and
`LOGGED_LINES_PER_MINUTE` in all, then summed up once a minute: a stranger calling in a loop,
from one address or from many, cannot fill the learner's log or its memory.
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

# A host's refused calls are logged one by one up to this many a minute, then summed up; and
# at most this many in all a minute, and hosts, whatever the number of hosts calling (an IPv6
# network gives one caller millions of addresses).
LOGGED_REFUSALS_PER_MINUTE = 5
LOGGED_LINES_PER_MINUTE = 60
MAX_HOSTS_A_MINUTE = 1024

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
        # This minute's refusals: by host (at most MAX_HOSTS_A_MINUTE), of other hosts, and the
        # lines logged one by one.
        self._minute_start: float | None = None
        self._minute: collections.Counter[str] = collections.Counter()
        self._minute_others = 0
        self._minute_lines = 0
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

    def sum_up(self) -> None:
        """Logs what this minute's refusals did not log one by one (a learner that stops
        would leave its last minute unsaid: a minute is summed up at the next refusal)."""
        with self._lock:
            if self._minute_start is not None:
                self._sum_up_minute(time.monotonic())

    def _refuse(self, request_iterator, context):
        self._count()
        host = _host_of(context.peer())
        if self._record(host):
            _log.warning("refused a call without the run secret from %s", host)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "run secret refused")

    def _record(self, host: str) -> bool:
        """Counts a refusal from `host`; whether to log it one by one. At the first refusal
        a minute or more after the first of the last minute, what that minute did not log one by
        one is summed up in one line."""
        now = time.monotonic()
        with self._lock:
            self._by_host[host] += 1
            if len(self._by_host) > MAX_ACTOR_TASKS:  # a bound, should hosts be spoofed
                self._by_host = collections.Counter(dict(self._by_host.most_common(1024)))
            if self._minute_start is None or now - self._minute_start > 60:
                self._sum_up_minute(now)
                self._minute_start = now
            if host not in self._minute and len(self._minute) >= MAX_HOSTS_A_MINUTE:
                self._minute_others += 1
                return False
            self._minute[host] += 1
            if (
                self._minute[host] <= LOGGED_REFUSALS_PER_MINUTE
                and self._minute_lines < LOGGED_LINES_PER_MINUTE
            ):
                self._minute_lines += 1
                return True
            return False

    def _sum_up_minute(self, now: float) -> None:
        """Logs the refusals of the minute that ended that were not logged one by one, and
        starts the next (with the lock held)."""
        unlogged = sum(self._minute.values()) + self._minute_others - self._minute_lines
        if unlogged > 0:
            host, most = self._minute.most_common(1)[0]
            others = " and more hosts" if self._minute_others else ""
            _log.warning(
                "refused %d more calls without the run secret in the minute that began %.0f s "
                "ago, from %d host%s%s (most from %s: %d in all)",
                unlogged,
                now - self._minute_start,
                len(self._minute),
                "" if len(self._minute) == 1 else "s",
                others,
                host,
                most,
            )
        self._minute.clear()
        self._minute_others = self._minute_lines = 0


def _host_of(peer: str) -> str:
    """'ipv4:10.0.0.2:5000' -> 'ipv4:10.0.0.2'; '[...]' IPv6 likewise."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer
