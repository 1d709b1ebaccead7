"""Run planning: the exact command lines of learners, actors and mpirun."""

import random
import shlex
import socket

from impala.launch import planning, single_host


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
        "mpirun -np 3 -H h1:2,h2:1 --bind-to none --map-by slot --allow-run-as-root "
        "-x PYTHONUNBUFFERED python x.py"
    )
    assert "--allow-run-as-root" not in planning.mpirun_command(["h1"], ["x"], as_root=False)


def test_shell_line_round_trips_awkward_values():
    argv = ["python", "--level_name=ALE/Pong-v5", "--logdir=/tmp/a b", "--x=it's"]
    assert shlex.split(planning.shell_line(argv)) == argv


def test_local_plan_uses_free_ports_and_mpirun_only_for_several_learners():
    learner, actors = single_host.plan(1, 2, ["--seed=1"], "py", as_root=False)
    assert learner[:4] == ["py", "-u", learner[2], "--job_name=learner"]
    assert learner[2].endswith("experiment.py")
    hosts = learner[4].removeprefix("--learner_hosts=")
    port = int(hosts.removeprefix("localhost:"))
    low, high = single_host._ephemeral_port_range()
    assert 10_000 <= port < low or high < port < 65_536
    assert [a[4] for a in actors] == ["--task=0", "--task=1"]
    assert all(a[5] == f"--learner_hosts={hosts}" and a[-1] == "--seed=1" for a in actors)

    learner, _ = single_host.plan(2, 2, [], "py", as_root=True)
    assert learner[:3] == ["mpirun", "-np", "2"]
    learner_hosts = next(a for a in learner if a.startswith("--learner_hosts="))
    ports = {h.split(":")[1] for h in learner_hosts.split("=")[1].split(",")}
    assert len(ports) == 2  # each learner its own port


class _ListenerFirst(random.Random):
    """Shuffles as random.Random does, but puts `first` at the head: the port tried first."""

    def __init__(self, first):
        super().__init__(0)
        self.first = first

    def sample(self, population, k):
        rest = [p for p in super().sample(population, k) if p != self.first]
        return [self.first, *rest]


def test_free_ports_are_distinct_bindable_outside_the_ephemeral_range_and_skip_listeners():
    low, high = single_host._ephemeral_port_range()
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        # A busy port tried first is skipped (the listener's port, in whatever range it is).
        ports = single_host.free_ports(5, rng=_ListenerFirst(busy))
    assert busy not in ports and len(set(ports)) == 5
    assert all(10_000 <= p < low or high < p < 65_536 for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_ports_fall_back_to_the_os_when_the_ephemeral_range_covers_everything(
    monkeypatch,
):
    monkeypatch.setattr(single_host, "_ephemeral_port_range", lambda: (1024, 65535))
    ports = single_host.free_ports(3)  # no candidates of its own: without a fallback, none
    assert len(set(ports)) == 3 and all(single_host._bindable(p) for p in ports)
