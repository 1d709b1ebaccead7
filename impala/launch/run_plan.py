"""A multi-host run from a workers CSV, planned as pure functions: every host's tmux session and
the exact command of each window.

The frontend (`run_experiment_mm_raw.py`) carries the plan out through `run_control.py`; how the
learners start is `learner_plan.py`, the windows' shell is `tmux.window_command`.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence

from impala import run_secret, run_tls
from impala.launch import learner_plan
from impala.launch.containers import IMAGE_PYTHON, Containers
from impala.launch.learner_plan import LearnerLaunch
from impala.launch.planning import (
    actor_command,
    actors_of,
    check_synchronous_round,
    shell_line,
)
from impala.launch.run_layout import RunLayout, policy_layouts
from impala.launch.tmux import (
    LEARNERS_WINDOW,
    SSHD_WINDOW,
    Restarts,
    Window,
    session_label,
    session_name,
    window_command,
)
from impala.launch.workers_csv import Worker

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_RESTARTS = Restarts()


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """What the run starts on one host: a tmux session with one window per process.

    Attributes:
      worker: the first CSV row naming this host (how to reach it: SSH port, user, key).
      workers: every CSV row on this host (checked before the run starts).
      local: whether the host is this machine (reached through local tmux, not SSH).
      session: the tmux session, named after the run.
      label: the run and host as `tmux.session_label` gives them, kept in the session: status
        and stop act only on a session of this run (several run names may give one session
        name).
      windows: its windows, in start order.
      files: files to write on the host before starting (path -> content).
      secret_paths: where the run secret goes on the host (owner-only): the run folder of each
        workdir its processes run in, where they read it by default.
      tls_paths: where the run's TLS bundle goes on the host (owner-only; --transport_tls
        only): beside each of `secret_paths`, where the processes look for it.
      containers: the image its processes run in, if they run in containers.
      key_files: (path, name in `containers.MPI_SSH_FILES`): the run's SSH keys the host gets
        (owner-only), for mpirun between learner containers on several hosts.
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
    label: str = ""

    @property
    def host(self) -> str:
        return self.worker.host


def plan_run(
    workers: Sequence[Worker],
    flags: Sequence[str],
    run_name: str,
    logdir: str = "runs",
    local_hosts: frozenset[str] = LOCAL_HOSTS,
    accept_unknown_host_keys: bool = False,
    known_hosts: str = "~/.ssh/known_hosts",
    restarts: Restarts = DEFAULT_RESTARTS,
    containers: Containers | None = None,
    tls: bool = False,
    private: bool = True,
    num_policies: int = 1,
    source: str = "the workers CSV",
    synchronous_round: tuple[int, int] | None = None,
) -> list[HostPlan]:
    """Every host's tmux session and the exact command of each window.

    Learners start in a window `learners` on the first learner host: a learner alone as its own
    process, several with one mpirun that reaches the other learner hosts over SSH with a
    generated ssh config (ranks all on one host talk through shared memory only). Actors each
    get a window `actor_<task>` on their host. Every process gets the same hyperparameter
    `flags`, and the run folder `<logdir>/<run_name>` (relative to each host's workdir unless
    absolute) for its log; learners keep the run's checkpoints and summaries there. Each window
    starts its process again when it dies (`restarts`): the learners resume from the latest
    checkpoint.

    With `containers`, each window runs its process in a container of the image instead (the
    learners: the learner alone or their mpirun, in one container on the first learner host),
    with the run folder at the same path inside as on the host. With learners on several hosts
    every other learner host then runs an SSH server in a container (window `sshd`), through
    which that mpirun starts its ranks there, with the run's own keys (`key_files`).

    Each host gets the run secret in the run folder of each of its workdirs (`secret_paths`),
    and with `tls` (--transport_tls, among `flags`) the run's TLS bundle beside it
    (`tls_paths`). With `private` (--private_run_files) each window's shell makes its run
    folder and log owner-only (umask 077).

    With `num_policies` > 1 (--num_policies, among `flags`) each policy is a run of its own rows
    (`run_layout.policy_layouts` says which), in its folder `<run>/policy_<k>/`: its learners
    in a window `policy_<k>_learners` on its first learner host, its actors in windows
    `policy_<k>_actor_<task>`; the secret and TLS bundle stay in the run folder. `source` names
    the CSV in messages. `synchronous_round` (--batch_size, --num_envs_per_actor), for
    synchronous collection: every learner's actors must fill its batch with one version's
    unrolls.

    Raises:
      ValueError: something of the run that cannot be planned (see the messages).
    """
    layouts = policy_layouts(workers, flags, run_name, logdir, num_policies, source)
    if synchronous_round is not None:  # (batch size, environments per actor)
        batch_size, num_envs = synchronous_round
        # Within a policy actor i plays for learner i mod L: the last learner has the fewest.
        fewest = min(
            actors_of(len(run.learners) - 1, len(run.actors), len(run.learners)) for run in layouts
        )
        check_synchronous_round(batch_size, num_envs, fewest)
    if containers and len(layouts) > 1:
        raise ValueError(
            f"--docker_image with --num_policies={num_policies}: several policies run as "
            "bare processes only (each policy's mpirun would need SSH servers of its own in "
            "the containers of its other hosts)"
        )
    windows: dict[str, list[Window]] = {}
    files: dict[str, list[tuple[str, str]]] = {}
    key_files: dict[str, list[tuple[str, str]]] = {}
    for run in layouts:
        launch = learner_plan.plan_learners(run, containers, accept_unknown_host_keys, known_hosts)
        for host, placed in _windows(run, launch, containers, restarts, private).items():
            windows.setdefault(host, []).extend(placed)
        for host, host_files in launch.files.items():
            files.setdefault(host, []).extend(host_files)
        for host, host_keys in launch.key_files.items():
            key_files.setdefault(host, []).extend(host_keys)
    run_dir = layouts[0].run_dir
    by_host: dict[str, list[Worker]] = {}
    for worker in workers:
        by_host.setdefault(worker.host, []).append(worker)
    return [
        HostPlan(
            worker=by_host[host][0],
            workers=tuple(by_host[host]),
            local=host in local_hosts,
            session=session_name(run_name, host),
            label=session_label(run_name, host),
            windows=tuple(host_windows),
            files=tuple(files.get(host, ())),
            secret_paths=_in_run_folders(by_host[host], run_dir, run_secret.FILE_NAME),
            tls_paths=_in_run_folders(by_host[host], run_dir, run_tls.FILE_NAME) if tls else (),
            containers=containers,
            key_files=tuple(key_files.get(host, ())),
        )
        for host, host_windows in windows.items()
    ]


def _windows(
    run: RunLayout,
    launch: LearnerLaunch,
    containers: Containers | None,
    restarts: Restarts,
    private: bool,
) -> dict[str, list[Window]]:
    """Each host's windows of `run` (a policy's, in a run of several), in start order: sshd
    containers, the learners, the actors. Each logs to `<name>.log` in `run.log_dir` (a
    policy's logs are in its own folder, named as in a run of one)."""
    first = run.learners[0]
    placed = [
        (host, SSHD_WINDOW, SSHD_WINDOW, run.workdir_on(host), line, restarts.max_learner_restarts)
        for host, line in launch.sshd_lines
    ]
    placed.append(
        (
            first.host,
            run.learners_window,
            LEARNERS_WINDOW,
            first.workdir,
            launch.line,
            restarts.max_learner_restarts,
        )
    )
    placed += [
        (
            actor.host,
            run.actor_window(actor),
            actor.name,
            actor.workdir,
            _actor_line(run, actor, containers),
            restarts.max_actor_restarts,
        )
        for actor in run.actors
    ]
    windows: dict[str, list[Window]] = {}
    for host, name, log_name, workdir, line, max_restarts in placed:
        command = window_command(
            workdir,
            run.log_dir,
            line,
            name,
            max_restarts,
            restarts.max_delay_secs,
            private,
            log_name=log_name,
        )
        windows.setdefault(host, []).append(Window(name, command))
    return windows


def _actor_line(run: RunLayout, actor: Worker, containers: Containers | None) -> str:
    """The shell line of `actor`'s process, on its host or in a container."""
    if not containers:
        argv = actor_command(
            actor.python,
            "experiment.py",
            actor.task,
            run.learner_hosts,
            run.actor_hosts,
            run.run_flags,
        )
        return shell_line(["env", f"CUDA_VISIBLE_DEVICES={actor.cuda_visible_devices}", *argv])
    argv = actor_command(
        IMAGE_PYTHON,
        "experiment.py",
        actor.task,
        run.learner_hosts,
        run.actor_hosts,
        run.container_flags(actor),
    )
    return containers.run_line(
        session_name(run.run_name, actor.host),
        actor.name,
        [posixpath.join(actor.workdir, run.log_dir)],
        ["PYTHONUNBUFFERED=1", f"CUDA_VISIBLE_DEVICES={actor.cuda_visible_devices}"],
        argv,
        gpus=bool(actor.cuda_visible_devices),
    )


def _in_run_folders(workers: Sequence[Worker], log_dir: str, name: str) -> tuple[str, ...]:
    """The file `name` in the run folder of each workdir of `workers`, each once."""
    return tuple(dict.fromkeys(posixpath.join(w.workdir, log_dir, name) for w in workers))
