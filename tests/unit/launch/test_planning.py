"""Run planning: the exact command lines of learners, actors and mpirun."""

import json
import os
import random
import re
import shlex
import signal
import socket
import time

import pytest
from absl.flags import IllegalFlagValueError
from absl.testing import flagsaver

import experiment
from benchmarks import scaling_link, scaling_ranks
from impala import configs, run_folder, run_secret, run_tls
from impala import flags as impala_flags
from impala.launch import planning, ports, single_host, supervisor
from tests.helpers import run_without_ml_stack

FLAGS = impala_flags.FLAGS


def test_forwarded_flags_are_sorted_and_skip_per_process_flags():
    given = {
        "level_name": "BreakoutNoFrameskip-v4",
        "task": 3,
        "job_name": "actor",
        "learner_hosts": ["a:1"],
        "gradients_clipping": 40.0,
        "batch_size": 32,
    }
    assert planning.forwarded_flags(given) == [
        "--batch_size=32",
        "--gradients_clipping=40.0",
        "--level_name=BreakoutNoFrameskip-v4",
    ]


def test_flag_values_lists_and_booleans():
    assert planning.forwarded_flags({"x": ["a", "b"], "y": True, "z": False}) == [
        "--x=a,b",
        "--y=true",
        "--z=false",
    ]


def test_learner_and_actor_commands():
    flags = ["--batch_size=32"]
    assert planning.shell_line(
        planning.learner_command("py", "experiment.py", ["h1:8001", "h2:8001"], ["a", "b"], flags)
    ) == (
        "py -u experiment.py --job_name=learner --learner_hosts=h1:8001,h2:8001 "
        "--actor_hosts=a,b --batch_size=32"
    )
    assert planning.shell_line(
        planning.actor_command("py", "experiment.py", 1, ["h1:8001"], ["a", "b"], flags)
    ) == (
        "py -u experiment.py --job_name=actor --task=1 --learner_hosts=h1:8001 "
        "--actor_hosts=a,b --batch_size=32"
    )


def test_mpirun_command_groups_slots_by_host_in_rank_order():
    argv = planning.mpirun_command(["h1", "h2", "h1"], ["python", "x.py"], as_root=True)
    assert planning.shell_line(argv) == (
        "mpirun -np 3 -H h1:2,h2:1 --bind-to none --map-by slot --mca mpi_yield_when_idle 1 "
        "--allow-run-as-root "
        "-x PYTHONUNBUFFERED python x.py"
    )
    assert "--allow-run-as-root" not in planning.mpirun_command(["h1"], ["x"], as_root=False)
    # Every rank on one host: shared memory between them, no TCP transport listening.
    assert planning.shell_line(planning.mpirun_command(["h1", "h1"], ["x"], as_root=False)) == (
        "mpirun -np 2 -H h1:2 --bind-to none --map-by slot --mca mpi_yield_when_idle 1 "
        "--mca btl self,vader -x PYTHONUNBUFFERED x"
    )


def test_waiting_ranks_yield_unless_the_user_says_otherwise(monkeypatch):
    """mpirun refuses a setting given twice, and its command line overrides the environment: a
    value of the user's, in mpirun's options or in Open MPI's variable, is left to decide."""
    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle", raising=False)
    yielding = ["--mca", "mpi_yield_when_idle", "1"]
    assert planning.shell_line(yielding) in planning.shell_line(
        planning.mpirun(["h1", "h1"], [], [["x"]], np_first=True)
    )
    told = planning.mpirun(["h1"], ["--mca", "mpi_yield_when_idle", "0"], [["x"]])
    assert told.count("mpi_yield_when_idle") == 1 and told[-3:] == ["mpi_yield_when_idle", "0", "x"]
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")
    assert "mpi_yield_when_idle" not in planning.mpirun(["h1"], [], [["x"]])
    # The scaling benchmark's ranks, which stand for the learners, follow the same rule.
    link = scaling_link.Link.for_pid(1)
    ranks = scaling_ranks.ranks_command(link, "agent", 1, 1, ["none"], {}, 0, ["none"])
    assert "mpi_yield_when_idle" not in ranks
    monkeypatch.delenv("OMPI_MCA_mpi_yield_when_idle")
    ranks = scaling_ranks.ranks_command(link, "agent", 1, 1, ["none"], {}, 0, ["none"])
    assert planning.shell_line(yielding) in planning.shell_line(ranks)
    told = {"mpi_yield_when_idle": "0"}
    ranks = scaling_ranks.ranks_command(link, "agent", 1, 1, ["none"], told, 0, ["none"])
    assert planning.shell_line(["--mca", "mpi_yield_when_idle", "0"]) in planning.shell_line(ranks)


def test_ranks_on_one_host_use_shared_memory_only_unless_the_user_says_otherwise(monkeypatch):
    """Open MPI's TCP transport listens on every interface of each rank, without
    authentication; ranks of one host have no use for it. A transport list of the user's, in
    mpirun's options or in Open MPI's variable, decides instead."""
    monkeypatch.delenv("OMPI_MCA_btl", raising=False)
    shared_memory = planning.shell_line(["--mca", "btl", "self,vader"])
    assert shared_memory in planning.shell_line(planning.mpirun(["h1", "h1"], [], [["x"]]))
    assert "btl" not in planning.mpirun(["h1", "h2"], [], [["x"]])  # several hosts: TCP too
    told = planning.mpirun(["h1", "h1"], ["--mca", "btl", "self,tcp"], [["x"]])
    assert told.count("btl") == 1 and told[-3:] == ["btl", "self,tcp", "x"]
    monkeypatch.setenv("OMPI_MCA_btl", "self,tcp")
    assert "btl" not in planning.mpirun(["h1", "h1"], [], [["x"]])
    # The scaling benchmark's ranks stand for learners on two hosts: over TCP, on its link.
    link = scaling_link.Link.for_pid(1)
    monkeypatch.delenv("OMPI_MCA_btl")
    ranks = scaling_ranks.ranks_command(link, "agent", 1, 1, ["none"], {}, 0, ["none"])
    assert planning.shell_line(["--mca", "btl", "tcp,self"]) in planning.shell_line(ranks)
    assert ranks.count("btl") == 1


def test_shell_line_round_trips_awkward_values():
    argv = ["python", "--level_name=ALE/Pong-v5", "--logdir=/tmp/a b", "--x=it's"]
    assert shlex.split(planning.shell_line(argv)) == argv


def test_local_plan_uses_free_ports_and_mpirun_only_for_several_learners():
    ((learner, actors),) = single_host.plan(1, 2, ["--seed=1"], "py", as_root=False)
    assert learner[:4] == ["py", "-u", learner[2], "--job_name=learner"]
    assert learner[2].endswith("experiment.py")
    hosts = learner[4].removeprefix("--learner_hosts=")
    port = int(hosts.removeprefix("localhost:"))
    low, high = ports._ephemeral_port_range()
    assert 10_000 <= port < low or high < port < 65_536
    assert [a[4] for a in actors] == ["--task=0", "--task=1"]
    assert all(a[5] == f"--learner_hosts={hosts}" and a[-1] == "--seed=1" for a in actors)

    ((learner, _),) = single_host.plan(2, 2, [], "py", as_root=True)
    assert learner[:3] == ["mpirun", "-np", "2"]
    assert planning.shell_line(["--mca", "btl", "self,vader"]) in planning.shell_line(learner)
    learner_hosts = next(a for a in learner if a.startswith("--learner_hosts="))
    learner_ports = {h.split(":")[1] for h in learner_hosts.split("=")[1].split(",")}
    assert len(learner_ports) == 2  # each learner its own port


def _flag(argv, name):
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    return value


def test_each_policy_gets_its_own_learners_under_its_own_mpirun_and_every_nth_actor():
    plans = single_host.plan(2, 5, ["--num_policies=3"], "py", as_root=False, num_policies=3)
    assert len(plans) == 3
    hosts = [_flag(learner, "learner_hosts").split(",") for learner, _ in plans]
    assert all(len(group) == 2 for group in hosts)
    assert len({host for group in hosts for host in group}) == 6  # no port shared
    for policy, (learner, actors) in enumerate(plans):
        assert learner[:3] == ["mpirun", "-np", "2"]
        assert _flag(learner, "policy") == str(policy)
        # Actors 0-4 to policies 0, 1, 2, 0, 1: each a task of its policy, whose learners only
        # it knows.
        assert len(actors) == len(range(policy, 5, 3))
        assert [_flag(actor, "task") for actor in actors] == [str(t) for t in range(len(actors))]
        assert all(_flag(actor, "learner_hosts") == ",".join(hosts[policy]) for actor in actors)
        assert all(_flag(actor, "policy") == str(policy) for actor in actors)
        # Every policy's learners know each policy's rank 0, through which PBT looks.
        assert _flag(learner, "policy_hosts") == ",".join(group[0] for group in hosts)
        # And every learner of the run: the replays of all six share this host's memory.
        assert _flag(learner, "run_learner_hosts") == ",".join(h for group in hosts for h in group)
        assert all(_flag(a, "actor_hosts") == ",".join(["localhost"] * len(actors)) for a in actors)
    # One policy: no --policy flag, as before policies existed.
    ((learner, actors),) = single_host.plan(1, 2, [], "py", as_root=False)
    assert not any(a.startswith("--policy=") for a in [*learner, *actors[0]])


class _ListenerFirst(random.Random):
    """Shuffles as random.Random does, but puts `first` at the head: the port tried first."""

    def __init__(self, first):
        super().__init__(0)
        self.first = first

    def sample(self, population, k):
        rest = [p for p in super().sample(population, k) if p != self.first]
        return [self.first, *rest]


def test_free_ports_are_distinct_bindable_outside_the_ephemeral_range_and_skip_listeners():
    low, high = ports._ephemeral_port_range()
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        # A busy port tried first is skipped (the listener's port, in whatever range it is).
        found = ports.free_ports(5, rng=_ListenerFirst(busy))
    assert busy not in found and len(set(found)) == 5
    assert all(10_000 <= p < low or high < p < 65_536 for p in found)
    for port in found:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_ports_fall_back_to_the_os_when_the_ephemeral_range_covers_everything(
    monkeypatch,
):
    monkeypatch.setattr(ports, "_ephemeral_port_range", lambda: (1024, 65535))
    found = ports.free_ports(3)  # no candidates of its own: without a fallback, none
    assert len(set(found)) == 3 and all(ports._bindable(p) for p in found)


def _check_as_launcher(*argv):
    """`planning.check_hyperparameters` on a launcher's command line `argv`."""
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["run_local.py", *argv])
        planning.check_hyperparameters(impala_flags.flag_values(only_given=True))


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--queue_capacity=3", "--batch_size=16"],
            "--queue_capacity=3: must be 0 or at least --batch_size=16, or no batch ever fills",
        ),
        (["--queue_capacity=-1"], "--queue_capacity=-1: must be >= 0"),
        (["--keep_checkpoints=0"], "--keep_checkpoints=0: must be at least 1"),
        (
            ["--keep_checkpoint_every_frames=0.5"],
            "--keep_checkpoint_every_frames=0.5: must be 0 (none) or a finite number of frames",
        ),
        (["--save_every_secs=0"], "--save_every_secs=0.0: must be a finite number > 0"),
        (["--save_every_secs=inf"], "--save_every_secs=inf: must be a finite number > 0"),
        (["--num_envs_per_actor=0"], "--num_envs_per_actor=0: must be at least 1"),
        (["--actor_threads=0"], "--actor_threads=0: must be from 1 to 256"),
        (["--connect_timeout_secs=nan"], "--connect_timeout_secs=nan: must be a finite number > 0"),
        (["--num_action_repeats=0"], "--num_action_repeats=0: must be at least 1"),
        (["--seed=-1"], "--seed=-1: must be >= 0"),
        (["--repeat_action_probability=1"], "--repeat_action_probability=1.0: must be a number"),
        (
            ["--repeat_action_probability=-0.5"],
            "--repeat_action_probability=-0.5: must be a number",
        ),
        (["--frame_skip=1"], "--frame_skip=1: must be 0 (the default: 4, DeepMind's) or an"),
        (
            ["--frame_skip=1073741824", "--num_action_repeats=2"],
            "--frame_skip=1073741824: times --num_action_repeats=2 exceeds 2**31 - 1, the largest",
        ),
        (
            ["--num_action_repeats=536870912"],
            "--num_action_repeats=536870912: must be at most 536870911",
        ),
        (["--batch_reuse=0"], "--batch_reuse=0: must be at least 1"),
        (["--num_policies=0"], "--num_policies=0: must be from 1 to 64"),
        (["--num_policies=65"], "--num_policies=65: must be from 1 to 64"),
        (["--with_pbt"], "--with_pbt: needs --num_policies of at least 2 (a population), not 1"),
        (
            [
                "--col_workers_communication=synchronous",
                '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 1}]',
            ],
            "--col_workers_communication=synchronous: cannot take --replay_parameters",
        ),
        (
            ["--col_workers_communication=synchronous", "--num_policies=2", "--with_pbt"],
            "--col_workers_communication=synchronous: cannot take --with_pbt",
        ),
        (
            ["--num_policies=2", "--pbt_period_env_steps=1e5"],
            "--pbt_period_env_steps: given without --with_pbt, which it is a setting of",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_replace_fraction=0.6"],
            "--pbt_replace_fraction=0.6: must be in (0, 0.5]",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_replace_fraction=0"],
            "--pbt_replace_fraction=0.0: must be in (0, 0.5]",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_perturb_min=0.8"],
            "--pbt_perturb_min=0.8, --pbt_perturb_max=1.5: need 1 < min <= max",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_perturb_min=1.6"],
            "--pbt_perturb_min=1.6, --pbt_perturb_max=1.5: need 1 < min <= max",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_mutation_rate=1.5"],
            "--pbt_mutation_rate=1.5: must be in [0, 1]",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_period_env_steps=0"],
            "--pbt_period_env_steps=0: must be at least 1",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_objective_games=10001"],
            "--pbt_objective_games=10001: must be in [4, 10000]",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_objective_games=3"],
            "--pbt_objective_games=3: must be in [4, 10000]",
        ),
        (
            ["--num_policies=2", "--with_pbt", '--pbt_initial_hyperparameters={"2": {}}'],
            "--pbt_initial_hyperparameters: policy 2: must be a JSON object of hyperparameters",
        ),
        (
            [
                "--num_policies=2",
                "--with_pbt",
                '--pbt_initial_hyperparameters={"2": {"learning_rate": 1e-4}}',
            ],
            "--pbt_initial_hyperparameters: policy 2 is not one of the run's --num_policies=2",
        ),
        (
            [
                "--num_policies=2",
                "--with_pbt",
                '--pbt_initial_hyperparameters={"1": {"discounting": 0.9}}',
            ],
            "--pbt_initial_hyperparameters: policy 1: 'discounting' is not one PBT tunes",
        ),
        (
            [
                "--num_policies=2",
                "--with_pbt",
                '--pbt_initial_hyperparameters={"1": {"learning_rate": 1}}',
            ],
            "--pbt_initial_hyperparameters: policy 1: learning_rate=1 is outside [1e-06, 0.01]",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_initial_hyperparameters=[1]"],
            "--pbt_initial_hyperparameters: must be a JSON object by policy",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--pbt_initial_hyperparameters=" + "[" * 5000],
            "--pbt_initial_hyperparameters: JSON nested too deeply, or with a too long number",
        ),
        (
            ["--num_policies=2", "--with_pbt", '--pbt_initial_hyperparameters={"\u00b2": {}}'],
            "--pbt_initial_hyperparameters: '\u00b2' is not a policy index",
        ),
        (
            [
                "--num_policies=2",
                "--with_pbt",
                '--pbt_initial_hyperparameters={"1": {"entropy_cost": 0.02}, '
                '"1": {"learning_rate": 1e-4}}',
            ],
            "--pbt_initial_hyperparameters: '1' is given twice",
        ),
        # PBT keeps what it tunes within its ranges, and ranks and resumes a policy only within
        # them: a flag outside would leave every look sitting out.
        (
            ["--num_policies=2", "--with_pbt", "--entropy_cost=0"],
            "--entropy_cost=0.0: --with_pbt tunes it within [1e-05, 0.1]",
        ),
        (
            ["--num_policies=2", "--with_pbt", "--learning_rate=0.02"],
            "--learning_rate=0.02: --with_pbt tunes it within [1e-06, 0.01]",
        ),
        # The processes apply the preset (batch 32) before checking, and so does the launcher.
        (
            ["--preset=paper", "--queue_capacity=20"],
            "--queue_capacity=20: must be 0 or at least --batch_size=32",
        ),
    ],
)
def test_launchers_refuse_the_flags_a_process_would_refuse_in_its_one_line(argv, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        _check_as_launcher(*argv)


def test_launchers_check_the_values_the_processes_get_and_leave_their_own_flags_alone():
    # The paper preset's RMSProp takes a momentum (Adam, the default optimizer, does not).
    _check_as_launcher("--preset=paper", "--momentum=0.9", "--queue_capacity=32")
    # Launchers start learners and actors, which never read --mode=test's flags.
    _check_as_launcher("--test_num_episodes=0")
    # A resumed run's saved flags are forwarded with those given: checked together.
    with pytest.raises(
        ValueError, match=r"^--queue_capacity=20: must be 0 or at least --batch_size=32"
    ):
        planning.check_hyperparameters({"batch_size": 32, "queue_capacity": 20})
    assert FLAGS.batch_size == FLAGS["batch_size"].default
    assert FLAGS.queue_capacity == FLAGS["queue_capacity"].default


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_actors=0"], "--num_actors=0: must be at least 1"),
        (["--num_learners=-1"], "--num_learners=-1: must be at least 1"),
        (
            ["--num_learners=70000"],
            "--num_learners=70000: must be at most 1024 (all run on this machine)",
        ),
        (["--max_actor_restarts=-1"], "--max_actor_restarts=-1: must be >= 0"),
        (["--max_learner_restarts=-2"], "--max_learner_restarts=-2: must be >= 0"),
        (
            ["--restart_max_delay_secs=nan"],
            "--restart_max_delay_secs=nan: must be in 0-86400 (a day)",
        ),
        (
            ["--restart_max_delay_secs=inf"],
            "--restart_max_delay_secs=inf: must be in 0-86400 (a day)",
        ),
        (
            ["--restart_max_delay_secs=86401"],
            "--restart_max_delay_secs=86401.0: must be in 0-86400 (a day)",
        ),
        (["--stop_timeout_secs=0"], "--stop_timeout_secs=0.0: must be a finite number > 0"),
        (["--stop_timeout_secs=inf"], "--stop_timeout_secs=inf: must be a finite number > 0"),
        (
            ["--num_policies=3", "--num_actors=2"],
            "--num_actors=2: fewer than --num_policies=3; every policy needs an actor (actor i "
            "plays for policy i mod --num_policies)",
        ),
        (
            ["--num_policies=64", "--num_learners=17", "--num_actors=64"],
            "--num_learners=17: 1088 learners for --num_policies=64, more than 1024 (all run on "
            "this machine)",
        ),
    ],
)
def test_run_local_refuses_its_own_flags_out_of_range_in_one_line(argv, message):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["run_local.py", *argv])
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            single_host.check_launcher_flags(
                FLAGS.num_learners, FLAGS.num_actors, FLAGS.num_policies
            )


@pytest.mark.parametrize("name", ["col_workers_communication", "grad_workers_communication"])
@pytest.mark.parametrize("value", ["sync", "", "SYNCHRONOUS", "synchronous;rm -rf /"])
def test_a_scheme_flag_takes_only_its_two_names(name, value):
    with (
        flagsaver.flagsaver(),
        pytest.raises(IllegalFlagValueError, match=f"flag --{name}=.*: value should be one of"),
    ):
        FLAGS[name].parse(value)


@pytest.mark.parametrize(
    ("given", "num_learners", "num_actors", "message"),
    [
        ({}, 1, 1, None),  # asynchronous: a batch fills whatever the actors
        ({"col_workers_communication": "synchronous", "batch_size": 32}, 1, 2, None),  # 2 x 16
        (
            {"col_workers_communication": "synchronous", "batch_size": 32},
            1,
            1,
            "--batch_size=32: in synchronous collection a learner with 1 actor(s) of "
            "--num_envs_per_actor=16 gets 16 trajectories a version",
        ),
        (  # 5 actors for 2 learners: the second learner has 2 of them
            {"col_workers_communication": "synchronous", "num_envs_per_actor": 4, "batch_size": 12},
            2,
            5,
            "a learner with 2 actor(s) of --num_envs_per_actor=4 gets 8 trajectories",
        ),
        (  # 5 actors for 2 policies of 2 learners: policy 1's second learner has 1
            {
                "col_workers_communication": "synchronous",
                "num_policies": 2,
                "num_envs_per_actor": 4,
                "batch_size": 8,
            },
            2,
            5,
            "a learner with 1 actor(s) of --num_envs_per_actor=4 gets 4 trajectories",
        ),
    ],
)
def test_synchronous_collection_needs_batches_that_one_versions_unrolls_fill(
    given, num_learners, num_actors, message
):
    if message is None:
        single_host.check_synchronous_rounds(given, num_learners, num_actors)
        return
    with pytest.raises(ValueError, match=re.escape(message)):
        single_host.check_synchronous_rounds(given, num_learners, num_actors)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--num_policies=2", "--policy=2"],
            "--policy=2: out of range for --num_policies=2 (policies 0-1)",
        ),
        (["--policy=1"], "--policy=1: out of range for --num_policies=1 (policies 0-0)"),
        (["--policy=-1"], "--policy=-1: must be >= 0"),
        (
            ["--num_policies=2", "--experiment="],
            "--experiment: needed with --num_policies=2, so that every policy's learners use "
            "the same run folder",
        ),
    ],
)
def test_a_process_refuses_a_policy_it_cannot_be_in_one_line(argv, message):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--secret_file=s", *argv])
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            experiment.learner_job_config_from_flags()
        if "--experiment=" not in argv:
            with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
                experiment.actor_job_config_from_flags()


@pytest.mark.parametrize(
    "hosts, message",
    [
        ("localhost:1,nohost", "--policy_hosts: 'nohost' is not host:port with a port in 1-65535"),
        ("localhost:1", "--policy_hosts: names 1 learners; --with_pbt needs the rank-0 learner"),
    ],
)
def test_a_learner_refuses_policy_hosts_it_cannot_reach_the_population_by(hosts, message):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--secret_file=s", "--num_policies=2", "--with_pbt"])
        FLAGS.policy_hosts = hosts.split(",")
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            experiment.learner_job_config_from_flags()


def test_a_run_of_several_policies_resumes_with_its_policies_and_all_their_actors(tmp_path):
    saved = _saved_flags("--num_policies=2", "--batch_size=8")
    for policy, actors in ((0, 2), (1, 1)):  # 3 actors: 0 and 2 for policy 0, 1 for policy 1
        folder = tmp_path / f"policy_{policy}"
        folder.mkdir()
        (folder / run_folder.FLAGS_FILE).write_text(
            json.dumps({**saved, "learner_hosts": ["h:1", "h:2"], "actor_hosts": ["h"] * actors})
        )
    assert run_folder.policies_in(str(tmp_path)) == [0, 1]
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["run_local.py"])
        forwarded, learners, actors, note = single_host.run_flags(str(tmp_path))
    assert forwarded == {"num_policies": 2, "batch_size": 8}
    assert (learners, actors) == (2, 3)
    assert "2 learner(s), 3 actor(s)" in note
    # Its number of policies is the run's: another is refused in one line.
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["run_local.py", "--num_policies=3"])
        with pytest.raises(ValueError, match=r"^--num_policies=3: .* trains 2 policies; resume"):
            single_host.run_flags(str(tmp_path))


def test_mode_test_plays_the_policy_it_is_given_of_a_run_of_several(tmp_path):
    for policy in (0, 1):
        (tmp_path / f"policy_{policy}" / run_folder.CHECKPOINTS).mkdir(parents=True)
    (tmp_path / "policy_x").mkdir()  # not a policy's folder
    run = str(tmp_path)
    assert experiment.policy_checkpoint(run, 1) == os.path.join(run, "policy_1")
    with pytest.raises(ValueError, match=r"^--checkpoint=.*: a run of 2 policies; give --policy"):
        experiment.policy_checkpoint(run, None)
    with pytest.raises(ValueError, match=r"^--policy=2: .* holds policies 0, 1$"):
        experiment.policy_checkpoint(run, 2)
    single = tmp_path / "policy_0"
    assert experiment.policy_checkpoint(str(single), None) == str(single)
    with pytest.raises(ValueError, match=r"^--policy=0: .* is not the folder of a run of several"):
        experiment.policy_checkpoint(str(single), 0)


def test_run_local_refuses_a_bad_job_flag_in_one_line_before_starting_or_writing_anything(
    tmp_path,
):
    # Without the ML stack: the check is the launcher's own, not a process's.
    completed = run_without_ml_stack(
        "run_local.py", f"--logdir={tmp_path}", "--queue_capacity=3", "--batch_size=16"
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stderr.splitlines() == [
        "run_local.py: error: --queue_capacity=3: must be 0 or at least --batch_size=16, or no "
        "batch ever fills"
    ]
    assert completed.stdout == ""
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("code", run_folder.FINAL_EXIT_CODES)
def test_run_local_does_not_restart_a_process_that_finished_refused_or_was_stopped(code):
    role = supervisor.Supervised("actor 0", ["true"], "actor_0.log", max_restarts=5)
    assert not role.schedule_restart(code) and role.given_up
    assert supervisor.Supervised("actor 1", ["true"], "actor_1.log", 5).schedule_restart(137)


def test_a_role_killed_again_and_again_waits_longer_each_time_up_to_its_cap(tmp_path, monkeypatch):
    # A real process, SIGKILLed four times: restarted after 1, 2, 4 and then 4 s (the cap);
    # one that ran healthy for a while starts again after 1 s. The clock is the supervisor's.
    now = [1000.0]
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: now[0])
    role = supervisor.Supervised("actor 0", ["sleep", "60"], str(tmp_path / "a.log"), 10, 4.0)
    role.start()
    delays = []
    try:
        for _ in range(4):
            role.process.popen.kill()
            code = role.process.popen.wait(timeout=10)
            assert role.exit_code() == code == -signal.SIGKILL
            assert role.schedule_restart(code)
            delays.append(role.due - now[0])
            now[0] += role.due - now[0] - 0.01
            assert not role.restart_if_due()  # not yet
            now[0] += 0.01
            assert role.restart_if_due() and role.exit_code() is None
        assert delays == [1.0, 2.0, 4.0, 4.0] and role.restarts == 4
        now[0] += 300  # healthy for five minutes
        role.process.popen.kill()
        assert role.schedule_restart(role.process.popen.wait(timeout=10))
        assert role.due - now[0] == 1.0
    finally:
        role.process.popen.kill()
        role.process.popen.wait(timeout=10)


def test_a_policy_whose_learners_are_done_stops_its_actors_and_the_others_go_on(tmp_path, capsys):
    def role(name, command, learners=False, max_restarts=0):
        return supervisor.Supervised(
            name,
            ["sh", "-c", command],
            str(tmp_path / f"{name.replace(' ', '_')}.log"),
            max_restarts,
            max_delay=0.1,
            learners=learners,
        )

    # Policy 0's learners refuse their flags at once (exit 2: not restarted); policy 1's crash
    # once (restarted) and then finish after a while, their actor exiting when they do.
    marker = tmp_path / "crashed_once"
    groups = [
        supervisor.Group(
            role("policy 0 learners", "exit 2", learners=True),
            [role("policy 0 actor", "sleep 60")],
        ),
        supervisor.Group(
            role(
                "policy 1 learners",
                f"if [ -e {marker} ]; then sleep 2; else touch {marker}; exit 1; fi",
                learners=True,
                max_restarts=1,
            ),
            [role("policy 1 actor", "sleep 3")],
        ),
    ]
    for group in groups:
        for member in (group.learners, *group.actors):
            member.start()
    started = time.monotonic()
    assert supervisor.supervise(groups, stop_timeout=10) == 2
    # Policy 0's actor was stopped at once, not after its 60 s; policy 1 ran to its end.
    assert time.monotonic() - started < 20
    assert [group.code for group in groups] == [2, 0]
    assert groups[0].actors[0].process.popen.returncode == -signal.SIGTERM
    assert groups[1].learners.restarts == 1 and groups[1].actors[0].exit_code() == 0
    out = capsys.readouterr().out
    assert "policy 0 learners exited with code 2; stopping their actors" in out
    assert "policy 1 learners exited with code 1; restarting them" in out


def test_run_local_makes_the_tls_bundle_beside_the_secret_only_with_transport_tls(tmp_path):
    plain, tls = tmp_path / "plain", tmp_path / "tls"
    plain.mkdir()
    tls.mkdir()
    single_host.make_run_files(str(plain), {"batch_size": 16})
    assert sorted(os.listdir(plain)) == [run_secret.FILE_NAME]
    single_host.make_run_files(str(tls), {"transport_tls": True})
    assert sorted(os.listdir(tls)) == [run_secret.FILE_NAME, run_tls.FILE_NAME]
    bundle = run_tls.load(run_tls.path_in(str(tls)))
    single_host.make_run_files(str(tls), {"transport_tls": True})  # a resumed run keeps its own
    assert run_tls.load(run_tls.path_in(str(tls))) == bundle


def test_a_run_started_with_transport_tls_resumes_with_it(tmp_path):
    forwarded, *_ = _resume(tmp_path, _saved_flags("--transport_tls"))
    assert forwarded == {"transport_tls": True}
    single_host.make_run_files(str(tmp_path), forwarded)
    run_tls.load(run_tls.path_in(str(tmp_path)))


def _saved_flags(*argv):
    """A run's flags.json as its learner writes it for the command line `argv`."""
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", *argv])
        impala_flags.apply_preset()
        return json.loads(json.dumps(impala_flags.flag_values()))


def _resume(run_dir, saved, *argv):
    """run_local.py's `run_flags` for a run folder holding `saved` as its flags.json."""
    (run_dir / run_folder.FLAGS_FILE).write_text(json.dumps(saved))
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["run_local.py", *argv])
        return single_host.run_flags(str(run_dir))


def test_a_resumed_preset_run_gets_every_value_it_was_started_with(tmp_path):
    saved = _saved_flags(
        "--preset=paper",
        "--batch_size=16",
        "--queue_capacity=20",
        "--normalize_advantages=true",  # the default, but not the preset's
        "--actor_hosts=localhost,localhost,localhost",
    )
    forwarded, num_learners, num_actors, note = _resume(tmp_path, saved)
    assert forwarded == {
        "preset": "paper",
        "batch_size": 16,
        "queue_capacity": 20,
        "normalize_advantages": True,
    }
    assert (num_learners, num_actors) == (1, 3)
    assert note.endswith(
        "3 actor(s), --batch_size=16 --normalize_advantages=true --preset=paper --queue_capacity=20"
    )
    planning.check_hyperparameters(forwarded)  # the values the learner ran with: valid
    # What the processes get from those flags is what the run was started with.
    with impala_flags.as_forwarded(forwarded):
        assert {name: FLAGS[name].value for name in saved if name in forwarded} == {
            name: saved[name] for name in forwarded
        }
        assert FLAGS.optimizer == "rmsprop" and FLAGS.batch_reuse == 1


def test_a_run_from_before_the_cooldown_flag_resumes_without_the_default_cooldown(tmp_path):
    # Started before --learning_rate_cooldown_fraction existed, its rate fell from the start;
    # the default since is a cooldown over the budget's last 15%, which it must not turn into.
    saved = _saved_flags("--total_environment_frames=10e6")
    del saved["learning_rate_cooldown_fraction"]
    forwarded, *_ = _resume(tmp_path, saved)
    assert forwarded["learning_rate_cooldown_fraction"] == 0.0
    with impala_flags.as_forwarded(forwarded):
        assert FLAGS.learning_rate_cooldown_fraction == 0.0
    # One that recorded it keeps what it recorded, the default included.
    forwarded, *_ = _resume(tmp_path, _saved_flags("--total_environment_frames=10e6"))
    assert "learning_rate_cooldown_fraction" not in forwarded
    with impala_flags.as_forwarded(forwarded):
        assert FLAGS.learning_rate_cooldown_fraction == 0.15


def test_a_run_from_before_the_replay_default_resumes_on_fresh_trajectories_six_times(tmp_path):
    # Started when every trajectory was fresh and 6 passes the default: flags.json has both, or
    # (before --replay_parameters existed) only the passes.
    saved = _saved_flags("--replay_parameters=", "--batch_reuse=6")
    for edit in ({}, {"replay_parameters": None}):
        old = {key: value for key, value in saved.items() if key not in edit}
        forwarded, *_ = _resume(tmp_path, old)
        assert (forwarded["replay_parameters"], forwarded["batch_reuse"]) == ("", 6)
        with impala_flags.as_forwarded(forwarded):
            assert (FLAGS.replay_parameters, FLAGS.batch_reuse) == ("", 6)
    # Passes given with fresh trajectories only, or with synchronous collection: kept, where
    # the processes would otherwise imply 6 from the forwarded mix.
    for argv in (
        ("--replay_parameters=", "--batch_reuse=3"),
        ("--col_workers_communication=synchronous", "--batch_reuse=3"),
        ("--queue_capacity=32", "--batch_reuse=3"),
    ):
        forwarded, _, _, note = _resume(tmp_path, _saved_flags(*argv))
        assert (forwarded["replay_parameters"], forwarded["batch_reuse"]) == ("", 3), argv
        assert "--batch_reuse=3" in note
        with impala_flags.as_forwarded(forwarded):
            assert (FLAGS.replay_parameters, FLAGS.batch_reuse) == ("", 3)
    # One started with today's defaults keeps them, and forwards nothing for them.
    forwarded, *_ = _resume(tmp_path, _saved_flags())
    assert "replay_parameters" not in forwarded and "batch_reuse" not in forwarded
    with impala_flags.as_forwarded(forwarded):
        assert FLAGS.batch_reuse == 3 and configs.replay.parse(FLAGS.replay_parameters)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"batch_size": 16.5}, "batch_size=16.5: "),
        ({"batch_size": True}, "batch_size=True: "),
        ({"seed": 1e20}, "seed=1e+20: "),
        ({"queue_capacity": float("inf")}, "queue_capacity=inf: "),
        ({"preset": "bogus"}, "preset='bogus': "),
        ({"preset": None}, "preset=null: expected a value"),
        ({"normalize_advantages": "maybe"}, "normalize_advantages='maybe': "),
        ({"test_policy": "bogus"}, "test_policy='bogus': "),
        ({"learner_hosts": 3}, "learner_hosts=3: expected a list of hosts"),
        ({"actor_hosts": "abc"}, "actor_hosts='abc': expected a list of hosts"),
    ],
)
def test_a_hand_edited_flags_file_is_refused_in_one_line_naming_it(tmp_path, edit, message):
    saved = {**_saved_flags(), **edit}
    with pytest.raises(ValueError) as raised:
        _resume(tmp_path, saved)
    error = str(raised.value)
    assert error.startswith(f"{tmp_path / run_folder.FLAGS_FILE}: {message}")
    assert "\n" not in error


def test_a_hand_edited_value_the_processes_would_parse_is_checked_as_they_would(tmp_path):
    saved = {**_saved_flags(), "batch_size": "32", "learning_rate": "NaN"}
    forwarded, *_ = _resume(tmp_path, saved)
    assert forwarded["batch_size"] == 32
    with pytest.raises(ValueError, match=r"^--learning_rate=nan: "):
        planning.check_hyperparameters(forwarded)


@pytest.mark.parametrize("kind", ["folder", "not utf-8"])
def test_an_unreadable_flags_file_is_one_line_naming_it(tmp_path, kind):
    path = tmp_path / run_folder.FLAGS_FILE
    if kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: ") as raised:
        run_folder.read_flags(str(tmp_path))
    assert "\n" not in str(raised.value)


def test_a_learner_counts_the_learners_of_the_run_on_its_host():
    """Their replays share the host's memory: every policy's learners where the launchers name
    them (--run_learner_hosts), else the learner's own policy's; by host, whatever the port."""
    from impala.configs import LearnerJobConfig

    own = ("n1:8001", "n2:8001", "n1:8002")
    config = LearnerJobConfig(secret_file="s", learner_hosts=own)
    assert [config.learners_on_host(rank) for rank in range(3)] == [2, 1, 2]
    everyone = (*own, "n1:9001", "[::1]:9002", "n2:9003")
    config = LearnerJobConfig(secret_file="s", learner_hosts=own, run_learner_hosts=everyone)
    assert [config.learners_on_host(rank) for rank in range(3)] == [3, 2, 3]
    with pytest.raises(ValueError, match=r"^--run_learner_hosts: 'n1' is not host:port"):
        LearnerJobConfig(secret_file="s", learner_hosts=own, run_learner_hosts=("n1",))
