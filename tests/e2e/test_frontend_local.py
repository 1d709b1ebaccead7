"""The CSV frontend on this machine only: local tmux through libtmux, no SSH."""

import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import uuid

import pytest

from impala.launch.ports import free_ports
from tests import hostile_csv
from tests.helpers import (
    ROOT,
    SMALL_RUN_FLAGS,
    pids_with,
    processes_with,
    read_text,
    run_frontend,
    wait_until,
)

# The example from the original project's README, unchanged but for the CSV path.
ORIGINAL_EXAMPLE = [
    "--workers_csv_path=sandbox/local_workers_example.csv",
    "--level_name=BreakoutNoFrameskip-v4",
    "--agent_name=SimpleConvNetAgent",
    "--num_action_repeats=1",
    "--batch_size=32",
    "--unroll_length=20",
    "--entropy_cost=0.01",
    "--learning_rate=0.0006",
    "--total_environment_frames=200000000",
    "--reward_clipping=abs_one",
    "--gradients_clipping=40.0",
]


def test_original_readme_example_plans_the_local_run():
    secret = f"{ROOT}/runs/local_workers_example/secret"
    secret_existed = os.path.exists(secret)
    result = run_frontend(*ORIGINAL_EXAMPLE, "--dry_run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        lines[0] == "# localhost (local tmux), tmux session impala_local_workers_example_localhost"
    )
    windows = [line.split(":")[0] for line in lines if line.startswith("window ")]
    assert windows == ["window learners", "window actor_0", "window actor_1"]
    for flag in ORIGINAL_EXAMPLE[1:]:
        assert result.stdout.count(flag) == 3, flag  # given to the learner and both actors
    # Where the run secret goes is shown, the secret never; a dry run makes none.
    assert [line for line in lines if line.startswith("write ")] == [
        f"write {secret}: the run secret (owner-only; not shown)"
    ]
    assert os.path.exists(secret) == secret_existed


def test_bad_csv_is_one_line_naming_file_line_and_field(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices\n"
        "learner,localhost,99999,22,,,\nactor,localhost,,22,,,\n"
    )
    result = run_frontend(f"--workers_csv_path={path}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"run_experiment_mm_raw.py: error: {path}:2: tf_port='99999': must be a port number "
        "in 1-65535"
    )


@pytest.mark.slow
def test_local_start_status_stop_of_two_policies(run_name, tmp_path):
    """The sandbox example with a second learner row, as a run of two policies: each policy's
    learner and actor in windows of their own, logging in the policy's folder, one run secret;
    an actor killed outright comes back; status shows every window; stop saves each policy."""
    with open(os.path.join(ROOT, "sandbox", "local_workers_example.csv")) as f:
        example = f.read()
    assert ",8001," in example
    first, second = free_ports(2)
    learner_row = next(line for line in example.splitlines() if line.startswith("learner,"))
    rows = [learner_row.replace(",8001,", f",{port},") for port in (first, second)]
    example = example.replace(learner_row, "\n".join(rows))
    workers_csv = tmp_path / "local_workers.csv"
    workers_csv.write_text(example)
    flags = [
        f"--workers_csv_path={workers_csv}",
        f"--run_name={run_name}",
        *SMALL_RUN_FLAGS,
        "--num_policies=2",
        "--with_pbt",  # the learners get each other's address (no look within this run)
    ]
    started = run_frontend(*flags)
    assert started.returncode == 0, started.stdout + started.stderr
    run_dir = os.path.join(ROOT, "runs", run_name)
    logs = [os.path.join(run_dir, f"policy_{k}", "learners.log") for k in (0, 1)]
    for log in logs:
        wait_until(
            lambda log=log: read_text(log).count("  step ") >= 2,
            120,
            lambda log=log: f"no progress; learners' log:\n{read_text(log)}",
        )

    # The learners serve and the actors act with the one run secret the frontend made.
    secret = os.path.join(run_dir, "secret")
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert f"run secret created in {secret}" in started.stdout
    for log in logs:
        assert f"run secret read from runs/{run_name}/secret" in read_text(log)
    assert not os.path.exists(os.path.join(run_dir, "policy_0", "secret"))

    # Policy 1's actor (the CSV's second), killed outright, is started again in its window.
    actor_log = os.path.join(run_dir, "policy_1", "actor_0.log")
    wait_until(lambda: "acting for learner" in read_text(actor_log), 120, lambda: "no actor")
    (actor,) = [  # the actor's python, not the window's shell that restarts it
        pid
        for pid in pids_with(
            "--job_name=actor", "--task=0", "--policy=1", f"--experiment={run_name}"
        )
        if not read_text(f"/proc/{pid}/cmdline").startswith("bash")
    ]
    os.kill(actor, signal.SIGKILL)
    wait_until(
        lambda: read_text(actor_log).count("acting for learner") >= 2,
        120,
        lambda: f"policy 1's actor did not come back:\n{read_text(actor_log)[-2000:]}",
    )
    assert "[frontend] policy_1_actor_0 exited with code 137; restarting it in 1 s" in (
        read_text(actor_log)
    )

    status = run_frontend(*flags, "--action=status")
    states = {line.split()[1]: line.split()[2] for line in status.stdout.splitlines()[1:]}
    assert states == {
        "policy_0_learners": "alive",
        "policy_0_actor_0": "alive",
        "policy_1_learners": "alive",
        "policy_1_actor_0": "alive",
    }

    again = run_frontend(*flags)
    assert again.returncode == 1
    assert "exists already: a run of this name is running" in again.stderr

    # A run whose name gives the same tmux session name ('.' for '_') is another run: its
    # start, status and stop leave this one alone, and say whose the session is.
    twin_name = run_name.replace("_", ".")
    twin = [f if f != f"--run_name={run_name}" else f"--run_name={twin_name}" for f in flags]
    try:
        session = f"impala_{run_name}_localhost"
        whose = f"tmux session {session} is run '{run_name}' (on localhost)'s"
        refused = run_frontend(*twin)
        assert refused.returncode == 1 and f"localhost: {whose}, whose name" in refused.stderr
        status = run_frontend(*twin, "--action=status")
        assert status.returncode == 0 and status.stdout.count(f"another run's  {whose}") == 4
        refused = run_frontend(*twin, "--action=stop")
        assert refused.returncode == 1
        assert f"not stopping tmux session {session}: it is run '{run_name}'" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    finally:
        shutil.rmtree(os.path.join(ROOT, "runs", twin_name), ignore_errors=True)
    status = run_frontend(*flags, "--action=status")
    assert status.stdout.count(" alive ") == 4, status.stdout

    stopped = run_frontend(*flags, "--action=stop")
    assert stopped.returncode == 0, stopped.stderr
    assert processes_with(f"--experiment={run_name}") == []
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout
    # Each policy's learner (alone, without mpirun) got SIGUSR1: it saved and said so.
    for k in (0, 1):
        summary = json.loads(read_text(os.path.join(run_dir, f"policy_{k}", "learner_0.json")))
        assert summary["stopped_early"] and summary["steps"] > 0, summary
        assert os.path.exists(os.path.join(run_dir, f"policy_{k}", "checkpoints", "checkpoint"))


# ---- A workers CSV from an attacker ------------------------------------------------------------


def _marker(tmp_path):
    return tmp_path / f"PWNED_{uuid.uuid4().hex[:8]}"


def _one_line_error(result):
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip()


@pytest.mark.parametrize(
    "field,name",
    [
        *((field, name) for field in ("host", "ssh_user") for name in hostile_csv.INJECTIONS),
        *((field, name) for field in ("workdir", "python") for name in ("newline", "option")),
    ],
)
def test_an_injection_in_the_csv_is_a_one_line_error_and_runs_nothing(
    tmp_path, run_name, field, name
):
    marker = _marker(tmp_path)
    value = hostile_csv.injection(name, marker)
    if field in ("workdir", "python") and name == "newline":
        value = f"/{value}"  # absolute: refused for its line break alone
    # Learners on two hosts (mpirun's ssh config lists both), SSH to a port nothing listens on:
    # a value that got through would fail later, after it had run.
    closed = str(free_ports(1)[0])
    rows = [
        {"job": "learner", "host": "127.0.0.2", "tf_port": "8001", "ssh_port": closed},
        {"job": "learner", "host": "127.0.0.3", "tf_port": "8001", "ssh_port": closed},
        {"job": "actor", "host": "127.0.0.2", "ssh_port": closed},
    ]
    rows[0][field] = value
    path = hostile_csv.write_csv(tmp_path / "hostile.csv", rows)
    for dry_run in ([], ["--dry_run"]):
        result = run_frontend(f"--workers_csv_path={path}", f"--run_name={run_name}", *dry_run)
        assert result.returncode == 2, result.stdout + result.stderr
        assert _one_line_error(result).startswith(
            f"run_experiment_mm_raw.py: error: {path}:2: {field}={value!r}: "
        )
        assert not marker.exists()


def test_a_csv_named_with_a_line_break_is_a_one_line_error(tmp_path):
    # The run is named after the CSV's file, which may come from someone else too.
    with open(os.path.join(ROOT, "sandbox", "local_workers_example.csv")) as f:
        example = f.read()
    path = tmp_path / "cluster\nProxyCommand x.csv"
    path.write_text(example)
    result = run_frontend(f"--workers_csv_path={path}", "--dry_run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert _one_line_error(result) == (
        "run_experiment_mm_raw.py: error: run name 'cluster\\nProxyCommand x' (--run_name, "
        "--experiment or the CSV's file name): has a control or other non-printable character"
    )


@pytest.mark.parametrize("field", ["workdir", "python"])
@pytest.mark.parametrize("name", hostile_csv.PATH_NAMES)
def test_a_path_with_shell_characters_is_passed_intact_and_runs_nothing(
    tmp_path, run_name, field, name
):
    marker = _marker(tmp_path)
    value = hostile_csv.hostile_path(tmp_path, name, marker)
    row = {"host": "localhost", "workdir": str(tmp_path), field: value}
    path = hostile_csv.write_csv(
        tmp_path / "paths.csv",
        [{**row, "job": "learner", "tf_port": str(free_ports(1)[0])}, {**row, "job": "actor"}],
    )
    flags = [f"--workers_csv_path={path}", f"--run_name={run_name}"]

    planned = run_frontend(*flags, "--dry_run")
    assert planned.returncode == 0, planned.stderr
    windows = [line for line in planned.stdout.splitlines() if line.startswith("window ")]
    assert len(windows) == 2
    for line in windows:
        bash = shlex.split(line.split(": ", 1)[1])
        assert bash[:4] == ["bash", "-o", "pipefail", "-c"]
        words = shlex.split(bash[4])
        # Past the owner-only umask every window starts with ("umask 077; cd WORKDIR && ...").
        workdir = words[words.index("cd") + 1]
        assert (workdir if field == "workdir" else words[words.index("-u") - 1]) == value

    # The start checks every row on its host first: here, through bash on this machine.
    started = run_frontend(*flags)
    assert started.returncode == 1, started.stdout + started.stderr
    what = "does not exist" if field == "workdir" else "is not an executable (run make setup there)"
    assert _one_line_error(started) == (
        "run_experiment_mm_raw.py: error: localhost (learner_0, CSV line 2): "
        f"{field} {value} {what}"
    )
    assert not marker.exists()
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout


def test_a_workdir_others_can_write_to_runs_nothing_of_theirs(tmp_path, run_name):
    # Whoever wrote the CSV names a workdir where another user of the host has planted code: a
    # folder open to all (sticky, as /tmp) holding their experiment.py and a module Python
    # would import first. The start refuses the row in one line before anything runs there.
    marker = _marker(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = f"open({str(marker)!r}, 'w').write('ran')\n"
    (shared / "experiment.py").write_text(planted)
    (shared / "socket.py").write_text(planted)  # the learner's port probe imports socket
    python = os.path.realpath(sys.executable)
    row = {"host": "localhost", "workdir": str(shared), "python": python}
    path = hostile_csv.write_csv(
        tmp_path / "shared.csv",
        [{**row, "job": "learner", "tf_port": str(free_ports(1)[0])}, {**row, "job": "actor"}],
    )
    started = run_frontend(f"--workers_csv_path={path}", f"--run_name={run_name}")
    assert started.returncode == 1, started.stdout + started.stderr
    assert _one_line_error(started) == (
        "run_experiment_mm_raw.py: error: localhost (learner_0, CSV line 2): "
        f"workdir {shared}: {shared} is writable by others (someone else could change the "
        "code this run executes)"
    )
    assert not marker.exists()
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout


def test_a_run_folder_others_can_write_to_gets_no_secret(tmp_path, run_name):
    # --logdir under a folder another user can write to (777, not sticky): they could swap the
    # secret for theirs or link the logs to a file of yours. Refused before anything is made.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    csv_path = os.path.join(ROOT, "sandbox", "local_workers_example.csv")
    args = [f"--workers_csv_path={csv_path}", f"--run_name={run_name}", f"--logdir={shared}"]
    started = run_frontend(*args)
    assert started.returncode == 1, started.stdout + started.stderr
    assert _one_line_error(started) == (
        f"run_experiment_mm_raw.py: error: run folder {shared / run_name}: {shared} is writable "
        "by others and not sticky; another user could change what the run reads and writes "
        "there (give --logdir a folder of yours)"
    )
    assert os.listdir(shared) == []
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout


@pytest.mark.slow
def test_a_run_starts_and_stops_in_a_workdir_and_python_with_shell_characters(tmp_path, run_name):
    marker = _marker(tmp_path)
    workdir = str(tmp_path / f"it's $(touch {marker}) `touch {marker}`; x")
    python = str(tmp_path / f"py '; touch {marker}; '" / "python")
    hostile_csv.recording_project(workdir, python)
    row = {"host": "localhost", "workdir": workdir, "python": python}
    path = hostile_csv.write_csv(
        tmp_path / "paths.csv",
        [
            {**row, "job": "learner", "tf_port": str(free_ports(1)[0])},
            {**row, "job": "actor"},
            {**row, "job": "actor"},
        ],
    )
    flags = [f"--workers_csv_path={path}", f"--run_name={run_name}"]
    started = run_frontend(*flags)
    assert started.returncode == 0, started.stdout + started.stderr

    # Every process ran its workdir's experiment.py there, with that python, its output in the
    # run folder under that workdir.
    logs = {
        name: os.path.join(workdir, "runs", run_name, f"{name}.log")
        for name in ("learners", "actor_0", "actor_1")
    }
    wait_until(
        lambda: all("RAN " in read_text(log) for log in logs.values()),
        60,
        lambda: f"not every process ran: {[read_text(log) for log in logs.values()]}",
    )
    for name, log in logs.items():
        (ran,) = hostile_csv.records(read_text(log))
        assert ran["cwd"] == workdir, name
    stopped = run_frontend(*flags, "--action=stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not marker.exists()
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    "runtime, error",
    [
        ("/nonexistent/docker", "localhost: /nonexistent/docker not found (--container_runtime)"),
        # A runtime without the image: `false image inspect ...` fails as a runtime's would,
        # whatever runtime this machine has.
        ("false", "localhost: false has no image impala-absent:0 (or cannot reach its engine)"),
    ],
)
def test_a_run_in_containers_checks_the_runtime_and_image_first_and_starts_nothing(
    run_name, runtime, error
):
    started = run_frontend(
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--run_name={run_name}",
        "--docker_image=impala-absent:0",
        f"--container_runtime={runtime}",
    )
    assert started.returncode == 1, started.stdout + started.stderr
    assert _one_line_error(started).startswith(f"run_experiment_mm_raw.py: error: {error}")
    sessions = subprocess.run(["tmux", "ls", "-F", "#S"], capture_output=True, text=True).stdout
    assert run_name not in sessions
