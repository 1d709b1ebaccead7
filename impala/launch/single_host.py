"""Train on this machine through the real distributed path: learner and actor processes, the
learners of a policy under one mpirun when several (their ranks talk through shared memory).

  python run_local.py                                  # 1 learner, 2 actors, Pong (make train)
  python run_local.py --num_learners=2 --num_actors=4 --level_name=BreakoutNoFrameskip-v4
  python run_local.py --experiment=PongNoFrameskip-v4-20261122-101500   # resume that run

Every experiment.py flag given here is passed to every process. The run lives in
<logdir>/<experiment> (see `impala/run_folder.py`); starting again on an existing run folder
resumes it with the flags it was started with, except those given again here. The learners'
progress shows in the terminal; each process also logs to the run folder. Ctrl-C stops every
process of the run.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Mapping

from absl import app, flags

from impala import configs, run_folder, run_secret, run_tls
from impala import flags as impala_flags
from impala.launch import planning
from impala.launch.ports import free_ports
from impala.launch.supervisor import ROOT, Group, Supervised, stop, supervise

FLAGS = flags.FLAGS
flags.DEFINE_integer(
    "num_learners",
    1,
    "Learner processes of each policy (under mpirun when more than one, one mpirun per policy).",
)
flags.DEFINE_integer("num_actors", 2, "Actor processes.")
flags.DEFINE_float("stop_timeout_secs", 15.0, "How long processes get to exit before SIGKILL.")
flags.DEFINE_integer(
    "max_actor_restarts",
    100,
    "Restarts of each actor that dies (killed, crashed) before it is left dead; they come after "
    "1, 2, 4 ... s, up to --restart_max_delay_secs, and the delay starts again at 1 s after 5 "
    "minutes of running.",
)
flags.DEFINE_float(
    "restart_max_delay_secs",
    30.0,
    "The longest wait before restarting a process that died (the waits double up to it).",
)
flags.DEFINE_integer(
    "max_learner_restarts",
    3,
    "Restarts of the learners, from the run's latest checkpoint, when one of them dies; the "
    "actors reconnect to them by themselves.",
)


def plan(
    num_learners: int,
    num_actors: int,
    flags_to_forward: list[str],
    python: str,
    as_root: bool,
    num_policies: int = 1,
) -> list[tuple[list[str], list[list[str]]]]:
    """Each policy's learner command (mpirun when several) and its actors' commands, on
    localhost: `num_learners` learners per policy, and actor i of `num_actors` playing for
    policy i mod `num_policies` (as that policy's actor i // `num_policies`). The learners of a
    run of several policies also get the address of each policy's rank 0 (`--policy_hosts`)
    and of every learner (`--run_learner_hosts`)."""
    script = os.path.join(ROOT, "experiment.py")
    ports = free_ports(num_learners * num_policies)
    chiefs = ",".join(f"localhost:{port}" for port in ports[::num_learners])
    everyone = ",".join(f"localhost:{port}" for port in ports)
    plans = []
    for policy in range(num_policies):
        own_ports = ports[policy * num_learners : (policy + 1) * num_learners]
        learner_hosts = [f"localhost:{port}" for port in own_ports]
        actor_hosts = ["localhost"] * planning.actors_of(policy, num_actors, num_policies)
        flags = [*flags_to_forward, *([f"--policy={policy}"] if num_policies > 1 else [])]
        population = [f"--policy_hosts={chiefs}", f"--run_learner_hosts={everyone}"]
        learner_flags = [*flags, *(population if num_policies > 1 else [])]
        learner = planning.learner_command(
            python, script, learner_hosts, actor_hosts, learner_flags
        )
        if num_learners > 1:
            learner = planning.mpirun_command(["localhost"] * num_learners, learner, as_root)
        actors = [
            planning.actor_command(python, script, task, learner_hosts, actor_hosts, flags)
            for task in range(len(actor_hosts))
        ]
        plans.append((learner, actors))
    return plans


# What a run trained with before a flag existed, for the flags whose default has changed since:
# the cooldown (2026-11-29; the default is a 15% cooldown since 2026-12-04) and replay
# (2026-12-05; the default replays half of each batch since 2026-12-07).
_BEFORE_THE_FLAG = {"learning_rate_cooldown_fraction": 0.0, "replay_parameters": ""}


def run_flags(run_dir: str) -> tuple[dict[str, object], int, int, str]:
    """The experiment.py flags for every process, the numbers of learners and actors, and a line
    saying how a resumed run resumes ("" for a new run).

    Those given here; when `run_dir` is an earlier run's folder, the rest as that run was
    started with (its flags.json, whose learner and actor lists give the numbers).

    Raises:
      ValueError: one line, for a saved value the processes could not take.
    """
    given = impala_flags.flag_values(only_given=True)
    num_learners, num_actors = FLAGS.num_learners, FLAGS.num_actors
    saved, saved_actors, path = _saved_flags(run_dir)
    if saved is None:
        return given, num_learners, num_actors, ""
    if "preset" in given and given["preset"] != saved.get("preset", ""):
        # The saved values of the old preset would be forwarded as given and beat the new one.
        raise ValueError(
            f"--preset={given['preset']}: {run_dir} was started with "
            f"--preset={saved.get('preset', '')}; resume it without --preset (its flags are "
            f"kept), or start a new run"
        )
    if not FLAGS["num_learners"].present:
        num_learners = len(saved.get("learner_hosts") or [None])
    if not FLAGS["num_actors"].present and saved_actors:
        num_actors = saved_actors
    # Parsed as the processes will parse them when forwarded: the file may have been edited.
    parsed = {}
    own = impala_flags.flag_values()
    for name, value in saved.items():
        if name in own and name not in run_folder.PER_PROCESS_FLAGS:
            try:
                parsed[name] = impala_flags.parse_saved(name, value)
            except ValueError as error:
                raise ValueError(f"{path}: {error}") from None
    # A flag added after the run was started is not in its file: it trained with the value that
    # turned the flag's feature off, which the flag's default since is not.
    for name, value in _BEFORE_THE_FLAG.items():
        parsed.setdefault(name, value)
    saved_policies = parsed.get("num_policies", 1)
    if "num_policies" in given and given["num_policies"] != saved_policies:
        raise ValueError(
            f"--num_policies={given['num_policies']}: {run_dir} trains {saved_policies} "
            "policies; resume it without --num_policies, or start a new run"
        )
    preset = given.get("preset", parsed.get("preset", ""))
    # Every value the processes would not get by themselves: a saved value equal to the
    # default still beats the preset's.
    kept = {
        name: value
        for name, value in parsed.items()
        if name not in given and value != impala_flags.unset_value(name, preset)
    }
    # A flag whose default follows others is kept where the processes would imply another
    # value than the run's from what is forwarded.
    kept.update(configs.implied_to_keep(parsed, {**kept, **given}, _processes_values))
    forwarded = {**kept, **given}
    note = (
        f"[run_local] resuming {run_dir} as it was started: {num_learners} learner(s), "
        f"{num_actors} actor(s)"
        + (f", {planning.shell_line(planning.forwarded_flags(kept))}" if kept else "")
    )
    return forwarded, num_learners, num_actors, note


def _processes_values(forwarded: Mapping[str, object]) -> dict[str, object]:
    """The values the run's processes give the flags whose default follows others, when a
    launcher passes on `forwarded`."""
    with impala_flags.as_forwarded(forwarded):
        return {name: FLAGS[name].value for name in configs.IMPLIED_FLAGS}


def _saved_flags(run_dir: str) -> tuple[dict[str, object] | None, int, str]:
    """The flags `run_dir`'s run was started with (in a run of several policies, those of its
    first policy that saved them), its number of actors (0 if its files do not say), and the
    file the flags came from.

    Raises:
      ValueError: one line, for a flags file that is not a JSON object or whose host lists are
        not lists of hosts.
    """
    own = run_folder.read_flags(run_dir)
    if own is not None:
        each = [(run_dir, own)]
    else:
        folders = [
            run_folder.policy_path(run_dir, policy) for policy in run_folder.policies_in(run_dir)
        ]
        each = [(folder, run_folder.read_flags(folder)) for folder in folders]
    found = [(folder, flags) for folder, flags in each if flags is not None]
    if not found:
        return None, 0, ""
    for folder, values in found:
        for name in ("learner_hosts", "actor_hosts"):
            hosts = values.get(name, [])
            if not (isinstance(hosts, list) and all(isinstance(host, str) for host in hosts)):
                raise ValueError(
                    f"{os.path.join(folder, run_folder.FLAGS_FILE)}: {name}={hosts!r}: expected "
                    "a list of hosts"
                )
    first_folder, first = found[0]
    # A policy whose learners never saved its flags had as many actors as the first that did.
    actors = sum(len((values or first).get("actor_hosts", [])) for _, values in each)
    return first, actors, os.path.join(first_folder, run_folder.FLAGS_FILE)


MAX_PROCESSES = 1024
MAX_RESTART_DELAY_SECS = 86_400


def check_synchronous_rounds(given: dict[str, object], num_learners: int, num_actors: int) -> None:
    """In synchronous collection (`--col_workers_communication`), raises a one-line error if a
    learner's batch needs more trajectories than its actors give with one version: it would
    wait for them forever while they wait for its next weights.

    Args:
      given: the flags every process gets (the others take their defaults).
      num_learners: learners per policy.
      num_actors: actors in all (actor i plays for policy i mod --num_policies).
    """

    def value(name: str):
        return given.get(name, FLAGS[name].default)

    if value("col_workers_communication") != "synchronous":
        return
    num_policies = int(value("num_policies"))
    # The fewest actors any learner has: the last policy's last learner.
    policy_actors = planning.actors_of(num_policies - 1, num_actors, num_policies)
    fewest = planning.actors_of(num_learners - 1, policy_actors, num_learners)
    planning.check_synchronous_round(
        int(value("batch_size")), int(value("num_envs_per_actor")), fewest
    )


def check_launcher_flags(num_learners: int, num_actors: int, num_policies: int = 1) -> None:
    """Raises a one-line error for a flag of run_local.py itself out of range (the numbers of
    learners per policy and actors as `run_flags` gives them)."""
    for name, value in (("num_learners", num_learners), ("num_actors", num_actors)):
        if value < 1:
            raise ValueError(f"--{name}={value}: must be at least 1")
        if value > MAX_PROCESSES:
            raise ValueError(
                f"--{name}={value}: must be at most {MAX_PROCESSES} (all run on this machine)"
            )
    if num_learners * num_policies > MAX_PROCESSES:
        raise ValueError(
            f"--num_learners={num_learners}: {num_learners * num_policies} learners for "
            f"--num_policies={num_policies}, more than {MAX_PROCESSES} (all run on this machine)"
        )
    if num_actors < num_policies:
        raise ValueError(
            f"--num_actors={num_actors}: fewer than --num_policies={num_policies}; every policy "
            "needs an actor (actor i plays for policy i mod --num_policies)"
        )
    for name in ("max_actor_restarts", "max_learner_restarts"):
        if FLAGS[name].value < 0:
            raise ValueError(f"--{name}={FLAGS[name].value}: must be >= 0")
    if not 0 <= FLAGS.restart_max_delay_secs <= MAX_RESTART_DELAY_SECS:  # NaN too
        # The same ceiling as run_experiment_mm_raw.py's: inf would wait forever.
        raise ValueError(
            f"--restart_max_delay_secs={FLAGS.restart_max_delay_secs}: must be in "
            f"0-{MAX_RESTART_DELAY_SECS} (a day)"
        )
    if not 0 < FLAGS.stop_timeout_secs < math.inf:
        # NaN, 0 or less would SIGKILL the learners before they save.
        raise ValueError(
            f"--stop_timeout_secs={FLAGS.stop_timeout_secs}: must be a finite number > 0"
        )


def make_run_files(run_dir: str, given: Mapping[str, object]) -> None:
    """The run secret in `run_dir`, and with --transport_tls among the flags `given` the run's
    TLS bundle beside it: made before any process starts (and kept when there), so that every
    process reads them from the run folder.

    Raises:
      SecretError, TlsError: a file there that cannot be used, or cannot be written.
    """
    run_secret.ensure(run_secret.path_in(run_dir))
    if given.get("transport_tls"):
        run_tls.ensure(run_tls.path_in(run_dir))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _already_stopping(signum, frame):
    print("[run_local] already stopping: the learners are saving", flush=True)


# Ctrl-C, SIGTERM and SIGHUP all stop the run.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.logdir:
        print("run_local.py: error: --logdir is empty: the run needs a folder", file=sys.stderr)
        return 2
    try:
        experiment_name, run_dir, given, num_learners, num_actors = _checked_run()
    except ValueError as error:
        print(f"run_local.py: error: {error}", file=sys.stderr)
        return 2
    num_policies = int(given.get("num_policies", 1))
    if FLAGS.private_run_files:
        # The run folder and the logs, and everything the processes started here write.
        run_folder.keep_private()
    try:
        run_folder.make_checked(run_dir)  # checked before its flags were read, and now it exists
        make_run_files(run_dir, given)
    except (run_secret.SecretError, run_tls.TlsError, ValueError) as error:
        print(f"run_local.py: error: {error}", file=sys.stderr)
        return 2
    try:
        plans = plan(
            num_learners,
            num_actors,
            [
                *planning.forwarded_flags(given),
                f"--logdir={os.path.abspath(FLAGS.logdir)}",
                f"--experiment={experiment_name}",
            ],
            sys.executable,
            as_root=os.geteuid() == 0,
            num_policies=num_policies,
        )
    except OSError as error:
        print(f"run_local.py: error: no free port for the learners: {error}", file=sys.stderr)
        return 1
    if num_policies == 1:
        print(f"[run_local] {num_learners} learner(s), {num_actors} actor(s); logs in {run_dir}/")
    else:
        print(
            f"[run_local] {num_policies} policies, each with {num_learners} learner(s) and "
            f"{num_actors // num_policies}"
            + ("" if num_actors % num_policies == 0 else f" or {num_actors // num_policies + 1}")
            + f" actor(s) (actor i plays for policy i mod {num_policies}); logs in "
            f"{run_dir}/policy_<k>/"
        )
    return _run(_groups(run_dir, plans))


def _checked_run() -> tuple[str, str, dict[str, object], int, int]:
    """The run's name and folder, the flags of its processes and the numbers of learners (per
    policy) and actors (in all), checked as every process will check them, before any starts;
    prints how a resumed run resumes.

    Raises:
      ValueError: one line, for a flag or a saved value that the run cannot take.
    """
    run_folder.check_name(FLAGS.experiment)
    experiment_name = FLAGS.experiment or run_folder.default_name(FLAGS.level_name)
    run_dir = run_folder.path(FLAGS.logdir, experiment_name)
    run_folder.check_safe(run_dir)  # before its flags.json is read
    given, num_learners, num_actors, resuming = run_flags(run_dir)
    planning.check_hyperparameters(given)  # as every process will, before any starts
    check_launcher_flags(num_learners, num_actors, int(given.get("num_policies", 1)))
    check_synchronous_rounds(given, num_learners, num_actors)
    if resuming:
        print(resuming)
    return experiment_name, run_dir, given, num_learners, num_actors


def _run(groups: list[Group]) -> int:
    """Starts every policy's learners and actors and supervises them until the learners finish
    or the run is stopped; returns the launcher's exit code."""
    # SIGINT explicitly too: a shell starts background jobs with it ignored, and that would make
    # Ctrl-C's signal do nothing.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _raise_interrupt)
    for group in groups:
        for role in (group.learners, *group.actors):
            role.start()
    try:
        return supervise(groups, FLAGS.stop_timeout_secs)
    except KeyboardInterrupt:
        # A second Ctrl-C or SIGTERM (a scheduler signalling every process, an impatient user)
        # must not cut the stop short: the learners are saving.
        for signum in _STOP_SIGNALS:
            signal.signal(signum, _already_stopping)
        print("\n[run_local] stopping every process of the run...")
        stop([p for group in groups for p in group.processes()], FLAGS.stop_timeout_secs)
        print("[run_local] stopped")
        return 130


def _groups(run_dir: str, plans: list[tuple[list[str], list[list[str]]]]) -> list[Group]:
    """Each policy's learners and actors, as roles restarted within the flags' caps, logging
    in the run folder (a run of several policies: in each policy's folder)."""
    groups = []
    for policy, (learner_argv, actor_argvs) in enumerate(plans):
        folder, owner = run_dir, ""
        if len(plans) > 1:
            folder, owner = run_folder.policy_path(run_dir, policy), f"policy {policy}'s "
            os.makedirs(folder, exist_ok=True)
        learners = Supervised(
            f"{owner or 'the '}learners",
            learner_argv,
            os.path.join(folder, "learners.log"),
            FLAGS.max_learner_restarts,
            FLAGS.restart_max_delay_secs,
            learners=True,
            shown_as=f"[policy {policy}] " if owner else "",
        )
        actors = [
            Supervised(
                f"{owner}actor {task}",
                argv,
                os.path.join(folder, f"actor_{task}.log"),
                FLAGS.max_actor_restarts,
                FLAGS.restart_max_delay_secs,
            )
            for task, argv in enumerate(actor_argvs)
        ]
        groups.append(Group(learners, actors))
    return groups
