"""Planning a run: the exact command line of every process, as pure functions.

Launchers (the local one in `run_local.py`, the multi-host CSV frontend) only decide where each
process runs; what it runs comes from here, so that tests can compare the commands as strings.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

# Flags a launcher sets per process; the user's copies of these are not forwarded.
PER_PROCESS_FLAGS = frozenset({"job_name", "task", "learner_hosts", "actor_hosts"})


def forwarded_flags(values: Mapping[str, object]) -> list[str]:
    """`--name=value` for each hyperparameter flag the user set, in a stable order.

    Args:
      values: flag name -> value, for the flags given on the launcher's command line.
    """
    return [
        f"--{name}={_flag_value(value)}"
        for name, value in sorted(values.items())
        if name not in PER_PROCESS_FLAGS
    ]


def _flag_value(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def learner_command(
    python: str,
    script: str,
    learner_hosts: Sequence[str],
    actor_hosts: Sequence[str],
    flags: Iterable[str],
) -> list[str]:
    """The command every learner rank runs (under mpirun, which gives each its rank)."""
    return [
        python,
        "-u",
        script,
        "--job_name=learner",
        f"--learner_hosts={','.join(learner_hosts)}",
        f"--actor_hosts={','.join(actor_hosts)}",
        *flags,
    ]


def actor_command(
    python: str,
    script: str,
    task: int,
    learner_hosts: Sequence[str],
    actor_hosts: Sequence[str],
    flags: Iterable[str],
) -> list[str]:
    """The command actor `task` runs."""
    return [
        python,
        "-u",
        script,
        "--job_name=actor",
        f"--task={task}",
        f"--learner_hosts={','.join(learner_hosts)}",
        f"--actor_hosts={','.join(actor_hosts)}",
        *flags,
    ]


def mpirun_command(
    hosts: Sequence[str],
    command: Sequence[str],
    as_root: bool,
    env_vars: Sequence[str] = ("PYTHONUNBUFFERED",),
    extra: Sequence[str] = (),
) -> list[str]:
    """`mpirun` starting one learner rank per entry of `hosts` (a host may repeat).

    Args:
      hosts: the host of each rank, in rank order.
      command: what each rank runs.
      as_root: add Open MPI's --allow-run-as-root (it refuses to run as root otherwise).
      env_vars: environment variables mpirun passes on to every rank.
      extra: further mpirun options (e.g. how to reach other hosts).
    """
    slots: dict[str, int] = {}
    for host in hosts:
        slots[host] = slots.get(host, 0) + 1
    argv = ["mpirun", "-np", str(len(hosts)), "-H", ",".join(f"{h}:{n}" for h, n in slots.items())]
    # Learners are few and each uses several threads: no binding to one core, and rank r goes
    # to the r-th host listed.
    argv += ["--bind-to", "none", "--map-by", "slot"]
    if as_root:
        argv.append("--allow-run-as-root")
    for name in env_vars:
        argv += ["-x", name]
    return [*argv, *extra, *command]


def shell_line(argv: Sequence[str]) -> str:
    """The command as one line a shell reads back into the same argv."""
    return shlex.join(argv)
