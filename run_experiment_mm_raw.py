"""Start, watch and stop a multi-host run described by a workers CSV (see sandbox/README.md).

  python run_experiment_mm_raw.py --workers_csv_path=sandbox/local_workers_example.csv \\
      --level_name=BreakoutNoFrameskip-v4 --agent_name=SimpleConvNetAgent
  python run_experiment_mm_raw.py --workers_csv_path=... --action=status
  python run_experiment_mm_raw.py --workers_csv_path=... --action=stop
  python run_experiment_mm_raw.py --workers_csv_path=... --dry_run

Every process runs in a tmux session named after the run on its host (one window per process),
so the run does not depend on this machine staying connected. Learners start on the first
learner host: a learner alone as its own process, several with one mpirun. Hosts that are this
machine are driven through local tmux; the others over SSH. Every experiment.py flag given here
is passed to every process.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags

from impala import flags as impala_flags
from impala import run_folder, run_secret, run_tls
from impala.launch import containers, hosts, planning, run_control, run_plan, tmux, workers_csv

FLAGS = flags.FLAGS
flags.DEFINE_string("workers_csv_path", None, "The workers CSV (see sandbox/README.md).")
flags.DEFINE_enum("action", "start", ["start", "status", "stop"], "What to do with the run.")
flags.DEFINE_bool("dry_run", False, "Print every command for every host, and exit.")
flags.DEFINE_string(
    "run_name",
    "",
    "Names the run's tmux sessions and its folder <logdir>/<run_name> on every host (default: "
    "--experiment if given, else the CSV's name).",
)
flags.DEFINE_string(
    "known_hosts",
    "~/.ssh/known_hosts",
    "known_hosts file for SSH host keys, here and for mpirun on the first learner host.",
)
flags.DEFINE_bool(
    "accept_unknown_host_keys",
    False,
    "Accept SSH host keys not in known_hosts (prints a warning). Off: unknown hosts are refused.",
)

flags.DEFINE_integer(
    "max_actor_restarts",
    100,
    "Restarts of each actor whose process dies (killed, crashed), in its tmux window, after 1, 2, "
    "4 ... s up to --restart_max_delay_secs; never after exit code 0, 2 or 130.",
)
flags.DEFINE_integer(
    "max_learner_restarts",
    3,
    "Restarts of the learners (the learner alone, or their mpirun) when a learner dies; they "
    "resume from the latest checkpoint.",
)
flags.DEFINE_integer(
    "restart_max_delay_secs", 30, "The longest wait before restarting a process that died."
)
flags.DEFINE_string(
    "docker_image",
    "",
    "Run every process in a container of this image (docker/Dockerfile; it must be on every "
    "host) instead of the CSV's python: host networking, the host's run folder mounted at its "
    "own path, the host user's uid (see docker/README.md). Give --action=status and stop the "
    "same. Empty: bare processes.",
)
flags.DEFINE_integer(
    "container_sshd_port",
    2222,
    "With --docker_image and learners on several hosts: the port of the SSH server that each "
    "learner host but the first runs in a container, through which the first one's mpirun "
    "starts the learners there (with keys made for the run).",
)
flags.DEFINE_string(
    "container_runtime",
    "docker",
    "The command that runs containers on the hosts, with any options of its own, e.g. podman "
    "or 'podman --runtime runc'.",
)

_HERE = os.path.dirname(os.path.abspath(__file__))


def run_name_for(csv_path: str) -> str:
    """The run's name: --run_name, or --experiment (the same thing for experiment.py), or the
    CSV's file name."""
    if FLAGS.run_name and FLAGS.experiment and FLAGS.run_name != FLAGS.experiment:
        raise ValueError(
            f"--run_name={FLAGS.run_name} and --experiment={FLAGS.experiment} disagree: "
            f"both name the run's folder; give one"
        )
    name = FLAGS.run_name or FLAGS.experiment or os.path.splitext(os.path.basename(csv_path))[0]
    run_folder.check_name(name)
    if not name.isprintable():  # the CSV's name may come from someone else, like its rows
        raise ValueError(
            f"run name {name!r} (--run_name, --experiment or the CSV's file name): has a control "
            "or other non-printable character"
        )
    return name


def local_secret(run_name: str) -> str:
    """The run's secret, kept in its run folder on this machine (made on the first start): the
    frontend copies it to every host's run folders. Rotate it by writing a new one there."""
    run_dir = run_folder.path(os.path.join(_HERE, FLAGS.logdir), run_name)
    run_folder.make_checked(run_dir)
    secret, created = run_secret.ensure(run_secret.path_in(run_dir))
    print(f"run secret {'created in' if created else 'from'} {run_secret.path_in(run_dir)}")
    return secret


def local_tls(run_name: str) -> str:
    """The run's TLS bundle (--transport_tls), kept beside its secret on this machine (made on
    the first start with the flag): the frontend copies it wherever it copies the secret."""
    path = run_tls.path_in(run_folder.path(os.path.join(_HERE, FLAGS.logdir), run_name))
    material, created = run_tls.ensure(path)
    print(f"run TLS bundle {'created in' if created else 'from'} {path}")
    return material.pem()


def containers_from_flags() -> containers.Containers | None:
    """The containers every process runs in (--docker_image), or None for bare processes."""
    if not FLAGS.docker_image:
        return None
    return containers.Containers(
        FLAGS.docker_image, tuple(FLAGS.container_runtime.split()), FLAGS.container_sshd_port
    )


def print_plan(plans: list[run_plan.HostPlan]) -> None:
    for plan in plans:
        how = (
            "local tmux"
            if plan.local
            else (f"ssh {plan.worker.ssh_user}@{plan.host}:{plan.worker.ssh_port}")
        )
        where = f", containers of {plan.containers.image}" if plan.containers else ""
        print(f"# {plan.host} ({how}), tmux session {plan.session}{where}")
        for path in plan.secret_paths:
            print(f"write {path}: the run secret (owner-only; not shown)")
        for path in plan.tls_paths:
            print(f"write {path}: the run's TLS bundle (owner-only; not shown)")
        for path, name in plan.key_files:
            print(f"write {path}: {containers.MPI_SSH_FILES[name]} (owner-only; made at start)")
        for path, content in plan.files:
            print(f"write {path}:")
            print("".join(f"    {line}\n" for line in content.splitlines()), end="")
        for window in plan.windows:
            print(f"window {window.name}: {window.command}")
        print()


_MAX_RESTARTS = 1_000_000
_MAX_RESTART_DELAY_SECS = 86_400


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    # Paramiko's own messages may quote what a host sent (its SSH greeting, before its key is
    # checked) as it was; what matters of them reaches the user as HostError, made printable.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    if FLAGS.private_run_files:
        # The run folder here: its secret, TLS bundle and SSH keys (and the windows' logs on
        # every host: `run_plan.plan_run`).
        run_folder.keep_private()
    if not FLAGS.workers_csv_path:
        print("run_experiment_mm_raw.py: error: --workers_csv_path is required", file=sys.stderr)
        return 2
    try:
        # The windows' restart loops do shell arithmetic on these: 64-bit integers.
        for name in ("max_actor_restarts", "max_learner_restarts"):
            if not 0 <= FLAGS[name].value <= _MAX_RESTARTS:
                raise ValueError(f"--{name}={FLAGS[name].value}: must be in 0-{_MAX_RESTARTS}")
        if not 1 <= FLAGS.restart_max_delay_secs <= _MAX_RESTART_DELAY_SECS:
            raise ValueError(
                f"--restart_max_delay_secs={FLAGS.restart_max_delay_secs}: must be in "
                f"1-{_MAX_RESTART_DELAY_SECS} (a day)"
            )
        workers = workers_csv.read_workers(FLAGS.workers_csv_path, default_workdir=_HERE)
        given = impala_flags.flag_values(only_given=True)
        if FLAGS.action == "start":
            # As every process will, dry run or not. Status and stop start nothing: a bad flag
            # must not keep a run from being stopped.
            planning.check_hyperparameters(given)
        if not FLAGS.logdir:
            raise ValueError("--logdir is empty: the run needs a folder on each host")
        # The run folder (--logdir, --experiment) is chosen here, once, for every process.
        run_name = run_name_for(FLAGS.workers_csv_path)
        plans = run_plan.plan_run(
            workers,
            planning.forwarded_flags(given),
            run_name,
            logdir=FLAGS.logdir,
            accept_unknown_host_keys=FLAGS.accept_unknown_host_keys,
            known_hosts=FLAGS.known_hosts,
            restarts=tmux.Restarts(
                FLAGS.max_actor_restarts, FLAGS.max_learner_restarts, FLAGS.restart_max_delay_secs
            ),
            containers=containers_from_flags(),
            tls=bool(given.get("transport_tls")),
            private=FLAGS.private_run_files,
            num_policies=int(given.get("num_policies", 1)),
            source=FLAGS.workers_csv_path,
            synchronous_round=(FLAGS.batch_size, FLAGS.num_envs_per_actor)
            if FLAGS.col_workers_communication == "synchronous"
            else None,
        )
    except ValueError as error:
        print(f"run_experiment_mm_raw.py: error: {error}", file=sys.stderr)
        return 2
    if FLAGS.dry_run:
        print_plan(plans)
        return 0
    if FLAGS.accept_unknown_host_keys:
        print(
            "WARNING: --accept_unknown_host_keys: SSH host keys not in known_hosts are "
            "accepted without verification",
            file=sys.stderr,
        )
    try:
        ssh = hosts.SshOptions(FLAGS.accept_unknown_host_keys, FLAGS.known_hosts)
        if FLAGS.action == "start":
            secret = local_secret(run_name)
            tls_bundle = local_tls(run_name) if any(plan.tls_paths for plan in plans) else ""
            keys = None
            if any(plan.key_files for plan in plans):
                local_run = run_folder.path(os.path.join(_HERE, FLAGS.logdir), run_name)
                keys = run_control.run_ssh_keys(os.path.join(local_run, containers.MPI_SSH_DIR))
            return run_control.start_run(plans, ssh, secret, keys, tls_bundle)
        actions = {"status": run_control.print_status, "stop": run_control.stop_run}
        return actions[FLAGS.action](plans, ssh)
    except (hosts.HostError, run_secret.SecretError, run_tls.TlsError, ValueError) as error:
        # ValueError: this machine's run folder is another user's to change (`check_safe`).
        print(f"run_experiment_mm_raw.py: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    app.run(main)
