"""The two "hosts" of `benchmarks.scaling`: two network namespaces joined by a veth pair,
its ends shaped with tc, and all of it removed again.

Everything made here is named after the benchmark's pid (`Link.for_pid`), so two runs, or a
run and another's leftover, never touch each other's. Only the veth pair this module creates is
ever configured, and its addresses (`ADDRESSES`, in `SUBNET`) exist only inside the two
namespaces: traffic sent to them never leaves the pair.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time

SUBNET = "10.77.0.0/24"
ADDRESSES = ("10.77.0.1", "10.77.0.2")
NAMESPACE_PREFIX = "impala-scaling-"
# A tc rate: a number and a decimal unit of bits per second (tc's own spelling).
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
# tbf's bucket holds this long at the link's rate (at least _MIN_BURST bytes): enough tokens
# for the rate between two wake-ups of its timer, small against a 7 MB all-reduce.
_BURST_SECS = 0.001
_MIN_BURST = 64 * 1024
_QUEUE_LATENCY = "50ms"


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate such as `1gbit` or `100mbit`.

    Raises:
      ValueError: `rate` is not one.
    """
    match = _RATE.match(rate)
    if not match or float(match[1]) <= 0:
        raise ValueError(f"{rate!r} is not a link rate such as 1gbit, 10gbit or 100mbit")
    return float(match[1]) * _UNITS[match[2]]


def tbf_arguments(rate: str) -> list[str]:
    """tc's `tbf` options that hold a link to `rate`."""
    burst = max(_MIN_BURST, round(rate_bits(rate) / 8 * _BURST_SECS))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", _QUEUE_LATENCY]


def missing_tools() -> str | None:
    """Why this machine cannot run the benchmark (one line), or None."""
    if os.geteuid() != 0:
        return "must run as root (it makes network namespaces and shapes a link with tc)"
    for tool in ("ip", "tc", "mpirun"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (Debian: apt-get install iproute2 openmpi-bin)"
    return None


@dataclasses.dataclass(frozen=True)
class Link:
    """Two namespaces, `namespaces[i]` holding veth end `interfaces[i]` at `ADDRESSES[i]`."""

    namespaces: tuple[str, str]
    interfaces: tuple[str, str]

    @classmethod
    def for_pid(cls, pid: int) -> Link:
        # An interface name holds at most 15 characters: 'isc' + a pid (at most 7 digits) + 1.
        return cls(
            namespaces=(f"{NAMESPACE_PREFIX}{pid}-a", f"{NAMESPACE_PREFIX}{pid}-b"),
            interfaces=(f"isc{pid}a", f"isc{pid}b"),
        )

    @property
    def tag(self) -> str:
        """What every name of the run starts with: its processes' command lines hold it too."""
        return self.namespaces[0].removesuffix("-a")

    def in_namespace(self, end: int, argv: list[str]) -> list[str]:
        """`argv` run inside namespace `end` (0 or 1)."""
        return ["ip", "netns", "exec", self.namespaces[end], *argv]


def _run(argv: list[str]) -> None:
    completed = subprocess.run(argv, capture_output=True, text=True, check=False)
    if completed.returncode:
        reason = (completed.stderr or completed.stdout).strip().splitlines()
        raise RuntimeError(f"`{' '.join(argv)}` failed: {reason[-1] if reason else 'no output'}")


def set_up(link: Link) -> None:
    """Makes the namespaces and the veth pair between them, addressed, up, and not shaped.

    Raises:
      RuntimeError: a command failed (what it made so far is left for `tear_down`).
    """
    for namespace in link.namespaces:
        _run(["ip", "netns", "add", namespace])
    first, second = link.interfaces
    _run(["ip", "link", "add", first, "type", "veth", "peer", "name", second])
    for end in (0, 1):
        namespace, interface = link.namespaces[end], link.interfaces[end]
        _run(["ip", "link", "set", interface, "netns", namespace])
        _run(["ip", "-n", namespace, "addr", "add", f"{ADDRESSES[end]}/24", "dev", interface])
        _run(["ip", "-n", namespace, "link", "set", interface, "up"])
        _run(["ip", "-n", namespace, "link", "set", "lo", "up"])


def shape(link: Link, rate: str | None) -> None:
    """Holds both ends of the link to `rate` (each end's outgoing traffic); None: unshaped."""
    for end in (0, 1):
        tc = ["tc", "qdisc"]
        device = ["dev", link.interfaces[end], "root"]
        if rate is None:
            # A veth's own default (no queue) again; deleting what is not there is no error.
            subprocess.run(
                link.in_namespace(end, [*tc, "del", *device]), capture_output=True, check=False
            )
        else:
            _run(link.in_namespace(end, [*tc, "replace", *device, *tbf_arguments(rate)]))


def namespaces_present() -> set[str]:
    """The names `ip netns list` shows."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def _pids_in(namespace: str) -> list[int]:
    listed = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False
    )
    return [int(word) for word in listed.stdout.split() if word.isdigit()]


def tear_down(link: Link, grace_secs: float = 3.0) -> list[str]:
    """Ends every process left inside the link's namespaces (all started by this run), then
    deletes the veth pair and the namespaces, whatever `set_up` got as far as making.

    Returns:
      What could not be removed, one line each (empty when all of it is gone).
    """
    present = namespaces_present()
    mine = [namespace for namespace in link.namespaces if namespace in present]
    for sig, wait in ((signal.SIGTERM, grace_secs), (signal.SIGKILL, 1.0)):
        pids = [pid for namespace in mine for pid in _pids_in(namespace)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = [pid for namespace in mine for pid in _pids_in(namespace)]
        if not pids:
            break
    # Deleting one end deletes the pair; an end still in this namespace (a set-up that
    # stopped before moving it) is deleted here, by its name, which only this run uses.
    for end, interface in enumerate(link.interfaces):
        if link.namespaces[end] in mine:
            subprocess.run(
                ["ip", "-n", link.namespaces[end], "link", "del", interface],
                capture_output=True,
                check=False,
            )
        subprocess.run(["ip", "link", "del", interface], capture_output=True, check=False)
    for namespace in mine:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    problems = [
        f"network namespace {namespace} is still there (ip netns del {namespace})"
        for namespace in link.namespaces
        if namespace in namespaces_present()
    ]
    return problems


def leftovers(own_pid: int) -> list[str]:
    """Namespaces of earlier runs of this benchmark whose process is gone (a kill -9)."""
    found = []
    for namespace in sorted(namespaces_present()):
        match = re.fullmatch(re.escape(NAMESPACE_PREFIX) + r"(\d+)-[ab]", namespace)
        if match and int(match[1]) != own_pid and not os.path.exists(f"/proc/{match[1]}"):
            found.append(namespace)
    return found
