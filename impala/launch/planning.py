"""Planning a run: the exact command line of every process, as pure functions.

Launchers (the local one in `run_local.py`, the multi-host CSV frontend in `run_plan.py`) only
decide where each process runs; what it runs comes from here, so that tests can compare the
commands as strings.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

from impala import flags as impala_flags
from impala import run_folder
from impala.launch import mpi_settings


def forwarded_flags(values: Mapping[str, object]) -> list[str]:
    """`--name=value` for each hyperparameter flag the user set, in a stable order.

    Flags a launcher sets for each process (`run_folder.PER_PROCESS_FLAGS`: the role, the
    hosts, the run folder) are left out.

    Args:
      values: flag name -> value, for the flags given on the launcher's command line.
    """
    return [
        f"--{name}={impala_flags.as_text(value)}"
        for name, value in sorted(values.items())
        if name not in run_folder.PER_PROCESS_FLAGS
    ]


def learner_command(
    python: str,
    script: str,
    learner_hosts: Sequence[str],
    actor_hosts: Sequence[str],
    flags: Iterable[str],
) -> list[str]:
    """The command every learner runs: alone, or as a rank under mpirun (which gives each its
    rank)."""
    return _experiment_command(
        python, script, ["--job_name=learner"], learner_hosts, actor_hosts, flags
    )


def actor_command(
    python: str,
    script: str,
    task: int,
    learner_hosts: Sequence[str],
    actor_hosts: Sequence[str],
    flags: Iterable[str],
) -> list[str]:
    """The command actor `task` runs."""
    return _experiment_command(
        python, script, ["--job_name=actor", f"--task={task}"], learner_hosts, actor_hosts, flags
    )


def _experiment_command(python, script, role, learner_hosts, actor_hosts, flags) -> list[str]:
    return [
        python,
        "-u",
        script,
        *role,
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
    options = ["--allow-run-as-root"] if as_root else []
    for name in env_vars:
        options += ["-x", name]
    return mpirun(hosts, [*options, *extra], [command], np_first=True)


def mpirun(
    hosts: Sequence[str],
    options: Sequence[str],
    app_contexts: Sequence[Sequence[str]],
    np_first: bool = False,
) -> list[str]:
    """The `mpirun` argv of both learner launches: the ranks' hosts and how ranks map to them,
    the learners' Open MPI settings (`mpi_settings.default_mca`: with every rank on one host,
    shared memory between them and no TCP listener), `options`, then what the ranks run.

    Args:
      hosts: the host of each rank, in rank order (a host may repeat: one slot per rank).
      options: further mpirun options, after the host and mapping ones.
      app_contexts: one argv per app context, `:` between two; each gives its own `-np`
        unless `np_first`.
      np_first: `-np <len(hosts)>` first of all, for one app context that runs every rank.
    """
    slots: dict[str, int] = {}
    for host in hosts:
        slots[host] = slots.get(host, 0) + 1
    argv = ["mpirun", *(["-np", str(len(hosts))] if np_first else [])]
    argv += ["-H", ",".join(f"{h}:{n}" for h, n in slots.items())]
    # Learners are few and each uses several threads: no binding to one core, and rank r goes
    # to the r-th host listed.
    argv += ["--bind-to", "none", "--map-by", "slot"]
    # The learners' Open MPI settings (impala/launch/mpi_settings.py), unless `options` give one
    # too: mpirun refuses a setting given twice. Ranks all on one host: shared memory only.
    for name, value in mpi_settings.default_mca(one_host=len(slots) == 1).items():
        if name not in options:
            argv += ["--mca", name, value]
    argv += options
    for index, context in enumerate(app_contexts):
        argv += [*([":"] if index else []), *context]
    return argv


def shell_line(argv: Sequence[str]) -> str:
    """The command as one line a shell reads back into the same argv."""
    return shlex.join(argv)


def fail_with(message: str) -> str:
    """Shell: print `message` (quoted: it may hold anything the CSV holds) and exit 1. printf,
    not echo: some shells' echo reads backslashes in it as escapes."""
    return f"{{ printf '%s\\n' {shlex.quote(message)}; exit 1; }}"


def check_hyperparameters(forwarded: Mapping[str, object]) -> None:
    """Raises the one-line error the run's processes would give for their flags, before anything
    starts: the same checks (`experiment.check_run_flags`: hyperparameters and job-level flags),
    on the values the processes will have.

    Args:
      forwarded: flag name -> value, for the flags the launcher passes on (`forwarded_flags`);
        the processes take --preset's values, then the defaults, for the others.
    """
    import experiment  # TensorFlow-free at import: it loads a role's stack only to run it

    with impala_flags.as_forwarded(forwarded):
        experiment.check_run_flags(given=forwarded)


def actors_of(group: int, num_actors: int, num_groups: int) -> int:
    """How many of `num_actors` actors group `group` gets when actor i goes to group i mod
    `num_groups` (a policy's actors, a learner's); the last group gets the fewest."""
    return len(range(group, num_actors, num_groups))


def check_synchronous_round(batch_size: int, num_envs: int, fewest_actors: int) -> None:
    """Synchronous collection (`--col_workers_communication`): raises a one-line error if the
    learner with the fewest actors (`fewest_actors`, of `num_envs` environments each) gets
    fewer trajectories with one weight version than a batch needs: it would wait for more
    forever while its actors wait for its next weights."""
    if fewest_actors * num_envs < batch_size:
        raise ValueError(
            f"--batch_size={batch_size}: in synchronous collection a learner with "
            f"{fewest_actors} actor(s) of --num_envs_per_actor={num_envs} gets "
            f"{fewest_actors * num_envs} trajectories a version, and its batch would wait for "
            "more forever; give a --batch_size of at most that, or more actors"
        )
