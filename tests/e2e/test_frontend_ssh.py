"""The CSV frontend over real SSH: an sshd of the test's own on 127.0.0.2 and 127.0.0.3, two
"hosts" each with a learner and an actor, Horovod across them, then status and stop."""

import getpass
import json
import os
import shutil
import socket
import subprocess
import time
import uuid

import pytest

from impala.launch import hosts, workers_csv
from tests import hostile_csv
from tests.helpers import (
    ROOT,
    SMALL_RUN_FLAGS,
    processes_with,
    read_text,
    run_frontend,
    wait_until,
)

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.2", "127.0.0.3")
SSHD = "/usr/sbin/sshd"


def _free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """sshd on both addresses, a client key it accepts, and a known_hosts file for it."""
    if not os.path.exists(SSHD):
        pytest.fail(f"{SSHD} missing: the set-up installs openssh-server (make setup)")
    directory = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "client_key", "stranger_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / name)], check=True
        )
    shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
    port = _free_port(HOSTS[0])
    (directory / "sshd_config").write_text(
        f"Port {port}\n"
        + "".join(f"ListenAddress {host}\n" for host in HOSTS)
        + f"HostKey {directory}/host_key\nAuthorizedKeysFile {directory}/authorized_keys\n"
        f"PidFile {directory}/sshd.pid\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    process = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(directory / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=open(directory / "sshd.log", "w"),  # noqa: SIM115
    )
    host_key = (directory / "host_key.pub").read_text().split()[:2]
    (directory / "known_hosts").write_text(
        "".join(f"[{host}]:{port} {' '.join(host_key)}\n" for host in HOSTS)
    )
    wait_until(lambda: _listening(HOSTS[1], port), 10, "sshd did not start")
    yield directory, port
    process.terminate()
    process.wait()


def _listening(host, port):
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _csv(tmp_path, port, key, learner_port=None, hosts=HOSTS, ssh_port=None):
    rows = ["job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices"]
    user = getpass.getuser()
    learner_port = learner_port or _free_port(HOSTS[0])
    for host in hosts:
        rows.append(f"learner,{host},{learner_port},{ssh_port or port},{user},{key},")
    for host in hosts:
        rows.append(f"actor,{host},,{ssh_port or port},{user},{key},")
    path = tmp_path / "two_hosts.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _frontend(csv_path, known_hosts, run_name, *flags, timeout=180):
    return run_frontend(
        f"--workers_csv_path={csv_path}",
        f"--known_hosts={known_hosts}",
        f"--run_name={run_name}",
        *SMALL_RUN_FLAGS,
        *flags,
        timeout=timeout,
    )


def _run_processes(run_name):
    return processes_with(f"--experiment={run_name}")


def test_start_status_progress_and_stop_across_two_hosts(sshd, tmp_path, run_name):
    directory, port = sshd
    csv_path = _csv(tmp_path, port, directory / "client_key")
    known_hosts = directory / "known_hosts"

    started = _frontend(csv_path, known_hosts, run_name)
    assert started.returncode == 0, started.stdout + started.stderr
    for host in HOSTS:
        assert f"{host}: started" in started.stdout

    log = os.path.join(ROOT, "runs", run_name, "learners.log")
    # Rank 0 only steps when rank 1 (on the other host) joins each all-reduce.
    wait_until(
        lambda: read_text(log).count("  step ") >= 3,
        180,
        lambda: f"no training progress; learners' log:\n{read_text(log)}",
    )
    assert "learner 0/2 serving" in read_text(log)

    status = _frontend(csv_path, known_hosts, run_name, "--action=status")
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[1:]]
    assert sorted((row[0], row[1], row[2]) for row in rows) == [
        ("127.0.0.2", "actor_0", "alive"),
        ("127.0.0.2", "learners", "alive"),
        ("127.0.0.3", "actor_1", "alive"),
    ]
    assert any("frames" in line for line in status.stdout.splitlines())
    assert len(_run_processes(run_name)) >= 4  # two learners, two actors (and mpirun)

    stopped = _frontend(csv_path, known_hosts, run_name, "--action=stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_until(
        lambda: not _run_processes(run_name),
        30,
        lambda: f"left running: {_run_processes(run_name)}",
    )
    sessions = subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout
    assert run_name not in sessions
    # The learners, one on each host, stopped after the same step and rank 0 saved it.
    run_dir = os.path.join(ROOT, "runs", run_name)
    first, second = (
        json.loads(read_text(os.path.join(run_dir, f"learner_{rank}.json"))) for rank in (0, 1)
    )
    assert first["stopped_early"] and second["stopped_early"]
    assert first["steps"] == second["steps"] > 0
    assert first["weights_sha256"] == second["weights_sha256"]
    assert f"at {first['frames']} frames" in read_text(log)
    assert os.path.exists(os.path.join(run_dir, "checkpoints", "checkpoint"))


@pytest.mark.parametrize("problem", ["unreachable", "refused_key", "unknown_host_key", "busy_port"])
def test_a_bad_host_stops_the_start_before_anything_runs(sshd, tmp_path, run_name, problem):
    directory, port = sshd
    known_hosts = directory / "known_hosts"
    key = directory / "client_key"
    busy = None
    if problem == "unreachable":
        csv_path = _csv(tmp_path, port, key, ssh_port=_free_port(HOSTS[0]))
        expected = f"{HOSTS[0]}:"
    elif problem == "refused_key":
        csv_path = _csv(tmp_path, port, directory / "stranger_key")
        expected = f"{HOSTS[0]}:{port}: SSH as {getpass.getuser()} failed"
    elif problem == "unknown_host_key":
        csv_path = _csv(tmp_path, port, key)
        known_hosts = tmp_path / "empty_known_hosts"
        known_hosts.write_text("")
        expected = f"{HOSTS[0]}:{port}: SSH as {getpass.getuser()} failed"
    else:
        busy = socket.socket()
        busy.bind((HOSTS[1], 0))
        busy.listen()
        busy_port = busy.getsockname()[1]
        csv_path = _csv(tmp_path, port, key, learner_port=busy_port)
        expected = f"{HOSTS[1]} (learner_1, CSV line 3): tf_port {busy_port} on {HOSTS[1]}"
    try:
        result = _frontend(csv_path, known_hosts, run_name, timeout=120)
    finally:
        if busy:
            busy.close()
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    time.sleep(1)
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout
    assert _run_processes(run_name) == []


# ---- A workers CSV from an attacker, over SSH -------------------------------------------------


def _hostile_rows(sshd, host=HOSTS[0], **values):
    directory, port = sshd
    row = {
        "host": host,
        "ssh_port": str(port),
        "ssh_user": getpass.getuser(),
        "ssh_key": str(directory / "client_key"),
        **values,
    }
    return [{**row, "job": "learner", "tf_port": str(_free_port(host))}, {**row, "job": "actor"}]


@pytest.mark.parametrize("field", ["workdir", "python"])
@pytest.mark.parametrize("name", hostile_csv.PATH_NAMES)
def test_the_checks_over_ssh_get_paths_with_shell_characters_intact_and_run_nothing(
    sshd, tmp_path, run_name, field, name
):
    directory, _ = sshd
    marker = tmp_path / f"PWNED_{uuid.uuid4().hex[:8]}"
    value = hostile_csv.hostile_path(tmp_path, name, marker)
    rows = _hostile_rows(sshd, **{"workdir": str(tmp_path), field: value})
    csv_path = hostile_csv.write_csv(tmp_path / "paths.csv", rows)
    result = _frontend(csv_path, directory / "known_hosts", run_name, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    what = "does not exist" if field == "workdir" else "is not an executable (run make setup there)"
    assert result.stderr.strip() == (
        f"run_experiment_mm_raw.py: error: {HOSTS[0]} (learner_0, CSV line 2): "
        f"{field} {value} {what}"
    )
    assert not marker.exists()
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout


def test_learners_on_two_hosts_run_in_a_workdir_and_python_with_shell_characters(
    sshd, tmp_path, run_name
):
    # mpirun reaches the second host with the ssh config in the first one's workdir, and starts
    # each rank in its workdir there.
    directory, _ = sshd
    marker = tmp_path / f"PWNED_{uuid.uuid4().hex[:8]}"
    workdir = str(tmp_path / f"it's $(touch {marker}) `touch {marker}`; x")
    python = str(tmp_path / f"py '; touch {marker}; '" / "python")
    hostile_csv.recording_project(workdir, python)
    rows = [
        row for host in HOSTS for row in _hostile_rows(sshd, host, workdir=workdir, python=python)
    ]
    csv_path = hostile_csv.write_csv(tmp_path / "paths.csv", rows)
    known_hosts = directory / "known_hosts"
    started = _frontend(csv_path, known_hosts, run_name)
    assert started.returncode == 0, started.stdout + started.stderr

    run_dir = os.path.join(workdir, "runs", run_name)
    logs = [os.path.join(run_dir, f"{name}.log") for name in ("learners", "actor_0", "actor_1")]

    def ran(log):
        return hostile_csv.records(read_text(log))

    wait_until(
        lambda: len(ran(logs[0])) == 2 and all(ran(log) for log in logs[1:]),
        120,
        lambda: f"not every process ran: {[read_text(log) for log in logs]}",
    )
    assert sorted(record["rank"] for record in ran(logs[0])) == ["0", "1"]
    assert {record["cwd"] for log in logs for record in ran(log)} == {workdir}
    stopped = _frontend(csv_path, known_hosts, run_name, "--action=stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not marker.exists()
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(("name", "owner_only"), [("secret", True), ("ssh_config", False)])
def test_a_file_written_over_ssh_never_lands_where_others_could_reach_it(
    sshd, tmp_path, name, owner_only
):
    # Another user who could write to the run folder would plant a symlink to a file of theirs
    # at the file's name, or rename the writer's private folder away and put theirs in its
    # place: a symlink is replaced, never followed, and a folder others can write to (unless
    # sticky, as /tmp) is refused before anything is written. (The test runs as one user: the
    # refusal, not the race, is what it can show.)
    directory, port = sshd
    worker = workers_csv.Worker(
        job="actor",
        task=0,
        host=HOSTS[0],
        tf_port=None,
        ssh_port=port,
        ssh_user=getpass.getuser(),
        ssh_key=str(directory / "client_key"),
        cuda_visible_devices="",
        workdir=str(tmp_path),
        python="python3",
        line=2,
    )
    host = hosts.SshHost(worker, False, str(directory / "known_hosts"))
    folder, victim = tmp_path / "run", tmp_path / "theirs"
    folder.mkdir()
    victim.write_text("")
    target = folder / name
    target.symlink_to(victim)
    try:
        host.write_file(str(target), f"{name} 1\n", owner_only=owner_only)
        assert victim.read_text() == ""
        assert not target.is_symlink() and target.read_text() == f"{name} 1\n"
        if owner_only:
            assert target.stat().st_mode & 0o777 == 0o600
        assert sorted(p.name for p in folder.iterdir()) == [name]

        folder.chmod(0o777)
        with pytest.raises(hosts.HostError, match="writable by others and not sticky"):
            host.write_file(str(target), f"{name} 2\n", owner_only=owner_only)
        assert target.read_text() == f"{name} 1\n"
        folder.chmod(0o1777)
        host.write_file(str(target), f"{name} 3\n", owner_only=owner_only)
        assert target.read_text() == f"{name} 3\n"
        assert sorted(p.name for p in folder.iterdir()) == [name]

        (folder / "planted").mkdir()
        with pytest.raises(hosts.HostError, match="cannot overwrite directory"):
            host.write_file(str(folder / "planted"), "x", owner_only=owner_only)
        assert list((folder / "planted").iterdir()) == []

        # A symlink on the path as given, in a folder others can write to: they could point it
        # at a folder of this user's (~/.ssh) whose real path passes.
        mine, shared = tmp_path / "mine", tmp_path / "shared"
        mine.mkdir()
        shared.mkdir()
        shared.chmod(0o777)
        (shared / "run").symlink_to(mine)
        with pytest.raises(hosts.HostError, match="shared is writable by others and not sticky"):
            host.write_file(str(shared / "run" / name), "x", owner_only=owner_only)
        assert list(mine.iterdir()) == []
        # Nor is a folder made there first: the refusal comes before any mkdir.
        with pytest.raises(hosts.HostError, match="shared is writable by others and not sticky"):
            host.write_file(str(shared / "new" / "deeper" / name), "x", owner_only=owner_only)
        assert sorted(p.name for p in shared.iterdir()) == ["run"]

        if os.getuid() == 0:  # only root can give a path to another user
            # A link of another user's met on the way, reached through a link of ours: the path
            # as given and its real path are all ours, but they could point their link
            # elsewhere. Refused, before and after any folder would be made.
            via = tmp_path / "via"
            via.mkdir()
            (via / "theirs").symlink_to(mine)
            os.lchown(via / "theirs", 65534, 65534)
            (tmp_path / "ours").symlink_to(via / "theirs")
            for where in ("", "new"):
                with pytest.raises(hosts.HostError, match=f"{via}/theirs is another user's"):
                    host.write_file(
                        os.path.join(tmp_path, "ours", where, name), "x", owner_only=owner_only
                    )
            assert list(mine.iterdir()) == []
    finally:
        host.close()
