"""What a start writes on each host before its windows: the run's owner-only files."""

import os
import shutil
import stat
import subprocess
import sys
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
        assert os.listdir(shared) == []  # refused before any folder is made there
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


def test_this_machine_writes_the_secret_only_where_no_one_else_can_swap_it(tmp_path):
    """As every other file: the window's `tee -a` would follow a log link planted there."""
    host = hosts.LocalHost("localhost")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(hosts.HostError, match=r"shared is writable by others and not sticky$"):
        host.write_secret(str(shared / "run" / "secret"), "0" * 64)
    assert not (shared / "run" / "secret").exists()


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


def _worker(workdir, python, job="actor"):
    return workers_csv.Worker(
        job=job,
        task=0,
        host="localhost",
        tf_port=None,
        ssh_port=22,
        ssh_user="me",
        ssh_key="",
        cuda_visible_devices="",
        workdir=workdir,
        python=python,
        line=2,
        policy=None,
    )


def _check(workdir, python):
    """The start's check of a row's workdir and python, run through bash here: its exit
    status and what it said."""
    command = run_control._check_worker_command(_worker(workdir, python))
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip()


def _project(folder):
    """`folder` made a project: an experiment.py and a python linked to this interpreter."""
    os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
    with open(os.path.join(folder, "experiment.py"), "w") as f:
        f.write("")
    python = os.path.join(folder, "bin", "python")
    os.symlink(os.path.realpath(sys.executable), python)
    return python


def _refused_python(project, target, why):
    """A python of the project that is a link to `target` is refused for `why`."""
    linked = os.path.join(project, "bin", f"python-{len(os.listdir(os.path.join(project, 'bin')))}")
    os.symlink(target, linked)
    assert _check(project, linked)[1].startswith(f"python {linked}: {why}")


def test_a_rows_workdir_and_python_must_be_no_one_elses_to_change():
    """A bare process runs the workdir's experiment.py with the row's python, and Python imports
    from the workdir first: a workdir or interpreter another user can write to, or owns, would
    run their code as this user, with the run secret in reach. The start refuses such a row
    before anything runs there, and says what and why in one line."""
    with tempfile.TemporaryDirectory() as scratch:
        project = os.path.join(scratch, "project")
        python = _project(project)
        assert _check(project, python) == (0, "")

        # The workdir open to all, even sticky as /tmp is: anyone could add a module there.
        os.chmod(project, 0o1777)
        assert _check(project, python) == (
            3,
            f"workdir {project}: {project} is writable by others (someone else could change "
            "the code this run executes)",
        )
        os.chmod(project, 0o755)

        # A folder above it others can write to and rename things in.
        os.chmod(scratch, 0o777)
        code, said = _check(project, python)
        assert code == 3 and said.startswith(
            f"workdir {project}: {scratch} is writable by others and not sticky"
        )
        os.chmod(scratch, 0o1777)  # sticky, as /tmp: others cannot rename what is ours
        assert _check(project, python) == (0, "")
        os.chmod(scratch, 0o700)

        # The project's experiment.py writable by others.
        script = os.path.join(project, "experiment.py")
        os.chmod(script, 0o666)
        assert _check(project, python)[1].startswith(
            f"workdir {script}: {script} is writable by others"
        )
        os.chmod(script, 0o644)

        # An interpreter that is a link into a folder anyone can write to: its real path counts.
        open_bin = os.path.join(scratch, "open")
        os.mkdir(open_bin)
        os.chmod(open_bin, 0o777)
        planted = os.path.join(open_bin, "python3")
        os.symlink(os.path.realpath(sys.executable), planted)
        _refused_python(project, planted, f"{open_bin} is writable by others and not sticky")

        # An interpreter one folder below a sticky folder open to all: Python reads a pyvenv.cfg
        # in the folder above its own, which anyone could plant there.
        sticky = os.path.join(scratch, "sticky")
        os.makedirs(os.path.join(sticky, "x"))
        os.chmod(sticky, 0o1777)
        below = os.path.join(sticky, "x", "python")
        os.symlink(os.path.realpath(sys.executable), below)
        assert _check(project, below)[1].startswith(
            f"python {below}: {sticky} is writable by others (someone else"
        )

        # The real interpreter in a sticky folder open to all, reached through a link of ours:
        # Python reads a `<executable>._pth` beside the real file, which anyone could plant.
        real_python = os.path.join(sticky, "python3")
        shutil.copy(os.path.realpath(sys.executable), real_python)
        _refused_python(project, real_python, f"{sticky} is writable by others (someone else")

        # The project's experiment.py a link into a sticky folder: Python imports from the
        # script's real folder first.
        os.rename(script, os.path.join(sticky, "experiment.py"))
        os.symlink(os.path.join(sticky, "experiment.py"), script)
        assert _check(project, python)[1].startswith(
            f"workdir {script}: {sticky} is writable by others (someone else"
        )
        os.remove(script)
        with open(script, "w") as f:
            f.write("")

        if os.getuid() == 0:  # only root can give a path to another user
            # A link of ours whose target ends in a line break, which $(readlink) would drop:
            # the kernel opens "<sticky>/real\n", theirs, not "<sticky>/real", ours.
            for name, owner in (("real", 0), ("real\n", 65534)):
                _project(os.path.join(sticky, name))
                os.chown(os.path.join(sticky, name), owner, owner)
            newline = os.path.join(scratch, "newline")
            os.symlink(os.path.join(sticky, "real\n"), newline)
            code, said = _check(newline, python)
            assert code == 3 and said.startswith(f"workdir {newline}: {sticky}/real\n is another")

            # A link of theirs met on the way, in a folder above the interpreter: a link of
            # this user's leads to it, and it to this user's real environment. They could
            # point it elsewhere at any time.
            real_env = os.path.join(scratch, "real_env")
            _project(real_env)
            theirs_folder = os.path.join(scratch, "theirs_folder")
            os.mkdir(theirs_folder)
            hop = os.path.join(theirs_folder, "env")
            os.symlink(real_env, hop)
            os.lchown(hop, 65534, 65534)
            env_link = os.path.join(project, "env")
            os.symlink(hop, env_link)
            through = os.path.join(env_link, "bin", "python")
            assert _check(project, through)[1].startswith(
                f"python {through}: {hop} is another user's"
            )
            os.chown(script, 65534, 65534)
            assert _check(project, python)[1].startswith(
                f"workdir {script}: {script} is another user's"
            )
            os.chown(script, 0, 0)
            theirs = os.path.join(project, "bin", "theirs")
            os.symlink(os.path.realpath(sys.executable), theirs)
            os.lchown(theirs, 65534, 65534)  # a link they could point elsewhere
            assert _check(project, theirs)[1].startswith(f"python {theirs}: {theirs} is another")
