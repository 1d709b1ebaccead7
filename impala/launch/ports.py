"""Ports that nothing listens on, for the learners a launcher starts next on this machine."""

from __future__ import annotations

import errno
import random
import socket


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """`count` distinct ports that nothing listens on right now, for servers started next.

    Taken below the kernel's ephemeral range when there is room: a port the OS handed out for
    `bind(0)` and freed again can be given to the next outgoing connection (an actor's, say)
    before the server binds it, whereas a port outside that range is only taken by someone
    choosing it. Where the ephemeral range covers almost everything, the OS chooses.

    Raises:
      OSError: if fewer than `count` ports are free.
    """
    rng = rng or random.Random()
    low, high = _ephemeral_port_range()
    candidates = [*range(10_000, low), *range(high + 1, 65_536)]
    ports: list[int] = []
    if len(candidates) >= 100 * count:
        for port in rng.sample(candidates, len(candidates)):
            if len(ports) == count:
                break
            if _bindable(port):
                ports.append(port)
    for _ in range(100 * count):
        if len(ports) == count:
            break
        with socket.socket() as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    if len(ports) < count:
        raise OSError(f"found {len(ports)} free ports of the {count} needed")
    return ports


def _bindable(port: int) -> bool:
    """Nothing listens on `port`, on any IPv4 or IPv6 address of this machine."""
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, address in families:
        try:
            with socket.socket(family) as s:
                s.bind((address, port))
        except OSError as error:
            if family == socket.AF_INET6 and error.errno == errno.EADDRNOTAVAIL:
                continue  # no IPv6 on this machine
            return False
    return True


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(field) for field in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default
