"""Each role imports only its own stack: the launchers run without TensorFlow and the rest of the
ML stack, actors, --mode=test and a learner alone without Horovod.

Each command runs through `tests.without_ml_stack`, which makes the refused modules unimportable
in that process. run_local.py's whole run goes that way in `test_distributed.py` too, and
--mode=test's games without Horovod in `test_mode_test.py`.
"""

import os
import signal
import subprocess
import sys

import pytest

from impala import run_secret
from impala.launch.ports import free_ports
from tests.helpers import ROOT, wait_until

EXAMPLE_CSV = "--workers_csv_path=sandbox/local_workers_example.csv"


def _run(*argv, refuse=None):
    prefix = [sys.executable, "-m", "tests.without_ml_stack"]
    if refuse:
        prefix.append(f"--refuse={refuse}")
    return subprocess.run([*prefix, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_frontend_plans_and_reports_status_without_the_ml_stack():
    dry_run = _run("run_experiment_mm_raw.py", EXAMPLE_CSV, "--batch_size=16", "--dry_run")
    assert dry_run.returncode == 0, dry_run.stderr
    assert dry_run.stdout.count("--batch_size=16") == 3  # the learner and both actors
    status = _run(
        "run_experiment_mm_raw.py", EXAMPLE_CSV, "--experiment=no-such-run", "--action=status"
    )
    assert status.returncode == 0, status.stderr
    assert [line.split()[:2] for line in status.stdout.splitlines()[1:]] == [
        ["localhost", "learners"],
        ["localhost", "actor_0"],
        ["localhost", "actor_1"],
    ]


def test_run_local_checks_its_flags_without_the_ml_stack():
    completed = _run("run_local.py", "--num_actors=0")
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines()[-1] == (
        "run_local.py: error: --num_actors=0: must be at least 1"
    )


@pytest.mark.parametrize("launcher", ["run_local.py", "run_experiment_mm_raw.py"])
def test_launchers_refuse_the_hyperparameters_the_learners_would_refuse(launcher):
    extra = [EXAMPLE_CSV, "--dry_run"] if launcher == "run_experiment_mm_raw.py" else []
    for flag, message in [
        ("--entropy_cost=inf", "--entropy_cost=inf: must be a finite number >= 0"),
        ("--total_environment_frames=nan", "--total_environment_frames=nan: must be a finite"),
        ("--policy_clip=1.5", "--policy_clip=1.5: must be in [0, 1)"),
    ]:
        completed = _run(launcher, *extra, flag)
        assert completed.returncode == 2, completed.stdout
        assert completed.stderr.strip().splitlines() == [
            f"{launcher}: error: {completed.stderr.split('error: ', 1)[1].strip()}"
        ]
        assert message in completed.stderr and completed.stdout == ""


def test_an_actor_runs_without_horovod(tmp_path):
    (port,) = free_ports(1)  # nobody listens there: the actor gives up after its timeout
    secret_file = str(tmp_path / "secret")
    run_secret.create(secret_file)
    completed = _run(
        "experiment.py",
        "--job_name=actor",
        "--level_name=impala/Catch-v0",
        "--agent_name=MLPAgent",
        f"--learner_hosts=localhost:{port}",
        f"--secret_file={secret_file}",
        "--connect_timeout_secs=1",
        refuse="horovod",
    )
    assert completed.returncode == 1, completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("experiment.py: error: ") and f"localhost:{port}" in last
    assert "Traceback" not in completed.stderr


def test_a_learner_alone_serves_without_horovod(processes, tmp_path):
    # One of --learner_hosts and no mpirun: a world of one, which needs no Horovod (nor so the
    # Keras its module loads: tests/unit/test_experiment_flags.py).
    (port,) = free_ports(1)
    learner = processes.start(
        "learner",
        [
            sys.executable,
            "-m",
            "tests.without_ml_stack",
            "--refuse=horovod",
            "experiment.py",
            "--job_name=learner",
            f"--learner_hosts=localhost:{port}",
            "--level_name=impala/Catch-v0",
            "--agent_name=MLPAgent",
            f"--logdir={tmp_path}",
            "--experiment=alone",
        ],
    )
    wait_until(lambda: " serving " in processes.log(learner), 120, lambda: processes.log(learner))
    learner.send_signal(signal.SIGTERM)
    assert processes.wait(learner, 60) == 130, processes.log(learner)
    assert "Traceback" not in processes.log(learner)


def test_the_refusal_is_real():
    # A learner of two joins the other through Horovod.
    completed = _run(
        "experiment.py",
        "--job_name=learner",
        "--learner_hosts=localhost:1,localhost:2",
        refuse="horovod",
    )
    assert completed.returncode != 0
    assert "horovod is made unimportable by tests.without_ml_stack" in completed.stderr


def test_a_learner_of_several_without_keras_is_a_one_line_error():
    # TF_USE_LEGACY_KERAS=1 where tf_keras is not installed: TensorFlow skips Keras, which
    # Horovod's module needs.
    completed = subprocess.run(
        [sys.executable, "experiment.py", "--job_name=learner", "--learner_hosts=a:1,b:1"],
        cwd=ROOT,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    assert (
        completed.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "experiment.py: error: a learner of several needs Horovod, which failed to load: "
        )
    ), completed.stderr
    assert "Traceback" not in completed.stderr
