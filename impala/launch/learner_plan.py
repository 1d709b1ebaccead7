"""How the learners of a multi-host run start, in the window `learners` on the first learner
host: a learner alone as its own process, as run_local.py starts one (a world of one needs no
Horovod, and mpirun would open its unauthenticated out-of-band listener on every interface for
nothing); several with one mpirun, that reaches the other learner hosts over SSH.

Bare processes: mpirun's ssh reads a generated ssh config (`ssh_config`). In containers: the
learner alone, or mpirun, runs in one container on the first learner host; mpirun starts the
other hosts' ranks through an SSH server container on each (window `sshd`), with the run's own
keys.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from collections.abc import Sequence

from impala.launch import workers_csv
from impala.launch.containers import (
    IMAGE_PYTHON,
    IMAGE_WORKDIR,
    MPI_SSH_DIR,
    SSHD_CAPABILITIES,
    Containers,
)
from impala.launch.planning import learner_command, mpirun, shell_line
from impala.launch.run_layout import RunLayout
from impala.launch.tmux import LEARNERS_WINDOW, SSHD_WINDOW, session_name
from impala.launch.workers_csv import Worker


@dataclasses.dataclass(frozen=True)
class LearnerLaunch:
    """What starting the learners takes.

    Attributes:
      line: the shell line of the learners' window on the first learner host (the learner
        alone, or the mpirun of several).
      files: host -> (path, content) of files to write there first (mpirun's ssh config).
      sshd_lines: (host, shell line) of the sshd container window of each learner host but the
        first, in start order.
      key_files: host -> (path, name in `MPI_SSH_FILES`) of the run's SSH keys it gets.
    """

    line: str
    files: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    sshd_lines: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    key_files: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)


def plan_learners(
    run: RunLayout,
    containers: Containers | None,
    accept_unknown_host_keys: bool,
    known_hosts: str,
) -> LearnerLaunch:
    """How the learners start: bare, or in `containers`; a learner alone without mpirun.

    Args:
      run: the run.
      containers: the containers every process runs in, or None for bare processes.
      accept_unknown_host_keys: mpirun's ssh accepts host keys not in `known_hosts` (bare).
      known_hosts: the known_hosts file mpirun's ssh checks host keys against (bare).

    Raises:
      ValueError: a run folder path, host, user or key path mpirun cannot be given.
    """
    if len(run.learners) == 1:
        return LearnerLaunch(_alone(run, containers))
    if containers:
        return _in_containers(run, containers)
    return _bare(run, accept_unknown_host_keys, known_hosts)


def _alone(run: RunLayout, containers: Containers | None) -> str:
    """The shell line of a learner alone: its own process (Horovod stays unloaded without an
    MPI world of several, `impala/learner/world.py`), with the environment mpirun gave it; in a
    container of its own as an actor's, stopped as mpirun was (SIGUSR1 through the container's
    init, which passes it on)."""
    (worker,) = run.learners
    env = ["PYTHONUNBUFFERED=1", f"CUDA_VISIBLE_DEVICES={worker.cuda_visible_devices}"]
    if not containers:
        argv = learner_command(
            worker.python, "experiment.py", run.learner_hosts, run.actor_hosts, run.learner_flags
        )
        return shell_line(["env", *env, *argv])
    return containers.run_line(
        session_name(run.run_name, worker.host),
        LEARNERS_WINDOW,
        [posixpath.join(worker.workdir, run.log_dir)],
        env,
        _container_learner(run, worker),
        gpus=bool(worker.cuda_visible_devices),
    )


def _container_learner(run: RunLayout, worker) -> list[str]:
    """The command of `worker`'s learner in the image's container."""
    return learner_command(
        IMAGE_PYTHON,
        "experiment.py",
        run.learner_hosts,
        run.actor_hosts,
        run.container_flags(worker, learner=True),
    )


# ---- Bare processes ---------------------------------------------------------------------------


def _bare(run: RunLayout, accept_unknown_host_keys: bool, known_hosts: str) -> LearnerLaunch:
    """One mpirun, one app context per learner; with learners on several hosts, its ssh config
    on the first learner host."""
    first = run.learners[0]
    if all(w.host == first.host for w in run.learners):
        return LearnerLaunch(_mpmd_mpirun(run, []))
    # Every learner host, the first included: mpirun may not recognise the name it runs
    # under as itself. No tree spawn: only the first host has this config file. mpirun
    # splits plm_rsh_args at every space, quoted or not, so its ssh (started in mpirun's
    # folder, the first learner's workdir) gets the config's path relative to that folder:
    # only --logdir and the run's name must be free of spaces, not the workdir.
    config_arg = posixpath.join(run.log_dir, "ssh_config")
    if any(c.isspace() for c in config_arg):
        raise ValueError(
            f"--logdir={run.logdir!r} and the run name {run.run_name!r}: learners on several "
            "hosts need a run folder path without spaces (mpirun splits its ssh options at "
            "spaces)"
        )
    extra = ["--mca", "plm_rsh_args", f"-F {config_arg}", "--mca", "plm_rsh_no_tree_spawn", "1"]
    unique_hosts = list({w.host: w for w in run.learners}.values())
    config = ssh_config(unique_hosts, accept_unknown_host_keys, known_hosts)
    path = posixpath.join(first.workdir, run.log_dir, "ssh_config")
    return LearnerLaunch(_mpmd_mpirun(run, extra), files={first.host: [(path, config)]})


def _mpmd_mpirun(run: RunLayout, extra: Sequence[str]) -> str:
    """One mpirun, one app context per learner: each with its own workdir, python and GPUs."""
    options = ["-x", "PYTHONUNBUFFERED=1", *extra]
    if run.learners[0].ssh_user == "root":
        options.append("--allow-run-as-root")
    contexts = []
    for worker in run.learners:
        command = learner_command(
            worker.python, "experiment.py", run.learner_hosts, run.actor_hosts, run.learner_flags
        )
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
    argv = mpirun([worker.host for worker in run.learners], options, contexts)
    return shell_line(argv)


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


# ---- In containers ----------------------------------------------------------------------------


def _in_containers(run: RunLayout, containers: Containers) -> LearnerLaunch:
    """mpirun in one container on the first learner host; an sshd container on each other."""
    sshd_lines, key_files = _sshd_containers(run, containers)
    return LearnerLaunch(
        _learners_in_container(run, containers), sshd_lines=sshd_lines, key_files=key_files
    )


def _mpi_ssh_dir(run: RunLayout, host: str) -> str:
    """Where a learner host keeps the run's SSH keys: in the run folder of its first learner."""
    return posixpath.join(run.workdir_on(host), run.log_dir, MPI_SSH_DIR)


def _sshd_containers(run: RunLayout, containers: Containers):
    """(host, shell line) of the SSH server container of each learner host but the first, and
    host -> the keys each learner host needs."""
    hosts = list(dict.fromkeys(w.host for w in run.learners))
    if len(hosts) == 1:
        return [], {}
    first = _mpi_ssh_dir(run, hosts[0])
    if any(c.isspace() for c in first):
        raise ValueError(
            f"{first}: learners in containers on several hosts need a run folder path without "
            "spaces on the first learner host (mpirun splits its ssh options at spaces)"
        )
    key_files = {
        hosts[0]: [(posixpath.join(first, name), name) for name in ("id_ed25519", "known_hosts")]
    }
    lines = []
    for host in hosts[1:]:
        keys = _mpi_ssh_dir(run, host)
        if any(c.isspace() or c == "%" for c in keys):
            raise ValueError(
                f"{keys}: the run folder of learners in containers on {host} cannot hold spaces "
                "or '%' (their sshd reads its key files from there)"
            )
        key_files[host] = [
            (posixpath.join(keys, name), name) for name in ("host_key", "authorized_keys")
        ]
        here = [w for w in run.learners if w.host == host]
        line = containers.run_line(
            session_name(run.run_name, host),
            SSHD_WINDOW,
            [posixpath.join(w.workdir, run.log_dir) for w in here],
            [],
            ["sshd", str(containers.sshd_port), keys],
            # The learners of this host run in this container: their GPUs go in here.
            gpus=any(w.cuda_visible_devices for w in here),
            capabilities=SSHD_CAPABILITIES,
        )
        lines.append((host, line))
    return lines, key_files


def _learners_in_container(run: RunLayout, containers: Containers) -> str:
    """The learners' mpirun, run in one container on the first learner host, with that host's
    ranks; it starts the other hosts' ranks over SSH in their sshd containers (after waiting
    for those to listen), with the run's key."""
    first = run.learners[0].host
    others = list(dict.fromkeys(w.host for w in run.learners if w.host != first))
    options = ["-x", "PYTHONUNBUFFERED=1"]
    wait = ""
    if others:
        options += _container_ssh_options(_mpi_ssh_dir(run, first), containers.sshd_port)
        wait = _wait_for_sshd(others, containers.sshd_port)
    contexts = []
    for worker in run.learners:
        command = _container_learner(run, worker)
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
    hosts = ["localhost" if w.host == first else w.host for w in run.learners]
    return wait + containers.run_line(
        session_name(run.run_name, first),
        LEARNERS_WINDOW,
        [posixpath.join(w.workdir, run.log_dir) for w in run.learners if w.host == first],
        # Open MPI refuses root unless told: a container may run as root (rootful podman).
        ["OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"],
        mpirun(hosts, options, contexts),
        gpus=any(w.cuda_visible_devices for w in run.learners),
    )


def _container_ssh_options(keys: str, port: int) -> list[str]:
    """mpirun's options to start ranks through the sshd containers, with the run's keys in
    the folder `keys`."""
    return [
        "--mca",
        "plm_rsh_args",
        f"-p {port} -i {keys}/id_ed25519 -o UserKnownHostsFile={keys}/known_hosts "
        "-o StrictHostKeyChecking=yes -o BatchMode=yes -o IdentitiesOnly=yes",
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
    ]


def _wait_for_sshd(hosts: Sequence[str], port: int) -> str:
    """Shell: waits up to 2 minutes for each host's sshd container to listen on `port`."""
    targets = " ".join(shlex.quote(f"{host}/{port}") for host in hosts)
    return (
        f"for target in {targets}; do for second in $(seq 120); do "
        '(exec 3<>"/dev/tcp/$target") 2>/dev/null && break; sleep 1; done; done; '
    )
