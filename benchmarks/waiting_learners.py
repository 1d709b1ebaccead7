"""The CPU learners use while they wait for batches: one learner alone (which runs without
Horovod since 2026-12-06), then --num_learners learners under mpirun as run_local.py starts
them, each serving with no actor (so waiting for its first batch), their CPU seconds sampled
over --seconds once rank 0 serves. In one run, so that the two rows compare on this machine as
it is now.

    .venv/bin/python -m benchmarks.waiting_learners [--num_learners=2] [--seconds=15]

Horovod's background thread coordinates the ranks every cycle (HOROVOD_CYCLE_TIME, 1 ms) even
when no tensor waits, and Open MPI waits for the other ranks by polling: the figure shows what
that costs (scripts/horovod-cycles.patch lines the ranks' cycles up so that the poll is short).
Environment variables such as HOROVOD_CYCLE_TIME reach the ranks (mpirun passes the
environment on to local ranks).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import one_line_flags, run_processes
from impala.launch import planning
from impala.launch.ports import free_ports

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Only when run: tests import this module beside experiment.py, whose flags share names.
    flags.DEFINE_integer("num_learners", 2, "Learners under mpirun.", lower_bound=2)
    flags.DEFINE_float("seconds", 15.0, "How long their CPU is sampled.", lower_bound=0.1)
    flags.DEFINE_float(
        "start_timeout_secs", 180.0, "Give up when rank 0 has not served by then.", lower_bound=1
    )


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TICKS = os.sysconf("SC_CLK_TCK")
# A cheap game and network: only waiting is measured.
_LEARNER_FLAGS = (
    "--level_name=impala/Counter-v0",
    "--agent_name=MLPAgent",
    "--unroll_length=5",
    "--batch_size=4",
)


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def measure(num_learners: int, seconds: float, folder: str, start_timeout_secs: float) -> float:
    """Cores the waiting learners keep busy between them (CPU seconds per second)."""
    logdir = os.path.join(folder, f"learners_{num_learners}")
    hosts = [f"localhost:{port}" for port in free_ports(num_learners)]
    command = planning.learner_command(
        sys.executable,
        os.path.join(_ROOT, "experiment.py"),
        hosts,
        ["localhost"] * num_learners,
        [*_LEARNER_FLAGS, f"--logdir={logdir}", "--experiment=waiting"],
    )
    if num_learners > 1:
        command = planning.mpirun_command(["localhost"] * num_learners, command, os.geteuid() == 0)
    log_path = os.path.join(folder, f"learners_{num_learners}.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=_ROOT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + start_timeout_secs
        while " serving " not in _read(log_path):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = _read(log_path)[-2000:]
                raise RuntimeError(f"the learners did not start serving:\n{tail}")
            time.sleep(0.5)
        time.sleep(2.0)  # the other ranks' last start-up steps
        pids = run_processes.experiment_pids("learner", f"--logdir={logdir}")
        if len(pids) != num_learners:
            raise RuntimeError(f"found {len(pids)} learner processes, not {num_learners}")
        before = sum(_cpu_seconds(pid) for pid in pids)
        begin = time.monotonic()
        time.sleep(seconds)
        used = sum(_cpu_seconds(pid) for pid in pids) - before
        return used / (time.monotonic() - begin)
    finally:
        _stop(process)


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (mpirun passes it on), then SIGKILL after 30 s."""
    for signum, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(
            f"waiting_learners.py: error: unexpected arguments: {' '.join(argv[1:])}",
            file=sys.stderr,
        )
        return 2
    load = os.getloadavg()[0]
    cycle = os.environ.get("HOROVOD_CYCLE_TIME", "Horovod's default")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {os.cpu_count()} CPUs, load "
        f"average {load:.2f}; HOROVOD_CYCLE_TIME {cycle}; {FLAGS.seconds:g} s sampled",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="waiting-learners-") as folder:
        try:
            alone = measure(1, FLAGS.seconds, folder, FLAGS.start_timeout_secs)
            print(f"  1 learner, without mpirun or Horovod: {alone:.2f} cores busy", flush=True)
            several = measure(FLAGS.num_learners, FLAGS.seconds, folder, FLAGS.start_timeout_secs)
        except RuntimeError as error:
            print(f"waiting_learners.py: error: {error}", file=sys.stderr)
            return 1
    n = FLAGS.num_learners
    print(
        f"  {n} learners under mpirun: {several:.2f} cores busy ({several / n:.2f} each, "
        f"{several / n / max(alone, 1e-9):.1f}x a learner alone)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=one_line_flags.parser("waiting_learners.py"))
