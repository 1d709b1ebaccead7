"""The CSV frontend on this machine only: local tmux through libtmux, no SSH."""

import os
import subprocess

import pytest

from impala.launch.single_host import free_ports
from tests.helpers import (
    ROOT,
    SMALL_RUN_FLAGS,
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
def test_local_start_status_stop(run_name, tmp_path):
    # The sandbox example, with a port free on this machine instead of its fixed 8001.
    with open(os.path.join(ROOT, "sandbox", "local_workers_example.csv")) as f:
        example = f.read()
    assert ",8001," in example
    workers_csv = tmp_path / "local_workers.csv"
    workers_csv.write_text(example.replace(",8001,", f",{free_ports(1)[0]},"))
    flags = [
        f"--workers_csv_path={workers_csv}",
        f"--run_name={run_name}",
        *SMALL_RUN_FLAGS,
    ]
    started = run_frontend(*flags)
    assert started.returncode == 0, started.stdout + started.stderr
    log = os.path.join(ROOT, "runs", run_name, "learners.log")
    wait_until(
        lambda: read_text(log).count("  step ") >= 2,
        120,
        lambda: f"no progress; learners' log:\n{read_text(log)}",
    )

    status = run_frontend(*flags, "--action=status")
    states = {line.split()[1]: line.split()[2] for line in status.stdout.splitlines()[1:]}
    assert states == {"learners": "alive", "actor_0": "alive", "actor_1": "alive"}

    again = run_frontend(*flags)
    assert again.returncode == 1
    assert "exists already: a run of this name is running" in again.stderr

    stopped = run_frontend(*flags, "--action=stop")
    assert stopped.returncode == 0, stopped.stderr
    assert processes_with(f"--experiment={run_name}") == []
    assert run_name not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout
