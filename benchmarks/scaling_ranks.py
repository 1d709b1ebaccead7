"""The two ranks of `benchmarks.scaling`: one mpirun, in the link's first namespace, starting
rank 0 there and rank 1 in the other (`benchmarks/scaling_rank.py`), and their result lines."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading

from benchmarks import scaling_link
from impala.launch import mpi_settings

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MARK = "SCALING "  # benchmarks.scaling_rank's result lines


_AGENT = """#!/bin/sh
# Open MPI's launch agent for one benchmarks.scaling run: "$1" is the host, the rest the
# command line its shell runs. The one other host is the namespace holding {address}.
[ "$1" = "{address}" ] || {{ echo "no such host: $1" >&2; exit 1; }}
shift
exec ip netns exec {namespace} sh -c "$*"
"""


def write_launch_agent(link: scaling_link.Link, folder: str) -> str:
    path = os.path.join(folder, "launch_agent")
    with open(path, "w") as f:
        f.write(_AGENT.format(address=scaling_link.ADDRESSES[1], namespace=link.namespaces[1]))
    os.chmod(path, 0o700)
    return path


def ranks_command(
    link: scaling_link.Link,
    agent: str,
    warmup: int,
    repeats: int,
    compressions: list[str],
    extra_mca: dict[str, str],
    train_batches: int,
    train_compressions: list[str],
    batch_reuse: int | None = None,
) -> list[str]:
    """mpirun, inside namespace A, starting rank 0 there and rank 1 in namespace B."""
    subnet = scaling_link.SUBNET
    mca = {
        # The learners' own settings (waiting ranks yield their core), unless --mca says otherwise.
        **mpi_settings.default_mca(),
        **extra_mca,
        "plm_rsh_agent": agent,
        "oob_tcp_if_include": subnet,
        # TCP only, on the pair: no shared memory or UCX between the two "hosts".
        "pml": "ob1",
        "btl": "tcp,self",
        "btl_tcp_if_include": subnet,
    }
    argv = ["mpirun", "--allow-run-as-root", "-np", "2"]
    argv += ["-H", ",".join(f"{address}:1" for address in scaling_link.ADDRESSES)]
    argv += ["--bind-to", "none", "--map-by", "slot", "-x", "PYTHONUNBUFFERED"]
    for name, value in mca.items():
        argv += ["--mca", name, value]
    argv += [sys.executable, "-u", "-m", "benchmarks.scaling_rank"]
    argv += [str(warmup), str(repeats), ",".join(compressions), str(train_batches)]
    argv += [",".join(train_compressions), link.tag, str(batch_reuse or 0)]
    return link.in_namespace(0, argv)


class Ranks:
    """The mpirun of the two ranks: what it prints, line by line, and its input."""

    def __init__(self, argv: list[str]):
        self.tail: list[str] = []
        self._lines: queue.Queue = queue.Queue()
        self.process = subprocess.Popen(
            argv,
            cwd=_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def result(self, timeout: float) -> dict:
        """Rank 0's next result line.

        Raises:
          RuntimeError: the ranks ended, or said nothing for `timeout` seconds.
        """
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise RuntimeError(f"the ranks said nothing for {timeout:.0f} s") from None
            if line is None:
                self.process.wait()
                last = " | ".join(self.tail[-6:]) or "nothing"
                raise RuntimeError(
                    f"the ranks' mpirun ended (status {self.process.returncode}); its last "
                    f"lines: {last}"
                )
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
            self.tail = [*self.tail[-40:], line]

    def send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self, grace_secs: float = 5.0) -> None:
        """Ends mpirun (which ends its ranks), SIGKILL after `grace_secs`."""
        for sig, wait in ((signal.SIGTERM, grace_secs), (signal.SIGKILL, 2.0)):
            if self.process.poll() is not None:
                return
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=wait)
