"""The distributed path end to end: real actor and learner processes over loopback gRPC.

The counter environment's observations encode each environment's step count, so the tests can
check exactly what the learners received.
"""

import collections
import json
import os
import pickle
import re
import signal
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest

import networks
from impala import envs
from impala.launch.ports import free_ports
from impala.progress import thread_core_waits
from tests.helpers import ROOT, Processes, pids_with, processes_with, run_local_argv, wait_until

pytestmark = pytest.mark.slow

COUNTER = envs.COUNTER_LEVEL
UNROLL_LENGTH = 5
NUM_ENVS = 3


def _counter(observation):
    return envs.decode_counter(observation, observation_rank=observation.ndim - 2)


def _actor_flags(port, task, *extra):
    return (
        "--job_name=actor",
        f"--task={task}",
        f"--learner_hosts=localhost:{port}",
        f"--level_name={COUNTER}",
        "--agent_name=MLPAgent",
        f"--unroll_length={UNROLL_LENGTH}",
        f"--num_envs_per_actor={NUM_ENVS}",
        *extra,
    )


@pytest.mark.parametrize("collection", ["asynchronous", "synchronous"])
def test_actors_stream_overlapping_unrolls_and_follow_the_learners_weights(
    processes, tmp_path, collection
):
    """The learner's own loop (experiment.py's learner role, recording what it dequeues and
    publishes) trains 40 steps on two actor processes' unrolls. In synchronous collection each
    batch is both actors' unrolls of one version, the learner's: policy lag 0, and pi / mu is 1
    at every step it trains on, the first of each unroll too (V-trace's ratios, before the
    batch's first step)."""
    (port,) = free_ports(1)
    batch_size, steps = 2 * NUM_ENVS, 40  # in synchronous collection, one version's unrolls
    mode = f"--col_workers_communication={collection}"
    record_path = str(tmp_path / "record.pkl")
    learner_process = processes.start(
        "learner",
        [
            sys.executable,
            "-u",
            "-m",
            "tests.recording_learner",
            record_path,
            "--job_name=learner",
            f"--learner_hosts=localhost:{port}",
            f"--level_name={COUNTER}",
            "--agent_name=MLPAgent",
            f"--unroll_length={UNROLL_LENGTH}",
            f"--batch_size={batch_size}",
            "--learning_rate=0.01",  # weights that differ clearly from one version to the next
            f"--total_environment_frames={steps * batch_size * UNROLL_LENGTH}",
            f"--logdir={tmp_path / 'runs'}",
            f"--secret_file={processes.secret_file}",
            mode,
            # Every trajectory fresh: each one in exactly one batch, as the checks below count.
            "--replay_parameters=",
        ],
    )
    actors = [
        processes.experiment(f"actor_{t}", *_actor_flags(port, t, f"--actor_threads={t + 1}", mode))
        for t in range(2)
    ]
    assert processes.wait(learner_process, 120) == 0, processes.log(learner_process)
    for task, actor in enumerate(actors):
        assert processes.wait(actor, 30) == 0, processes.log(actor)
        assert "learner finished" in processes.log(actor)
        threads = "1 TensorFlow thread per op" if task == 0 else "2 TensorFlow threads per op"
        assert f"({NUM_ENVS} environments, {threads})" in processes.log(actor)
    with open(record_path, "rb") as f:
        record = pickle.load(f)
    assert len(record["batches"]) == steps
    assert sorted(record["published"]) == list(range(steps + 1))

    with envs.make_environment(envs.EnvConfig(COUNTER, num_envs=1)) as env:
        agent = networks.make_agent("MLPAgent", env.num_actions)
        networks.build_variables(agent, env.observation_shape, env.observation_dtype)
    starts = collections.defaultdict(collections.Counter)
    ends = collections.defaultdict(collections.Counter)
    lags = []
    for learner_version, tasks, versions, batch_steps in record["batches"]:
        counters = _counter(batch_steps.observation)  # [T + 1, B]
        np.testing.assert_array_equal(np.diff(counters, axis=0), 1)
        for b, task in enumerate(tasks):
            starts[task][counters[0, b]] += 1
            ends[task][counters[-1, b]] += 1
        lags.extend(learner_version - versions)
        _check_behaviour_logits(agent, batch_steps, versions, record["published"])
        if collection == "synchronous":
            # Acted with the weights the learner holds: its policy is the behaviour policy, on
            # every step it trains on (0 to T - 1), the first too (decided again by the actor
            # once the weights came, not with the version before).
            _check_behaviour_logits(
                agent, batch_steps, [learner_version] * len(versions), record["published"], 0
            )

    assert set(starts) == {0, 1}, "both actors delivered"
    for task in starts:
        # Consecutive unrolls of an environment overlap by one step: each one starts where
        # an earlier one ended, and no environment delivers the same segment twice.
        for start, count in starts[task].items():
            assert count <= NUM_ENVS
            assert start == 0 or ends[task][start] >= count, (task, start)
    assert max(v for *_, versions, _ in record["batches"][-5:] for v in versions) > steps - 10
    if collection == "synchronous":
        assert set(lags) == {0}, f"policy lags {collections.Counter(lags)}"
        assert "waiting for the next weights" in processes.log(actors[0])
    else:
        assert np.mean(lags) < 5, f"policy lag {np.mean(lags)}"


def _check_behaviour_logits(agent, steps, versions, weights_by_version, first=1):
    """The logits that chose steps `first`..T are the network's under the version they are
    tagged with: the actor really acted with the learner's published weights. (In asynchronous
    collection step 0 was decided, as the unroll before's last step, with the version before.)"""
    for b, version in enumerate(versions):
        for variable, value in zip(agent.variables, weights_by_version[version], strict=True):
            variable.assign(value)
        outputs, _ = agent.unroll(
            networks.AgentInput(
                steps.prev_action[:, b : b + 1],
                steps.reward[:, b : b + 1],
                steps.done[:, b : b + 1],
                steps.observation[:, b : b + 1],
            ),
            (),
        )
        np.testing.assert_allclose(
            outputs.policy_logits[first:, 0], steps.policy_logits[first:, b], atol=1e-4
        )


# Two learners with one actor each, on the counter environment.
TWO_LEARNERS = (
    "--num_learners=2",
    "--num_actors=2",
    f"--level_name={COUNTER}",
    "--agent_name=MLPAgent",
    f"--unroll_length={UNROLL_LENGTH}",
    "--batch_size=4",
    "--num_envs_per_actor=2",
    "--learning_rate=0.01",
)


def _run_local(tmp_path, *flags, timeout=300):
    runs = tmp_path / "runs"
    completed = subprocess.run(
        run_local_argv(runs, *flags),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (run_dir,) = [runs / name for name in os.listdir(runs)]
    return completed, run_dir


def _summaries(run_dir):
    return [
        json.loads((run_dir / name).read_text())
        for name in sorted(os.listdir(run_dir))
        if name.startswith("learner_")
    ]


class _PairRun(NamedTuple):
    run_dir: object
    stopped: list  # each learner's summary after Ctrl-C
    stopped_log: str  # run_local's output up to the stop
    finished: list  # each learner's summary at the end of the resumed run
    resumed: subprocess.CompletedProcess  # the resume, started with the run's name only
    leftovers_after_stop: list
    leftovers_after_finish: list


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    """One run of two learners under mpirun and two actors through run_local.py, stopped with
    Ctrl-C and resumed with only its name to its budget: shared by the tests that need one.
    Its learners combine their gradients asynchronously (each step applies the average of the
    step before's); the SSH frontend's and fault injection's learners, synchronously."""
    runs = tmp_path_factory.mktemp("pair") / "runs"
    run_dir = runs / "pair"
    processes = Processes(str(runs.parent))
    try:
        first = processes.start(
            "run_local_1",
            run_local_argv(
                runs,
                "--experiment=pair",
                *TWO_LEARNERS,
                "--total_environment_frames=2400",
                "--grad_workers_communication=asynchronous",
            ),
        )
        wait_until(lambda: "  step " in processes.log(first), 180, lambda: processes.log(first))
        # No more trajectories: the learners cannot reach their budget before Ctrl-C, however
        # fast this machine (they can still train on what is queued, a few steps).
        actors = pids_with("experiment.py --job_name=actor", f"--logdir={runs}")
        assert len(actors) == 2, processes_with(f"--logdir={runs}")
        for pid in actors:
            os.kill(pid, signal.SIGSTOP)
        first.send_signal(signal.SIGINT)  # Ctrl-C
        wait_until(lambda: " checkpoint " in processes.log(first), 60, lambda: processes.log(first))
        for pid in actors:
            os.kill(pid, signal.SIGCONT)  # so that they hear run_local's SIGTERM
        assert processes.wait(first, 60) == 130, processes.log(first)
        stopped = _summaries(run_dir)
        leftovers_after_stop = processes_with(f"--logdir={runs}")
        # Only the run's name: the rest comes from its flags.json.
        resumed = subprocess.run(
            run_local_argv(runs, "--experiment=pair"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return _PairRun(
            run_dir=run_dir,
            stopped=stopped,
            stopped_log=processes.log(first),
            finished=_summaries(run_dir),
            resumed=resumed,
            leftovers_after_stop=leftovers_after_stop,
            leftovers_after_finish=processes_with(f"--logdir={runs}"),
        )
    finally:
        processes.kill_all()


def test_two_learners_under_mpirun_stay_identical_and_serve_only_their_actors(pair_run):
    resumed = pair_run.resumed
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    first, second = pair_run.finished
    # 2400 frames in all are 240 trajectories of 5 steps for each learner. With the default
    # replay a start's first step takes 4 fresh ones (its replay is empty), the later ones 2
    # fresh and 2 replayed: 4 + 2 x 58 + 4 + 2 x 58 = 240 in 118 steps over the two starts.
    stopped_steps = pair_run.stopped[0]["steps"]
    assert first["steps"] == second["steps"] == 118 - stopped_steps
    assert first["frames"] == second["frames"] == 2400
    assert first["weights_sha256"] == second["weights_sha256"]
    assert set(first["trajectories_by_actor"]) == {"0"}
    assert set(second["trajectories_by_actor"]) == {"1"}
    # The closing line counts this start's frames: those after the stop.
    assert f"done: {(2400 - pair_run.stopped[0]['frames']) / 1000:.3g}k frames" in resumed.stdout
    assert pair_run.leftovers_after_finish == []


def test_two_learners_stopped_with_ctrl_c_save_at_the_same_step_and_resume_with_saved_flags(
    pair_run,
):
    stopped, finished = pair_run.stopped, pair_run.finished
    assert len(stopped) == 2 and all(s["stopped_early"] for s in stopped)
    # Both learners stopped after the same step, with the same weights, and rank 0 saved them.
    assert stopped[0]["steps"] == stopped[1]["steps"] > 0
    assert stopped[0]["weights_sha256"] == stopped[1]["weights_sha256"]
    assert f"at {stopped[0]['frames']} frames" in pair_run.stopped_log
    assert pair_run.leftovers_after_stop == []

    second = pair_run.resumed
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming" in second.stdout and "2 learner(s), 2 actor(s)" in second.stdout
    assert "--num_envs_per_actor=2" in second.stdout
    assert "--grad_workers_communication=asynchronous" in second.stdout
    assert finished[0]["resumed_from"]  # rank 0 restores, then broadcasts to every rank
    assert finished[0]["frames"] == finished[1]["frames"] == 2400
    assert finished[0]["weights_sha256"] == finished[1]["weights_sha256"]
    # Each start's replays begin empty: its first step takes 4 fresh trajectories a learner,
    # the later ones 2 (the default replays the other half).
    fresh = [4 + 2 * (start["steps"] - 1) for start in (stopped[0], finished[0])]
    assert stopped[0]["frames"] == 2 * fresh[0] * UNROLL_LENGTH
    assert 2 * sum(fresh) * UNROLL_LENGTH == 2400


def test_mismatched_actor_is_refused_and_the_learner_keeps_serving_after_an_actor_dies(
    processes, tmp_path
):
    (port,) = free_ports(1)
    common = [f"--unroll_length={UNROLL_LENGTH}", "--batch_size=6", "--learning_rate=0.01"]
    learner_process = processes.experiment(
        "learner",
        "--job_name=learner",
        f"--learner_hosts=localhost:{port}",
        f"--level_name={COUNTER}",
        "--agent_name=MLPAgent",
        "--total_environment_frames=3000",
        f"--logdir={tmp_path}",
        "--experiment=run",
        *common,
    )
    good = [processes.experiment(f"actor_{t}", *_actor_flags(port, t)) for t in (0, 1)]
    wrong_network = processes.experiment(
        "wrong_network", *_actor_flags(port, 2, "--agent_name=ShallowConvNetAgent")
    )
    wrong_level = processes.experiment(
        "wrong_level", *_actor_flags(port, 3, "--level_name=CartPole-v1")
    )
    assert processes.wait(wrong_network, 120) == 2
    assert "agent_name: actor has 'ShallowConvNetAgent', learner has 'MLPAgent'" in processes.log(
        wrong_network
    )
    assert processes.wait(wrong_level, 120) == 2
    log = processes.log(wrong_level)
    assert f"level_name: actor has 'CartPole-v1', learner has '{COUNTER}'" in log
    assert "observation_shape: actor has [4], learner has [84, 84, 4]" in log

    # One good actor dies; the learner finishes its budget with the other.
    # "  step ": the progress line of a step (the start-up line says "per agent step").
    wait_until(lambda: "  step " in processes.log(learner_process), 120, "learner never stepped")
    good[0].kill()
    assert processes.wait(learner_process, 180) == 0, processes.log(learner_process)
    assert processes.wait(good[1], 30) == 0
    assert re.search(
        r"learner finished after \d+ unrolls \(\d+ chunks sent, \d+ of them .*; \d+ calls asking "
        r"for room; [\d.]+ CPU seconds per unroll after the first; its time: \d+% acting, "
        r"\d+% fetching weights, \d+% sending, \d+% waiting for room\); exiting",
        processes.log(good[1]),
    )
    summary = json.loads((tmp_path / "run" / "learner_0.json").read_text())
    assert summary["frames"] >= 3000
    assert summary["trajectories_by_actor"]["1"] > 0
    assert "2" not in summary["trajectories_by_actor"]
    assert "3" not in summary["trajectories_by_actor"]
    # Where the learner's time went after its first step: its parts add up to the time the
    # steady rate was measured over (each step adds the same frames), give or take a step's
    # tail, and each is there.
    split = summary["steady_secs"]
    assert summary["steady_steps"] == summary["steps"] - 1
    steady_frames = summary["steady_steps"] * summary["frames"] / summary["steps"]
    elapsed = steady_frames / summary["frames_per_second_steady"]
    assert abs(sum(split.values()) - elapsed) < 0.1 * elapsed + 0.5, (split, elapsed)
    assert split["train_steps"] > 0 and split["waiting_for_batch"] > 0 and split["other"] > 0
    # The CPU it used over that window: some, and no more than its threads could have used on
    # this machine's cores in that time.
    assert 0 < summary["steady_cpu_secs"] <= (os.cpu_count() or 1) * (elapsed + 0.5)
    # The learner shares this machine's cores with its actors: its threads waited for one.
    if thread_core_waits() is not None:
        assert summary["steady_core_wait_secs"] > 0, summary["steady_core_wait_secs"]


def test_an_actor_waits_for_its_learner_and_gives_up_with_a_clear_message(processes):
    (port,) = free_ports(1)
    actor = processes.experiment("actor", *_actor_flags(port, 0, "--connect_timeout_secs=3"))
    assert processes.wait(actor, 60) == 1
    assert f"no learner answered at localhost:{port} within 3 s" in processes.log(actor)
