"""Planning a run: the exact command line of every process, as pure functions.

Launchers (the local one in `run_local.py`, the multi-host CSV frontend) only decide where each
process runs; what it runs comes from here, so that tests can compare the commands as strings.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from collections.abc import Iterable, Mapping, Sequence

from impala import run_folder, run_secret
from impala.launch import workers_csv
from impala.launch.workers_csv import Worker

# The tmux window of a run's mpirun, on the first learner host.
LEARNERS_WINDOW = "learners"


def forwarded_flags(values: Mapping[str, object]) -> list[str]:
    """`--name=value` for each hyperparameter flag the user set, in a stable order.

    Flags a launcher sets for each process (`run_folder.PER_PROCESS_FLAGS`: the role, the
    hosts, the run folder) are left out.

    Args:
      values: flag name -> value, for the flags given on the launcher's command line.
    """
    return [
        f"--{name}={_flag_value(value)}"
        for name, value in sorted(values.items())
        if name not in run_folder.PER_PROCESS_FLAGS
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
    return _mpirun(hosts, [*options, *extra], [command], np_first=True)


def _mpirun(
    hosts: Sequence[str],
    options: Sequence[str],
    app_contexts: Sequence[Sequence[str]],
    np_first: bool = False,
) -> list[str]:
    """The `mpirun` argv of both learner launches: the ranks' hosts and how ranks map to them,
    `options`, then what the ranks run.

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
    argv += ["--bind-to", "none", "--map-by", "slot", *options]
    for index, context in enumerate(app_contexts):
        argv += [*([":"] if index else []), *context]
    return argv


def shell_line(argv: Sequence[str]) -> str:
    """The command as one line a shell reads back into the same argv."""
    return shlex.join(argv)


# ---- Multi-host runs from a workers CSV -------------------------------------------------------

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclasses.dataclass(frozen=True)
class Window:
    """One tmux window: a process of the run (or the mpirun that starts all learners)."""

    name: str
    command: str


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """What the run starts on one host: a tmux session with one window per process.

    Attributes:
      worker: the first CSV row naming this host (how to reach it: SSH port, user, key).
      workers: every CSV row on this host (checked before the run starts).
      local: whether the host is this machine (reached through local tmux, not SSH).
      session: the tmux session, named after the run.
      windows: its windows, in start order.
      files: files to write on the host before starting (path -> content).
      secret_paths: where the run secret goes on the host (owner-only): the run folder of each
        workdir its processes run in, where they read it by default.
    """

    worker: Worker
    workers: tuple[Worker, ...]
    local: bool
    session: str
    windows: tuple[Window, ...]
    files: tuple[tuple[str, str], ...] = ()
    secret_paths: tuple[str, ...] = ()

    @property
    def host(self) -> str:
        return self.worker.host


def session_name(run_name: str, host: str) -> str:
    """The run's tmux session on `host`: status and stop find the run by it. The host is part
    of the name because several host names may reach one machine (and one tmux server)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in f"impala_{run_name}_{host}")


def learner_ranks(workers: Sequence[Worker]) -> list[Worker]:
    """Learners in rank order: mpirun fills each host's slots before the next host's, so ranks
    are grouped by host, hosts in the order they first appear in the CSV."""
    learners = [w for w in workers if w.job == "learner"]
    first_seen = {}
    for worker in learners:
        first_seen.setdefault(worker.host, len(first_seen))
    return sorted(learners, key=lambda w: (first_seen[w.host], w.line))


@dataclasses.dataclass(frozen=True)
class Restarts:
    """How a window starts its process again when it dies, as run_local.py does: after 1, 2,
    4 ... s (at most `max_delay_secs`), at most so many times, never after exit code 0 (done),
    2 (refused flags or files) or 130 (stopped)."""

    max_actor_restarts: int = 100
    max_learner_restarts: int = 3
    max_delay_secs: int = 30


def plan_run(
    workers: Sequence[Worker],
    flags: Sequence[str],
    run_name: str,
    logdir: str = "runs",
    local_hosts: frozenset[str] = LOCAL_HOSTS,
    accept_unknown_host_keys: bool = False,
    known_hosts: str = "~/.ssh/known_hosts",
    restarts: Restarts = Restarts(),
) -> list[HostPlan]:
    """Every host's tmux session and the exact command of each window.

    Learners start with one mpirun in a window `learners` on the first learner host; it reaches
    the other learner hosts over SSH with a generated ssh config. Actors each get a window
    `actor_<task>` on their host. Every process gets the same hyperparameter `flags`, and the
    run folder `<logdir>/<run_name>` (relative to each host's workdir unless absolute) for its
    log; learners keep the run's checkpoints and summaries there. Each window starts its process
    again when it dies (`restarts`): the learners resume from the latest checkpoint.
    """
    learners = learner_ranks(workers)
    actors = [w for w in workers if w.job == "actor"]
    learner_hosts = [w.address for w in learners]
    actor_hosts = [w.host for w in actors]
    log_dir = posixpath.join(logdir, run_name)
    run_flags = [*flags, f"--logdir={logdir}", f"--experiment={run_name}"]
    windows: dict[str, list[Window]] = {}
    files: dict[str, list[tuple[str, str]]] = {}
    first = learners[0]

    ssh_config_path = posixpath.join(first.workdir, log_dir, "ssh_config")
    mpirun_extra = []
    if any(w.host != first.host for w in learners):
        # Every learner host, the first included: mpirun may not recognise the name it runs
        # under as itself. No tree spawn: only the first host has this config file. mpirun
        # splits plm_rsh_args at every space, quoted or not, so its ssh (started in mpirun's
        # folder, the first learner's workdir) gets the config's path relative to that folder:
        # only --logdir and the run's name must be free of spaces, not the workdir.
        config_arg = posixpath.join(log_dir, "ssh_config")
        if any(c.isspace() for c in config_arg):
            raise ValueError(
                f"--logdir={logdir!r} and the run name {run_name!r}: learners on several hosts "
                "need a run folder path without spaces (mpirun splits its ssh options at spaces)"
            )
        mpirun_extra = [
            "--mca",
            "plm_rsh_args",
            f"-F {config_arg}",
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
        ]
        unique_hosts = list({w.host: w for w in learners}.values())
        files.setdefault(first.host, []).append(
            (ssh_config_path, ssh_config(unique_hosts, accept_unknown_host_keys, known_hosts))
        )
    learner_line = _mpmd_mpirun(learners, learner_hosts, actor_hosts, run_flags, mpirun_extra)
    windows.setdefault(first.host, []).append(
        Window(
            LEARNERS_WINDOW,
            _in_workdir(
                first.workdir,
                log_dir,
                learner_line,
                "learners",
                restarts.max_learner_restarts,
                restarts.max_delay_secs,
            ),
        )
    )
    for actor in actors:
        argv = actor_command(
            actor.python, "experiment.py", actor.task, learner_hosts, actor_hosts, run_flags
        )
        line = shell_line(["env", f"CUDA_VISIBLE_DEVICES={actor.cuda_visible_devices}", *argv])
        windows.setdefault(actor.host, []).append(
            Window(
                actor.name,
                _in_workdir(
                    actor.workdir,
                    log_dir,
                    line,
                    actor.name,
                    restarts.max_actor_restarts,
                    restarts.max_delay_secs,
                ),
            )
        )

    by_host: dict[str, list[Worker]] = {}
    for worker in workers:
        by_host.setdefault(worker.host, []).append(worker)
    return [
        HostPlan(
            worker=by_host[host][0],
            workers=tuple(by_host[host]),
            local=host in local_hosts,
            session=session_name(run_name, host),
            windows=tuple(host_windows),
            files=tuple(files.get(host, ())),
            secret_paths=tuple(
                dict.fromkeys(
                    posixpath.join(w.workdir, log_dir, run_secret.FILE_NAME) for w in by_host[host]
                )
            ),
        )
        for host, host_windows in windows.items()
    ]


def _mpmd_mpirun(learners, learner_hosts, actor_hosts, flags, extra) -> str:
    """One mpirun, one app context per learner: each with its own workdir, python and GPUs."""
    options = ["-x", "PYTHONUNBUFFERED=1", *extra]
    if learners[0].ssh_user == "root":
        options.append("--allow-run-as-root")
    contexts = []
    for worker in learners:
        command = learner_command(worker.python, "experiment.py", learner_hosts, actor_hosts, flags)
        contexts.append(
            [
                "-np",
                "1",
                "-wdir",
                worker.workdir,
                "-x",
                f"CUDA_VISIBLE_DEVICES={worker.cuda_visible_devices}",
                *command,
            ]
        )
    argv = _mpirun([worker.host for worker in learners], options, contexts)
    return shell_line(argv)


def _in_workdir(
    workdir: str, log_dir: str, line: str, name: str, max_restarts: int, max_delay: int
) -> str:
    """Runs `line` in `workdir`, logging to the run's folder, keeping its exit status, and starts
    it again when it dies (see `Restarts`)."""
    log = shlex.quote(f"{log_dir}/{name}.log")
    say = f"[frontend] {name} exited with code $code;"
    final = "|".join(str(code) for code in run_folder.FINAL_EXIT_CODES)
    script = (
        f"cd {shlex.quote(workdir)} && mkdir -p {shlex.quote(log_dir)} || exit 1; "
        f"restarts=0; delay=1; while true; do {line} 2>&1 | tee -a {log}; code=$?; "
        f"case $code in {final}) exit $code;; esac; "
        f"if [ $restarts -ge {int(max_restarts)} ]; then "
        f'echo "{say} not restarting it after $restarts restarts" | tee -a {log}; exit $code; fi; '
        "restarts=$((restarts + 1)); "
        f'echo "{say} restarting it in $delay s (restart $restarts of at most '
        f'{int(max_restarts)})" | tee -a {log}; '
        f"sleep $delay; delay=$((delay * 2 > {int(max_delay)} ? {int(max_delay)} : delay * 2)); "
        "done"
    )
    return shell_line(["bash", "-o", "pipefail", "-c", script])


def ssh_config(hosts: Sequence[Worker], accept_unknown_host_keys: bool, known_hosts: str) -> str:
    """The ssh config mpirun uses to reach the other learner hosts: never a password prompt,
    host keys checked against known_hosts unless the user accepted unknown ones.

    Only checked values go in, so that no value can add a line (an option such as
    ProxyCommand) or a second argument: host and user names as the workers CSV allows them,
    ports, and paths in the syntax of `_ssh_config_path`.

    Raises:
      ValueError: a host, user or path that cannot be written safely.
    """
    lines = []
    for worker in hosts:
        if not workers_csv.is_host(worker.host):
            raise ValueError(f"host={worker.host!r}: not a host name for mpirun's ssh config")
        if not workers_csv.is_user_name(worker.ssh_user):
            raise ValueError(
                f"ssh_user={worker.ssh_user!r}: not a user name for mpirun's ssh config"
            )
        lines += [
            f"Host {worker.host}",
            f"  HostName {worker.host}",
            f"  Port {int(worker.ssh_port)}",
            f"  User {worker.ssh_user}",
            "  BatchMode yes",
            f"  StrictHostKeyChecking {'accept-new' if accept_unknown_host_keys else 'yes'}",
            f"  UserKnownHostsFile {_ssh_config_path('--known_hosts', known_hosts)}",
        ]
        if worker.ssh_key:
            lines.append(f"  IdentityFile {_ssh_config_path('ssh_key', worker.ssh_key)}")
    return "\n".join(lines) + "\n"


def _ssh_config_path(name: str, path: str) -> str:
    """`path` as one ssh config argument: '%' doubled (ssh expands %-tokens in file names), in
    double quotes if it holds a space, a single quote or '#' (which would split it, quote it or
    start a comment). OpenSSH versions read a backslash in quotes differently and expand ${...}
    with no escape, so paths with '"', '\\' or '$' are refused, as are control characters."""
    if not path.isprintable() or any(c in workers_csv.SSH_CONFIG_UNSAFE for c in path):
        raise ValueError(
            f"{name}={path!r}: cannot go into mpirun's ssh config (no control characters, "
            "'\"', '\\' or '$')"
        )
    path = path.replace("%", "%%")
    return f'"{path}"' if any(c in path for c in " '#") else path


def check_hyperparameters(forwarded: Mapping[str, object]) -> None:
    """Raises the one-line error the run's processes would give for their flags, before anything
    starts: the same checks (`experiment.check_run_flags`: hyperparameters and job-level flags),
    on the values the processes will have.

    Args:
      forwarded: flag name -> value, for the flags the launcher passes on (`forwarded_flags`);
        the processes take --preset's values, then the defaults, for the others.
    """
    import experiment  # TensorFlow-free at import: it loads a role's stack only to run it
    from impala import flags as impala_flags

    with impala_flags.as_forwarded(forwarded):
        experiment.check_run_flags()
