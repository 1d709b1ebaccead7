"""What a start writes on each host before its windows: the run's owner-only files."""

import os
import stat
import tempfile

import pytest

from impala import run_folder, run_secret, run_tls
from impala.launch import hosts, run_control, run_plan, workers_csv

CSV = """job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices,workdir,python
learner,n1,8001,22,alice,,,/w,
actor,n2,,22,bob,,,/w,
actor,n2,,22,bob,,,/w2,
"""


class _RecordingHost(hosts.Host):
    """A host that records what is written on it and the windows it starts; every other tmux
    and shell command succeeds (no session of the run exists yet)."""

    def __init__(self, plan):
        self.name = plan.host
        self.written = []

    def tmux(self, args):
        if args[0] in ("new-session", "new-window"):
            self.written.append((args[args.index("-n") + 1], "window", ""))
        return (1, "") if args[0] == "has-session" else (0, "")

    def shell(self, command):
        return 0, ""

    def write_secret(self, path, secret):
        self.written.append((path, "secret", secret))

    def write_tls(self, path, bundle):
        self.written.append((path, "tls", bundle))

    def write_file(self, path, content, *, owner_only=False):
        self.written.append((path, "file", owner_only))


def _plans(tmp_path, tls):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    return run_plan.plan_run(workers, [], "cluster", tls=tls)


def test_a_start_copies_the_tls_bundle_beside_every_secret_before_any_window(tmp_path, monkeypatch):
    connected = {}

    def connect(plan, ssh):
        connected[plan.host] = _RecordingHost(plan)
        return connected[plan.host]

    monkeypatch.setattr(hosts, "connect", connect)
    bundle = run_tls.create(str(tmp_path / "tls.pem")).pem()
    run_control.start_run(_plans(tmp_path, tls=True), hosts.SshOptions(), "ab" * 32, None, bundle)
    n1, n2 = connected["n1"], connected["n2"]
    assert [(path, kind) for path, kind, _ in n1.written] == [
        ("/w/runs/cluster/secret", "secret"),
        ("/w/runs/cluster/tls.pem", "tls"),
        ("learners", "window"),
    ]
    assert [(path, kind) for path, kind, _ in n2.written] == [
        ("/w/runs/cluster/secret", "secret"),
        ("/w2/runs/cluster/secret", "secret"),
        ("/w/runs/cluster/tls.pem", "tls"),
        ("/w2/runs/cluster/tls.pem", "tls"),
        ("actor_0", "window"),
        ("actor_1", "window"),
    ]
    assert {content for _, kind, content in n1.written + n2.written if kind == "tls"} == {bundle}


def test_a_start_that_plans_the_bundle_without_one_to_copy_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "connect", lambda plan, ssh: pytest.fail("connected"))
    with pytest.raises(hosts.HostError, match=r"needs its TLS bundle \(--transport_tls\)"):
        run_control.start_run(_plans(tmp_path, tls=True), hosts.SshOptions(), "ab" * 32)


@pytest.mark.parametrize("owner_only", [False, True])
def test_this_machine_replaces_a_planted_symlink_rather_than_writing_through_it(
    tmp_path, owner_only
):
    """Another user planted a symlink to a file of theirs at the file's name; a folder at it
    is a one-line error, not a file moved into the folder."""
    host = hosts.LocalHost("localhost")
    folder, victim = tmp_path / "run", tmp_path / "theirs"
    folder.mkdir()
    victim.write_text("theirs\n")
    target = folder / "ssh_config"
    target.symlink_to(victim)
    host.write_file(str(target), "Host a\n", owner_only=owner_only)
    assert victim.read_text() == "theirs\n"
    assert not target.is_symlink() and target.read_text() == "Host a\n"
    assert sorted(p.name for p in folder.iterdir()) == ["ssh_config"]
    mode = stat.S_IMODE(target.stat().st_mode)
    assert mode == 0o600 if owner_only else mode == 0o666 & ~run_folder.current_umask()
    (folder / "planted").mkdir()
    with pytest.raises(hosts.HostError, match=r"^localhost: writing .*/run/planted failed: "):
        host.write_file(str(folder / "planted"), "x", owner_only=owner_only)
    assert list((folder / "planted").iterdir()) == []


def test_this_machine_refuses_to_write_where_others_could_swap_the_file():
    """A folder others can write to, unless sticky, lets them rename what is written there
    and put their own in its place: refused, and so is a folder another user owns."""
    host = hosts.LocalHost("localhost")
    with tempfile.TemporaryDirectory() as scratch:
        shared = os.path.join(scratch, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        with pytest.raises(hosts.HostError, match=r"shared is writable by others and not sticky"):
            host.write_file(os.path.join(shared, "run", "secret"), "x", owner_only=True)
        os.chmod(shared, 0o1777)  # as /tmp: others cannot rename what is ours
        host.write_file(os.path.join(shared, "run", "secret"), "x", owner_only=True)
        assert os.listdir(os.path.join(shared, "run")) == ["secret"]
        if os.getuid() == 0:  # only root can give a folder to another user
            theirs = os.path.join(shared, "theirs")
            os.mkdir(theirs, 0o755)
            os.chown(theirs, 65534, 65534)
            with pytest.raises(hosts.HostError, match=r"theirs: a folder owned by another user$"):
                host.write_file(os.path.join(theirs, "run", "ssh_config"), "x")
        # A symlink on the path as given, in a folder others can write to: they could point it
        # at a folder of this user's (~/.ssh) whose real path passes.
        mine, open_folder = os.path.join(scratch, "mine"), os.path.join(scratch, "open")
        os.mkdir(mine)
        os.mkdir(open_folder)
        os.chmod(open_folder, 0o777)
        os.symlink(mine, os.path.join(open_folder, "run"))
        with pytest.raises(hosts.HostError, match=r"open is writable by others and not sticky$"):
            host.write_file(os.path.join(open_folder, "run", "authorized_keys"), "x")
        assert os.listdir(mine) == []
        with pytest.raises(hosts.HostError, match=r"not an absolute path without '\.\.'$"):
            host.write_file(os.path.join(mine, "..", "mine", "x"), "x")


def test_this_machine_keeps_its_own_copy_and_replaces_another_owner_only(tmp_path):
    host = hosts.LocalHost("localhost")
    made = str(tmp_path / "made" / "tls.pem")
    os.makedirs(os.path.dirname(made))
    bundle = run_tls.create(made).pem()
    before = os.stat(made)
    host.write_tls(made, bundle)  # the frontend's own file: left as it is
    assert os.stat(made).st_ino == before.st_ino
    copy = str(tmp_path / "host" / "runs" / "cluster" / "tls.pem")
    host.write_tls(copy, run_tls.create(str(tmp_path / "old.pem")).pem())
    host.write_tls(copy, bundle)
    assert run_tls.load(copy).pem() == bundle
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    with pytest.raises(hosts.HostError, match=r"^localhost: .*refusing to write"):
        host.write_tls(copy, run_secret.create(str(tmp_path / "secret")))
