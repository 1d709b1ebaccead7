"""Planning a run: the exact command line of every process, as pure functions.

Launchers (the local one in `run_local.py`, the multi-host CSV frontend) only decide where each
process runs; what it runs comes from here, so that tests can compare the commands as strings.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from impala import flags as impala_flags
from impala import run_folder, run_secret, run_tls
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
      tls_paths: where the run's TLS bundle goes on the host (owner-only; --transport_tls
        only): beside each of `secret_paths`, where the processes look for it.
      containers: the image its processes run in, if they run in containers.
      key_files: (path, name in `MPI_SSH_FILES`): the run's SSH keys the host gets (owner-only),
        for mpirun between learner containers on several hosts.
    """

    worker: Worker
    workers: tuple[Worker, ...]
    local: bool
    session: str
    windows: tuple[Window, ...]
    files: tuple[tuple[str, str], ...] = ()
    secret_paths: tuple[str, ...] = ()
    tls_paths: tuple[str, ...] = ()
    containers: Containers | None = None
    key_files: tuple[tuple[str, str], ...] = ()

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


# Inside the image (docker/Dockerfile): the project's folder, and its interpreter on PATH.
IMAGE_WORKDIR = "/opt/impala"
IMAGE_PYTHON = "/opt/impala/.venv/bin/python"
# Every container of a run carries this label, with the run's session name: stop finds them by it.
CONTAINER_LABEL = "impala.run"
# The window of the SSH server (a container of the image) through which mpirun in the learners'
# container on the first learner host starts the ranks of another learner host.
SSHD_WINDOW = "sshd"
# What sshd needs when the host user, and so the container's, is root: it chroots its pre-login
# process and switches users. A container of any other user gets no use of them.
SSHD_CAPABILITIES = ("SYS_CHROOT", "SETGID", "SETUID")
# The run's SSH keys for that, made by the frontend when it starts the run, each in the
# `MPI_SSH_DIR` folder of the run folder of the host that needs it (owner-only): name -> what.
MPI_SSH_DIR = "mpi_ssh"
MPI_SSH_FILES = {
    "id_ed25519": "the run's SSH key, for mpirun's ssh",
    "known_hosts": "the host key of the learner hosts' sshd containers",
    "host_key": "the sshd container's host key",
    "authorized_keys": "the public half of the run's SSH key, which the sshd container lets in",
}

_IMAGE_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_RUNTIME_WORD = re.compile(r"[A-Za-z0-9/-][A-Za-z0-9._/=:-]{0,254}")


@dataclasses.dataclass(frozen=True)
class Containers:
    """Every process of the run in a container of `image` (docker/Dockerfile) instead of the
    CSV's python: host networking, the host's run folder mounted at its own path, the host
    user's uid, no capabilities and no way to gain any, started by `runtime` (`docker`, or
    `podman`, with its options).

    Raises:
      ValueError: an image reference or runtime word that is not one (they go on command lines).
    """

    image: str
    runtime: tuple[str, ...] = ("docker",)
    sshd_port: int = 2222

    def __post_init__(self):
        if not 1 <= self.sshd_port <= 65535:
            raise ValueError(f"--container_sshd_port={self.sshd_port}: not a port in 1-65535")
        if not _IMAGE_REFERENCE.fullmatch(self.image):
            raise ValueError(f"--docker_image={self.image!r}: not an image reference")
        words = self.runtime
        if not words or words[0].startswith("-") or not all(map(_RUNTIME_WORD.fullmatch, words)):
            raise ValueError(
                f"--container_runtime={' '.join(self.runtime)!r}: give a command such as docker "
                "or 'podman --runtime runc' (letters, digits and ._/=:- only)"
            )

    def name(self, session: str, window: str) -> str:
        """The container of `window`: named, so that a restart can remove a leftover one."""
        return f"{session}-{window}"

    def run_line(self, session, window, mounts, env, argv, gpus=False, capabilities=()) -> str:
        """The shell line that runs `argv` in a container of the window, removing a container
        of the same name left by a process that was killed first. The container has none of
        the runtime's default capabilities but `capabilities`, and cannot gain any."""
        name = self.name(session, window)
        for path in mounts:
            if ":" in path or not path.isprintable():
                raise ValueError(
                    f"{path}: a run folder of a run in containers cannot hold ':' or control "
                    "characters (it is mounted with -v path:path)"
                )
        before = [*self.runtime, "run", "--rm", "--init", "--name", name]
        before += ["--label", f"{CONTAINER_LABEL}={session}", "--network=host"]
        # The processes run as the host user and need no privilege: none to keep, none to gain
        # (a setuid binary in the image cannot raise them).
        before += ["--cap-drop=ALL", *(f"--cap-add={name}" for name in capabilities)]
        before += ["--security-opt=no-new-privileges"]
        after = [arg for path in dict.fromkeys(mounts) for arg in ("-v", f"{path}:{path}")]
        after += [arg for item in env for arg in ("-e", item)]
        after += [*(["--gpus", "all"] if gpus else []), self.image, *argv]
        return (
            f"{shell_line([*self.runtime, 'rm', '-f', name])} >/dev/null 2>&1; "
            f'{shell_line(before)} --user "$(id -u):$(id -g)" {shell_line(after)}'
        )

    def signal_command(self, session: str, window: str, signal: str) -> str:
        return shell_line([*self.runtime, "kill", "--signal", signal, self.name(session, window)])

    def remove_command(self, session: str) -> str:
        """Removes every container of the run on a host, running or not."""
        runtime = shell_line(self.runtime)
        label = shlex.quote(f"label={CONTAINER_LABEL}={session}")
        return f"{runtime} ps -aq --filter {label} | xargs -r {runtime} rm -f >/dev/null"

    def check_command(self) -> str:
        """Shell: fails with one line unless the runtime runs and has the image."""
        runtime, image = shell_line(self.runtime), shlex.quote(self.image)
        return (
            f"command -v {shlex.quote(self.runtime[0])} >/dev/null || "
            + fail_with(f"{self.runtime[0]} not found (--container_runtime)")
            + f" && {{ {runtime} image inspect {image} >/dev/null 2>&1 || "
            + fail_with(
                f"{self.runtime[0]} has no image {self.image} (or cannot reach its engine): "
                "build or load it there (docker/README.md)"
            )
            + "; }"
        )


def fail_with(message: str) -> str:
    """Shell: print `message` (quoted: it may hold anything the CSV holds) and exit 1. printf,
    not echo: some shells' echo reads backslashes in it as escapes."""
    return f"{{ printf '%s\\n' {shlex.quote(message)}; exit 1; }}"


def plan_run(
    workers: Sequence[Worker],
    flags: Sequence[str],
    run_name: str,
    logdir: str = "runs",
    local_hosts: frozenset[str] = LOCAL_HOSTS,
    accept_unknown_host_keys: bool = False,
    known_hosts: str = "~/.ssh/known_hosts",
    restarts: Restarts = Restarts(),
    containers: Containers | None = None,
    tls: bool = False,
    private: bool = True,
) -> list[HostPlan]:
    """Every host's tmux session and the exact command of each window.

    Learners start with one mpirun in a window `learners` on the first learner host; it reaches
    the other learner hosts over SSH with a generated ssh config. Actors each get a window
    `actor_<task>` on their host. Every process gets the same hyperparameter `flags`, and the
    run folder `<logdir>/<run_name>` (relative to each host's workdir unless absolute) for its
    log; learners keep the run's checkpoints and summaries there. Each window starts its process
    again when it dies (`restarts`): the learners resume from the latest checkpoint.

    With `containers`, each window runs its process in a container of the image instead (the
    learners: their mpirun, in one container on the first learner host), with the run folder
    at the same path inside as on the host. Every other learner host then runs an SSH server in
    a container (window `sshd`), through which that mpirun starts its ranks there, with the
    run's own keys (`key_files`).

    Each host gets the run secret in the run folder of each of its workdirs (`secret_paths`),
    and with `tls` (--transport_tls, among `flags`) the run's TLS bundle beside it
    (`tls_paths`). With `private` (--private_run_files) each window's shell makes its run
    folder and log owner-only (umask 077).

    Raises:
      ValueError: something of the run that cannot be planned (see the messages).
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
    key_files: dict[str, list[tuple[str, str]]] = {}

    ssh_config_path = posixpath.join(first.workdir, log_dir, "ssh_config")
    mpirun_extra = []
    if containers:
        for host, line in _sshd_containers(containers, run_name, learners, log_dir, key_files):
            windows.setdefault(host, []).append(
                Window(
                    SSHD_WINDOW,
                    _in_workdir(
                        next(w.workdir for w in learners if w.host == host),
                        log_dir,
                        line,
                        SSHD_WINDOW,
                        restarts.max_learner_restarts,
                        restarts.max_delay_secs,
                        private,
                    ),
                )
            )
    elif any(w.host != first.host for w in learners):
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
    if containers:
        learner_line = _learners_in_container(
            containers,
            session_name(run_name, first.host),
            learners,
            learner_hosts,
            actor_hosts,
            flags,
            logdir,
            log_dir,
        )
    else:
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
                private,
            ),
        )
    )
    for actor in actors:
        if containers:
            argv = actor_command(
                IMAGE_PYTHON,
                "experiment.py",
                actor.task,
                learner_hosts,
                actor_hosts,
                [*flags, *_container_run_folder(actor, logdir, run_name)],
            )
            line = containers.run_line(
                session_name(run_name, actor.host),
                actor.name,
                [posixpath.join(actor.workdir, log_dir)],
                ["PYTHONUNBUFFERED=1", f"CUDA_VISIBLE_DEVICES={actor.cuda_visible_devices}"],
                argv,
                gpus=bool(actor.cuda_visible_devices),
            )
        else:
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
                    private,
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
            secret_paths=_in_run_folders(by_host[host], log_dir, run_secret.FILE_NAME),
            tls_paths=_in_run_folders(by_host[host], log_dir, run_tls.FILE_NAME) if tls else (),
            containers=containers,
            key_files=tuple(key_files.get(host, ())),
        )
        for host, host_windows in windows.items()
    ]


def _in_run_folders(workers: Sequence[Worker], log_dir: str, name: str) -> tuple[str, ...]:
    """The file `name` in the run folder of each workdir of `workers`, each once."""
    return tuple(dict.fromkeys(posixpath.join(w.workdir, log_dir, name) for w in workers))


def _container_run_folder(worker: Worker, logdir: str, run_name: str) -> list[str]:
    """The run folder flags of a process in a container: the host's run folder, at the same
    path inside (the container's own folder is the image's, not the CSV's workdir)."""
    return [f"--logdir={posixpath.join(worker.workdir, logdir)}", f"--experiment={run_name}"]


def _mpi_ssh_dir(learners, host: str, log_dir: str) -> str:
    """Where a learner host keeps the run's SSH keys: in the run folder of its first learner."""
    workdir = next(w.workdir for w in learners if w.host == host)
    return posixpath.join(workdir, log_dir, MPI_SSH_DIR)


def _sshd_containers(containers, run_name, learners, log_dir, key_files):
    """(host, shell line) of the SSH server container of each learner host but the first, and
    the keys each learner host needs into `key_files`."""
    hosts = list(dict.fromkeys(w.host for w in learners))
    if len(hosts) == 1:
        return []
    first = _mpi_ssh_dir(learners, hosts[0], log_dir)
    if any(c.isspace() for c in first):
        raise ValueError(
            f"{first}: learners in containers on several hosts need a run folder path without "
            "spaces on the first learner host (mpirun splits its ssh options at spaces)"
        )
    key_files[hosts[0]] = [
        (posixpath.join(first, name), name) for name in ("id_ed25519", "known_hosts")
    ]
    lines = []
    for host in hosts[1:]:
        keys = _mpi_ssh_dir(learners, host, log_dir)
        if any(c.isspace() or c == "%" for c in keys):
            raise ValueError(
                f"{keys}: the run folder of learners in containers on {host} cannot hold spaces "
                "or '%' (their sshd reads its key files from there)"
            )
        key_files[host] = [
            (posixpath.join(keys, name), name) for name in ("host_key", "authorized_keys")
        ]
        here = [w for w in learners if w.host == host]
        line = containers.run_line(
            session_name(run_name, host),
            SSHD_WINDOW,
            [posixpath.join(w.workdir, log_dir) for w in here],
            [],
            ["sshd", str(containers.sshd_port), keys],
            # The learners of this host run in this container: their GPUs go in here.
            gpus=any(w.cuda_visible_devices for w in here),
            capabilities=SSHD_CAPABILITIES,
        )
        lines.append((host, line))
    return lines


def _learners_in_container(
    containers, session, learners, learner_hosts, actor_hosts, flags, logdir, log_dir
) -> str:
    """The learners' mpirun, run in one container on the first learner host, with that host's
    ranks; it starts the other hosts' ranks over SSH in their sshd containers (after waiting
    for those to listen), with the run's key."""
    run_name = posixpath.basename(log_dir)
    first = learners[0].host
    others = list(dict.fromkeys(w.host for w in learners if w.host != first))
    options = ["-x", "PYTHONUNBUFFERED=1"]
    wait = ""
    if others:
        keys = _mpi_ssh_dir(learners, first, log_dir)
        port = containers.sshd_port
        options += [
            "--mca",
            "plm_rsh_args",
            f"-p {port} -i {keys}/id_ed25519 -o UserKnownHostsFile={keys}/known_hosts "
            "-o StrictHostKeyChecking=yes -o BatchMode=yes -o IdentitiesOnly=yes",
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
        ]
        targets = " ".join(shlex.quote(f"{host}/{port}") for host in others)
        wait = (
            f"for target in {targets}; do for second in $(seq 120); do "
            '(exec 3<>"/dev/tcp/$target") 2>/dev/null && break; sleep 1; done; done; '
        )
    contexts = []
    for worker in learners:
        command = learner_command(
            IMAGE_PYTHON,
            "experiment.py",
            learner_hosts,
            actor_hosts,
            [*flags, *_container_run_folder(worker, logdir, run_name)],
        )
        contexts.append(
            [
                "-np",
                "1",
                "-wdir",
                IMAGE_WORKDIR,
                "-x",
                f"CUDA_VISIBLE_DEVICES={worker.cuda_visible_devices}",
                *command,
            ]
        )
    # This host's ranks as localhost: mpirun may not recognise the CSV's name for it as itself,
    # and it has no sshd container.
    hosts = ["localhost" if w.host == first else w.host for w in learners]
    mpirun = _mpirun(hosts, options, contexts)
    return wait + containers.run_line(
        session,
        LEARNERS_WINDOW,
        [posixpath.join(w.workdir, log_dir) for w in learners if w.host == first],
        # Open MPI refuses root unless told: a container may run as root (rootful podman).
        ["OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"],
        mpirun,
        gpus=any(w.cuda_visible_devices for w in learners),
    )


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
    workdir: str,
    log_dir: str,
    line: str,
    name: str,
    max_restarts: int,
    max_delay: int,
    private: bool = True,
) -> str:
    """Runs `line` in `workdir`, logging to the run's folder, keeping its exit status, and starts
    it again when it dies (see `Restarts`); with `private`, the folder and log it makes are
    owner-only (umask 077, which the process inherits)."""
    log = shlex.quote(f"{log_dir}/{name}.log")
    say = f"[frontend] {name} exited with code $code;"
    final = "|".join(str(code) for code in run_folder.FINAL_EXIT_CODES)
    script = (
        ("umask 077; " if private else "")
        + f"cd {shlex.quote(workdir)} && mkdir -p {shlex.quote(log_dir)} || exit 1; "
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

    with impala_flags.as_forwarded(forwarded):
        experiment.check_run_flags()
