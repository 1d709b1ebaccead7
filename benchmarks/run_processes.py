"""Finding a run's processes by their command lines, for the benchmarks that watch runs they
started (benchmarks.faults kills them, benchmarks.waiting_learners reads their CPU)."""

from __future__ import annotations

import os


def experiment_pids(job: str, mark: str) -> list[int]:
    """PIDs of the processes running experiment.py with `--job_name=job` and `mark` (one whole
    argument, such as `--experiment=NAME`) on their command lines; not mpirun, whose command
    line holds its ranks'."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        # python [-u] experiment.py ...
        runs_experiment = any(arg.endswith("experiment.py") for arg in argv[1:3])
        if runs_experiment and f"--job_name={job}" in argv and mark in argv:
            pids.append(int(entry))
    return pids
