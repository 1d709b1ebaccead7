"""A run that survives its faults: run_local.py's actors are SIGKILLed again and again and one
of its two learners once; the run still reaches its budget with identical learners, losing at
most one save interval. Runs `benchmarks/faults.py`, which the README's reliability figures come
from."""

import json
import os
import signal
import subprocess
import sys

import pytest

from impala.launch.ports import free_ports
from tests.helpers import ROOT, SMALL_RUN_FLAGS, pids_with, processes_with, wait_until

pytestmark = pytest.mark.slow


def test_actor_kills_and_a_learner_kill_cost_at_most_one_save_interval(tmp_path):
    # 2 actor kills over 10k frames (each restart imports TensorFlow, the test's main CPU
    # cost; the growing delay between an actor's restarts is
    # tests/unit/launch/test_planning.py's); the learner kill, right after the progress line
    # that passes half the budget, leaves the restarted learners about 5k frames, and with a
    # progress line a second (5 s by default) they report long before the end (6k frames in all
    # with 5-s lines once left them none: no recovery figure). An actor started again after
    # the learners finished is stopped after 3 s, not run_local.py's 15.
    out = tmp_path / "faults.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.faults",
            "--num_actors=2",
            "--actor_kills=2",
            "--frames=10000",
            "--save_every_secs=7",
            "--extra=--log_every_secs=1",
            "--extra=--stop_timeout_secs=3",
            "--timeout_secs=540",  # then it stops the run and fails, before pytest's limit
            f"--logdir={tmp_path}",
            f"--out={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["actor_kills"] >= 2
    assert figures["actor_restarts"] >= 2 and figures["actors_given_up"] == 0
    assert (figures["learner_kills"], figures["learner_restarts"]) == (1, 1)
    assert figures["budget_reached"] and figures["frames"] == [figures["frames"][0]] * 2
    assert figures["learners_identical"]
    # Lost: what the learners had done since their last checkpoint (seconds are whole).
    assert 0 <= figures["training_secs_lost"] <= figures["save_every_secs"] + 1
    assert figures["frames_lost"] >= 0
    assert figures["learner_recovery_secs"] is not None
    # Every killed actor acted again, unless it was killed so near the end that the run finished
    # first: sooner than the slowest recovery seen (a restart imports TensorFlow and connects
    # again: up to 38 s in a CI run, 84 s beside a Pong run on 2 cores).
    recoveries, silent = figures["actor_recovery_secs"], figures["actor_silent_until_end_secs"]
    assert len(recoveries) + len(silent) == figures["actor_kills"]
    assert len(recoveries) >= figures["actor_kills"] // 2, (recoveries, silent)
    assert all(secs < max(recoveries) + 5 for secs in silent), (recoveries, silent)
    assert "[faults] actor kills survived: " in completed.stdout


def test_nothing_outlives_a_launcher_killed_outright(processes, tmp_path):
    # SIGKILL gives run_local.py no chance to stop its processes: each must end by itself (the
    # parent-death signal run_local.py sets in each child before it runs).
    runs = tmp_path / "runs"
    launcher = processes.start(
        "run_local",
        [
            sys.executable,
            "-m",
            "tests.without_ml_stack",
            "run_local.py",
            f"--logdir={runs}",
            "--experiment=orphans",
            *SMALL_RUN_FLAGS,
        ],
    )
    # Killed as soon as everything it starts is there: the learner and two actors.
    wait_until(
        lambda: len(pids_with(f"--logdir={runs}", "--job_name=")) == 3,
        60,
        lambda: processes.log(launcher) + "\n".join(processes_with(f"--logdir={runs}")),
    )
    launcher.kill()
    launcher.wait()
    try:
        wait_until(
            lambda: not processes_with(f"--logdir={runs}"),
            60,
            lambda: "left running:\n" + "\n".join(processes_with(f"--logdir={runs}")),
        )
    finally:  # each child has a session of its own, out of reach of the fixture's cleanup
        for pid in pids_with(f"--logdir={runs}"):
            os.kill(pid, signal.SIGKILL)


def test_a_learner_stopped_while_it_starts_ends_at_once_and_saves_nothing(processes, tmp_path):
    # SIGTERM while TensorFlow loads (a launcher killed outright, Ctrl-C at the start): nothing
    # has been trained, so the learner ends without finishing its start-up, which takes a
    # minute on a busy machine, and writes no checkpoint.
    (port,) = free_ports(1)
    learner = processes.experiment(
        "learner",
        "--job_name=learner",
        f"--learner_hosts=localhost:{port}",
        f"--logdir={tmp_path}",
        "--experiment=early",
    )

    def loading_tensorflow():
        with open(f"/proc/{learner.pid}/maps") as maps:
            return "tensorflow" in maps.read()

    wait_until(loading_tensorflow, 60, lambda: processes.log(learner))
    learner.send_signal(signal.SIGTERM)
    assert processes.wait(learner, 30) == 130, processes.log(learner)
    log = processes.log(learner)
    assert "learner stopped" in log and "Traceback" not in log, log
    assert " serving " not in log, log
    assert not (tmp_path / "early" / "checkpoints").exists()
