"""The learners' addresses: `host:port` as the flags give them, checked in one line."""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Collection


def check_learner_hosts(learner_hosts: tuple[str, ...]) -> None:
    """Raises a one-line error unless `--learner_hosts` is a non-empty list of host:port."""
    if not learner_hosts:
        raise ValueError("--learner_hosts is empty: give one host:port per learner")
    for address in learner_hosts:
        parse_address(address, "--learner_hosts")
    repeated = sorted({a for a in learner_hosts if learner_hosts.count(a) > 1})
    if repeated:
        raise ValueError(f"--learner_hosts: {', '.join(repeated)} named twice; one per learner")


def parse_address(address: str, flag: str) -> tuple[str, int]:
    """Splits "host:port" ("[v6 address]:port" too), raising a one-line error naming `flag`.

    The host is a name or address: no spaces, control characters or a leading '-'.
    """
    host, _, port = address.rpartition(":")
    if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise ValueError(f"{flag}: {address!r} is not host:port with a port in 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or "[" in host or "]" in host:
            raise ValueError(f"{flag}: {address!r}: the brackets hold one IPv6 address")
    elif "[" in host or "]" in host:
        raise ValueError(f"{flag}: {address!r}: the brackets hold one IPv6 address")
    elif ":" in host:
        # "::1:8000" could be port 8000 of ::1 or the address ::1:8000 with no port.
        raise ValueError(
            f"{flag}: {address!r}: an IPv6 address takes brackets, as in [{host}]:{port}"
        )
    if not host or host.startswith("-") or not all(c.isprintable() and c not in " /" for c in host):
        raise ValueError(f"{flag}: {address!r}: {host!r} is not a host name or address")
    return host, int(port)


def resolve(hosts: Collection[str], timeout: float) -> dict[str, set[str]]:
    """Each host's addresses (IPv4-mapped IPv6 ones as IPv4), resolved at once, for at most
    `timeout` seconds in all; a name that does not resolve in time has none."""
    found: dict[str, set[str]] = {}

    def lookup(host: str) -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return
        found[host] = {_canonical(info[4][0]) for info in infos}

    # Daemon threads: a resolver that hangs neither holds this up past the deadline nor keeps
    # the process from exiting.
    threads = [threading.Thread(target=lookup, args=(host,), daemon=True) for host in hosts]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {host: set(found.get(host, ())) for host in hosts}


def _canonical(address: str) -> str:
    """`address` as one spelling: ::ffff:127.0.0.1 is 127.0.0.1, and a zone is dropped."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    mapped = getattr(parsed, "ipv4_mapped", None)
    return str(mapped or parsed)
