"""benchmarks.learning (its figures and one-line errors), benchmarks.probe_network,
benchmarks.probe_games, benchmarks.pong_points, benchmarks.parity_probe and
benchmarks.throughput's flags."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

import experiment
from benchmarks import (
    learning_configs,
    learning_figures,
    parity_probe,
    pong_points,
    probe_network,
)
from impala import curves, evaluation, run_folder
from impala import flags as experiment_flags
from impala.learner import checkpoints
from tests.fake_runs import save_checkpoints
from tests.helpers import ROOT, Processes, processes_with, read_text, wait_until


def _curve(returns, window, start_frames=None):
    returns = np.asarray(returns, np.float64)
    return curves.Curve(
        name="catch",
        frames=1000 * (1 + np.arange(len(returns))),
        hours=np.arange(len(returns)) / 3600,
        returns=returns,
        smoothed=curves.moving_mean(returns, window),
        window=window,
        frames_reached=1000 * len(returns),
        hours_from_wall_time=False,
        start_frames=None if start_frames is None else np.asarray(start_frames, np.float64),
    )


def _summary(run_dir, **fields):
    summary = {"frames": 8000, "stopped_early": False, "frames_per_second_steady": 500.0}
    summary.update(fields)
    (run_dir / "learner_0.json").write_text(json.dumps(summary))


def test_figures_count_only_full_windows_of_games(tmp_path):
    # A lucky first game (1.0) must not count on its own: with a window of 4, the means of full
    # windows are -0.5, -0.5, 0, 0.5, 0.75 (games 4 to 8, reported at 4k to 8k frames).
    returns = [1.0, -1, -1, -1, 1, 1, 1, 0]
    _summary(tmp_path)
    benchmark = learning_configs.Benchmark(("--level_name=impala/Catch-v0",), 8000, (0.0, 0.6, 0.9))
    figures = learning_figures.results(benchmark, _curve(returns, 4), str(tmp_path), 16.0, ["x"])
    assert figures["window"] == 4 and figures["games"] == 8
    assert figures["final_mean_return"] == 0.75
    assert figures["best_mean_return"] == 0.75
    assert figures["frames_to_reach"] == {"0": 6000, "0.6": 8000, "0.9": None}
    assert figures["frames_per_second_overall"] == 500.0


def test_the_last_games_are_reported_by_the_frame_each_began_on(tmp_path):
    """A policy that wins the games begun on odd frames and loses the others shows apart, by
    parity and by phase modulo the run's frames per step; games without a start (NaN) and those
    before the window are left out."""
    _summary(tmp_path)
    benchmark = learning_configs.Benchmark(("--level_name=PongNoFrameskip-v4",), 8000, ())
    returns = [-21, -21, 20, -15, 21, -19, 19, -20, 18]
    starts = [3, 4, 1, 2, 7, 8, 9, 10, np.nan]  # the first game falls outside the window of 8
    figures = learning_figures.results(
        benchmark, _curve(returns, 8, starts), str(tmp_path), 1.0, []
    )
    assert figures["by_start_frame"] == {
        "games": 7,
        "parity": {
            "odd": {"games": 3, "mean_return": 20.0},
            "even": {"games": 4, "mean_return": -18.75},
        },
        "modulo": 4,
        "phase": {
            "0": {"games": 2, "mean_return": -20.0},  # frames 4 and 8
            "1": {"games": 2, "mean_return": 19.5},  # 1 and 9
            "2": {"games": 2, "mean_return": -17.5},  # 2 and 10
            "3": {"games": 1, "mean_return": 21.0},  # 7
        },
    }
    # The run's own frame skip sets the phases; an unreadable or implausible one is taken as 4.
    for frame_skip, modulo in ((3, 3), ("lots", 4), (10**9, 4), (-2, 4)):
        run_folder.write_flags(str(tmp_path), {"frame_skip": frame_skip})
        figures = learning_figures.results(
            benchmark, _curve(returns, 8, starts), str(tmp_path), 1.0, []
        )
        assert figures["by_start_frame"]["modulo"] == modulo, frame_skip
        assert len(figures["by_start_frame"]["phase"]) == modulo
    run_folder.write_flags(str(tmp_path), {"frame_skip": 3})
    phases = learning_figures.results(benchmark, _curve(returns, 8, starts), str(tmp_path), 1.0, [])
    assert phases["by_start_frame"]["phase"]["2"] == {"games": 2, "mean_return": -17.0}  # 2, 8
    # No starts (not Atari, or a curve written before they were kept): no figure.
    assert (
        learning_figures.results(benchmark, _curve(returns, 8), str(tmp_path), 1.0, [])[
            "by_start_frame"
        ]
        is None
    )
    only_unknown = _curve([1.0], 1, [np.nan])
    assert (
        learning_figures.results(benchmark, only_unknown, str(tmp_path), 1.0, [])["by_start_frame"]
        is None
    )


def test_fewer_games_than_the_window_report_the_mean_of_all(tmp_path):
    _summary(tmp_path, frames_per_second_steady=None, stopped_early=True)
    benchmark = learning_configs.Benchmark((), 3000, (0.0,))
    figures = learning_figures.results(
        benchmark, _curve([1.0, -1.0, 0.5], 100), str(tmp_path), 1.0, []
    )
    assert figures["window"] == 3
    assert figures["best_mean_return"] == figures["final_mean_return"] == 0.17
    assert figures["frames_to_reach"] == {"0": 3000}
    assert figures["stopped_early"] and figures["frames_per_second_steady"] is None
    assert figures["policy_lag"] is None  # no event files
    assert figures["policy_entropy"] is None


def test_the_report_lists_the_settings_a_run_changed_from_its_configuration(tmp_path):
    """From the run's own flags.json: a flag the configuration sets is not a change, where the
    run is and its budget are not settings, and a value no parser takes is listed as saved."""
    _summary(tmp_path)
    benchmark = learning_configs.Benchmark(
        ("--level_name=impala/Catch-v0", "--batch_size=4"), 8000, ()
    )
    base = learning_configs.configuration_values(benchmark)
    assert base["batch_size"] == 4 and base["normalize_advantages"] is True
    saved = {name: experiment_flags.as_text(value) for name, value in base.items()}
    figures = learning_figures.results(benchmark, _curve([1.0], 1), str(tmp_path), 1.0, [])
    assert figures["changed_from_configuration"] is None  # no flags.json yet
    saved.update(
        experiment="elsewhere",
        learner_hosts=["localhost:1234"],
        total_environment_frames=1e9,
        frame_skip=3,
        seed="7",
        learning_rate=2.5e-4,  # the default, written another way
        entropy_cost="lots",
    )
    run_folder.write_flags(str(tmp_path), saved)
    figures = learning_figures.results(benchmark, _curve([1.0], 1), str(tmp_path), 1.0, [])
    assert figures["changed_from_configuration"] == {
        "entropy_cost": "lots",
        "frame_skip": 3,
        "seed": "7",
    }
    # A default that follows another flag is a change only where the run's other changes do
    # not imply it: 6 passes follow fresh-only batches, 2 passes beside them do not, nor do 3
    # (the configuration's own, with its replay).
    for reuse, changed in ((6, {}), (2, {"batch_reuse": 2}), (3, {"batch_reuse": 3})):
        run_folder.write_flags(
            str(tmp_path), {**saved, "replay_parameters": "", "batch_reuse": reuse}
        )
        figures = learning_figures.results(benchmark, _curve([1.0], 1), str(tmp_path), 1.0, [])
        assert figures["changed_from_configuration"] == {
            "entropy_cost": "lots",
            "frame_skip": 3,
            "replay_parameters": "",
            "seed": "7",
            **changed,
        }
    # Synchronous collection implies both: only it is a change.
    run_folder.write_flags(
        str(tmp_path),
        {
            **saved,
            "col_workers_communication": "synchronous",
            "replay_parameters": "",
            "batch_reuse": 6,
        },
    )
    figures = learning_figures.results(benchmark, _curve([1.0], 1), str(tmp_path), 1.0, [])
    assert figures["changed_from_configuration"] == {
        "col_workers_communication": "synchronous",
        "entropy_cost": "lots",
        "frame_skip": 3,
        "seed": "7",
    }
    # A flags.json anyone may have written: unreadable, or not an object of flags.
    for hostile in ("{not json", "[1, 2]", "\udcff"):
        (tmp_path / "flags.json").write_text(hostile, errors="surrogateescape")
        figures = learning_figures.results(benchmark, _curve([1.0], 1), str(tmp_path), 1.0, [])
        assert figures["changed_from_configuration"] is None, hostile


@pytest.mark.parametrize(
    ("extra", "repeated"),
    [
        (["--normalize_advantages"], ["normalize_advantages"]),  # on by default
        (["--nonormalize_advantages"], []),
        (["--batch_size=8", "--batch_size=4"], ["batch_size"]),  # the configuration's 4, last
        (["--batch_size=4", "--batch_size=8"], []),  # the last value is the run's
        (["--seed=0", "--frame_skip=3", "--learning_rate=0.00025"], ["seed", "learning_rate"]),
        (["--preset=paper", "--optimizer=adam", "--optimizer=rmsprop"], ["optimizer"]),
        (["--preset=paper", "--optimizer=rmsprop", "--optimizer=adam"], []),
        (["--preset=nonsense", "--optimizer=adam", "--seed=x", "--num_actors=2"], ["optimizer"]),
        # A default that follows the other flags: fresh-only batches imply 6 passes, not 3.
        (["--replay_parameters=", "--batch_reuse=6"], ["batch_reuse"]),
        (["--replay_parameters=", "--batch_reuse=3"], []),
        (["--batch_reuse=3"], ["batch_reuse"]),
    ],
)
def test_extra_flags_that_repeat_the_configuration_are_named(extra, repeated):
    """A screen meant to try a setting that gives it the value it has already is the
    configuration's own run: the benchmark says so before it trains (it once ran a whole
    10M-frame Pong "screen" of --normalize_advantages, which is on by default)."""
    benchmark = learning_configs.Benchmark(
        ("--level_name=impala/Catch-v0", "--batch_size=4"), 8000, ()
    )
    lines = learning_configs.repeated_values(benchmark, "catch", extra)
    assert [re.search(r"gives --(\w+) ", line)[1] for line in lines] == repeated, lines
    for line in lines:
        implied = "--replay_parameters=" in extra and "--batch_reuse" in line
        assert (
            "the other --extra flags imply" if implied else "--config=catch already has"
        ) in line


def test_the_policy_lag_is_read_from_the_learners_summaries(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step, lag in enumerate([2.0] * 18 + [3.0, 11.0, float("nan")]):
            tf.summary.scalar("actors/policy_lag", lag, step=step)
    writer.close()
    assert learning_figures.policy_lag(curves.events.read_scalars(str(tmp_path))) == {
        "median": 2.0,
        "p95": 3.4,
        "max": 11.0,
        "steps": 20,
    }


def test_the_policy_entropy_is_read_against_the_uniform_policys(tmp_path):
    # A batch of 2 x 5 steps, 6 actions: the uniform policy's entropy term is -w * 10 * ln 6.
    save_checkpoints(str(tmp_path), num_actions=6)
    flags = {"batch_size": 2, "unroll_length": 5}  # the run's flags.json
    uniform = 10 * np.log(6)
    points = [  # (frames, entropy term, its weight)
        (50, -0.01 * uniform, 0.01),  # the first tenth of 1,000 frames: uniform
        (150, -0.005 * uniform * 0.8, 0.005),  # a falling weight is divided out
        (250, -0.01 * uniform * 0.6, 0.01),
        (280, -0.01 * uniform * 0.2, 0.01),  # two steps in one tenth: their mean, 0.4
        (350, 0.0, 0.0),  # a weight of 0 says nothing of the entropy: no figure
        (950, -0.02 * uniform * 0.5, 0.02),
    ]
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for frames, term, weight in points:
            tf.summary.scalar("loss/entropy", term, step=frames)
            tf.summary.scalar("loss/entropy_cost", weight, step=frames)
    writer.close()
    scalars = curves.events.read_scalars(str(tmp_path))
    entropy = learning_figures.policy_entropy(scalars, flags, str(tmp_path), 1000)
    assert entropy["maximum_nats"] == round(np.log(6), 4)
    nothing = [None] * 6
    assert entropy["fraction_of_maximum_by_tenth"] == [1.0, 0.8, 0.4, *nothing, 0.5]
    # Without the batch's shape in the run's flags, or with a shape that is not two positive
    # whole numbers (flags.json is a file anyone may edit), there is no figure, and no error.
    for shape in (
        None,
        {},
        {"batch_size": 2},
        {"batch_size": "2", "unroll_length": 5},
        {"batch_size": 2, "unroll_length": 0},
        {"batch_size": True, "unroll_length": 5},
        {"batch_size": 2.0, "unroll_length": 5},
        {"batch_size": -2, "unroll_length": -5},
    ):
        assert learning_figures.policy_entropy(scalars, shape, str(tmp_path), 1000) is None, shape
    # Nor without a checkpoint to count the actions in.
    shutil.rmtree(tmp_path / "checkpoints")
    assert learning_figures.policy_entropy(scalars, flags, str(tmp_path), 1000) is None


def test_the_final_checkpoint_plays_games_as_mode_test_does(tmp_path):
    run_dir = str(tmp_path / "run")
    save_checkpoints(run_dir)  # CartPole: each game's score is its length
    test = learning_figures.test_checkpoint(run_dir, 3)
    assert test["checkpoint"] == os.path.join(run_dir, "checkpoints", "ckpt-7")
    assert (test["games"], test["policy"], test["seed"]) == (3, "sample", 0)
    # The same games as experiment.py --mode=test --checkpoint=<run> --test_num_episodes=3.
    with flagsaver.flagsaver():
        experiment.FLAGS.unparse_flags()
        experiment.FLAGS(
            ["experiment.py", "--mode=test", f"--checkpoint={run_dir}", "--test_num_episodes=3"]
        )
        config = experiment.evaluation_config_from_flags()
    expected = evaluation.run(config, report=lambda line: None)
    assert test["mean_return"] == round(expected.mean, 2)
    assert (test["min"], test["max"]) == (expected.min, expected.max)
    assert test["by_parity"] is None  # CartPole's games have no start frames


def _run(*flags, script="learning"):
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--config=tetris", "flag --config=tetris: value should be one of <pong|breakout|catch>"),
        ("--frames=-5", "flag --frames=-5: -5.0 is not a non-negative number"),
        ("--window=0", "flag --window=0: 0 is not"),
        ("--test_games=-1", "flag --test_games=-1: -1 is not"),
        ("--out_dir={file}/run", "--out_dir={file}/run: Not a directory"),
        ("--out_dir={finished}", "--out_dir={finished} already holds a finished run"),
        ("--branch_from={finished}", "--branch_from={finished}: give the new run's folder as"),
        (
            "--branch_from={finished} --out_dir={file}",
            "--out_dir={file} exists; --branch_from={finished} starts a new run folder",
        ),
        (
            "--branch_from={new}/x --out_dir={new}",
            "--branch_from={new}/x: no such run folder, checkpoints folder or checkpoint",
        ),
    ],
)
def test_bad_flags_are_one_line_errors_before_any_training(tmp_path, flag, message):
    (tmp_path / "a_file").write_text("")
    (tmp_path / "finished").mkdir()
    (tmp_path / "finished" / "learner_0.json").write_text("{}")
    paths = {
        "file": tmp_path / "a_file",
        "finished": tmp_path / "finished",
        "new": tmp_path / "new",
    }
    completed = _run(*flag.format(**paths).split())
    assert completed.returncode != 0
    assert message.format(**paths) in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "finished" / "learning.json").exists()
    assert not (tmp_path / "new").exists()


def test_a_branch_that_would_change_the_runs_flags_or_go_nowhere_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    save_checkpoints(str(run_dir), versions=(3,))  # at 300 frames
    # The Catch configuration's flags but for the game.
    saved = dict(
        flag.removeprefix("--").split("=", 1) for flag in learning_configs.BENCHMARKS["catch"].flags
    )
    run_folder.write_flags(str(run_dir), {**saved, "level_name": "CartPole-v1"})
    out_dir = tmp_path / "new"
    common = [f"--branch_from={run_dir}", f"--out_dir={out_dir}", "--config=catch"]
    other_game = _run(*common)
    assert other_game.returncode != 0 and "Traceback" not in other_game.stderr
    assert (
        f"--branch_from={run_dir}: that run has --level_name=CartPole-v1, which --config=catch "
        "would change to impala/Catch-v0; give --extra=--level_name=... to say which"
    ) in other_game.stderr
    too_short = _run(*common, "--frames=300", "--extra=--level_name=CartPole-v1")
    assert "the checkpoint is at 300 frames; give a larger --frames (now 300)" in too_short.stderr
    assert not out_dir.exists()


def test_probe_network_reports_a_fresh_network_and_refuses_a_missing_checkpoint(tmp_path):
    completed = _run(
        "--level_name=impala/Catch-v0", "init", str(tmp_path / "ckpt-1"), script="probe_network"
    )
    assert completed.returncode == 1
    # A new network gives almost the same policy on every frame.
    assert "init (impala/Catch-v0): SimpleConvNetAgent, features alive " in completed.stdout
    assert "logits std 0.0" in completed.stdout
    (error,) = completed.stderr.strip().splitlines()[-1:]
    assert error.startswith(f"probe_network.py: error: {tmp_path / 'ckpt-1'}: no such run folder")
    assert "Traceback" not in completed.stderr
    # A checkpoint is probed with its own network on its own game, whatever the flags for
    # `init` say (Pong by default); a run folder names its latest checkpoint.
    run_dir = tmp_path / "run"
    save_checkpoints(
        run_dir, "impala/Catch-v0", "ShallowConvNetAgent", shape=(84, 84, 4), num_actions=3
    )
    completed = _run("--agent_name=MLPAgent", str(run_dir), script="probe_network")
    assert completed.returncode == 0, completed.stderr
    latest = run_dir / "checkpoints" / "ckpt-7"
    assert f"{latest} (impala/Catch-v0): ShallowConvNetAgent, features alive " in completed.stdout
    # A flag the command refuses before it loads anything: one line.
    completed = _run("--frame_skip=-1", "init", script="probe_network")
    assert completed.returncode != 0
    assert "flag --frame_skip=-1: -1 is not a non-negative integer" in completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    "init, message",
    [
        # A network it cannot probe is a bad flag for `init`: one line, status 2.
        ({"agent_name": "ShallowLSTMAgent"}, "init: ShallowLSTMAgent: only feed-forward agents"),
        ({"agent_name": "Bogus"}, "Unknown --agent_name='Bogus'"),
        # `init`'s frames are played with --frame_skip and --frame_pooling, Atari settings only.
        ({"frame_skip": 3}, "--frame_skip=3: the frame skip is an Atari"),
        ({"frame_pooling": "last"}, "--frame_pooling=last: frame pooling is an"),
    ],
)
def test_probe_network_refuses_an_init_it_cannot_probe_in_one_line(capsys, init, message):
    """In this process, through the command's own function (the command line's refusals are
    in the test above)."""
    settings = probe_network.Init(level_name="impala/Catch-v0", num_envs=1, **init)
    assert probe_network.probe_all(["init"], settings) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert error.startswith(f"probe_network.py: error: {message}"), error


def test_probe_network_shows_each_checkpoint_the_frames_of_its_own_pooling(tmp_path):
    """The same weights, trained (as their identities say) on each step's maximum of two frames
    and on its last frame: each is probed on frames of its own kind, so their figures differ."""
    figures, weights = {}, {}
    for frame_pooling in ("max", "last"):
        run_dir = tmp_path / frame_pooling
        tf.random.set_seed(0)  # the same initial weights, so the same checkpoints' weights
        weights[frame_pooling] = save_checkpoints(
            run_dir,
            "PongNoFrameskip-v4",
            "SimpleConvNetAgent",
            shape=(84, 84, 4),
            num_actions=6,
            frames_per_step=4,
            frame_pooling=frame_pooling,
        )
    for mine, theirs in zip(weights["max"][-1], weights["last"][-1], strict=True):
        np.testing.assert_array_equal(mine, theirs)
    completed = _run(str(tmp_path / "max"), str(tmp_path / "last"), script="probe_network")
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.strip().splitlines()
    for frame_pooling, line in zip(("max", "last"), lines[-2:], strict=True):
        assert line.startswith(f"{tmp_path / frame_pooling / 'checkpoints' / 'ckpt-7'} (Pong"), line
        figures[frame_pooling] = line.split("features alive ", 1)[1]
    assert figures["max"] != figures["last"], figures


def test_probe_games_plays_each_environments_games_and_refuses_a_missing_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    save_checkpoints(str(run_dir))  # CartPole, as a learner writes it
    completed = _run(str(run_dir), "--num_envs=3", "--games_per_env=2", script="probe_games")
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    checkpoint = run_dir / "checkpoints" / "ckpt-7"
    assert lines[0] == f"{checkpoint}: 3 environments, 2 games each (sampled policy)"
    scores = [line.split(":")[1].split() for line in lines[1:4]]
    assert [line.split(":")[0] for line in lines[1:4]] == [f"  environment  {i}" for i in range(3)]
    assert all(len(row) == 2 and all(float(s) >= 1 for s in row) for row in scores)
    mean = np.mean([float(s) for row in scores for s in row])
    assert lines[4] == f"  mean {mean:+.1f} over 6 games; games by score:"
    assert sum(int(line.rsplit(":", 1)[1]) for line in lines[5:]) == 6
    missing = _run(str(tmp_path / "none"), script="probe_games")
    assert missing.returncode == 1
    assert (
        missing.stderr.strip()
        .splitlines()[-1]
        .startswith(f"probe_games.py: error: {tmp_path / 'none'}: no such run folder")
    )
    assert "Traceback" not in missing.stderr


def test_pong_points_tells_a_games_points_and_refuses_other_games(tmp_path):
    pong = tmp_path / "pong"
    save_checkpoints(
        str(pong),
        level_name="PongNoFrameskip-v4",
        agent_name="ShallowConvNetAgent",
        shape=(84, 84, 4),
        num_actions=6,
    )
    # With sticky actions, as the actors of a run with them play: the same report.
    completed = _run(
        str(pong), "--num_games=1", "--repeat_action_probability=0.25", script="pong_points"
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    assert lines[0] == f"{pong / 'checkpoints' / 'ckpt-7'}: 1 games (sampled policy)"
    _, _, score, _, _, start, outcomes = lines[1].split()
    start = int(start.rstrip(")"))
    assert 1 <= start <= 29  # after 0-29 no-op frames and FIRE's
    # A near-random policy: the computer wins the game, 21 points to a few.
    assert (outcomes.count("l"), int(score)) == (21, outcomes.count("W") - 21)
    parity, other = ("even", "odd") if start % 2 == 0 else ("odd", "even")
    line = {"odd": lines[2], "even": lines[3]}
    assert line[other] == f"  games from an {other} frame: 0 (0 won)"
    played, sight = line[parity].split("; ", 1)
    assert played == f"  games from an {parity} frame: 1 (mean {int(score):+.1f}, 0 won)"
    # What the network saw and expected: a share of steps and a value estimate, as numbers.
    shown, value = re.fullmatch(
        r"paddle shown at two heights in (\d+\.\d)% of steps; "
        r"value over the first 50 steps ([+-]\d+\.\d{3})",
        sight,
    ).groups()
    assert 0 <= float(shown) <= 100 and abs(float(value)) < 100
    # The frame skip keeps the start frame modulo 4 too: the game is counted in its phase.
    assert lines[4] == (
        f"  games by their first frame modulo 4: {start % 4}: 1 (mean {int(score):+.1f}, 0 won)"
    )
    assert lines[5:7] == ["  games won (0):", "  games lost (1):"]
    untouched, lost = lines[7].split(": ")[1].split(" of ")
    assert lines[7].startswith("    points lost without touching the ball: ")
    assert int(lost) == 21 and 0 < int(untouched) <= 21
    # A game opens with a serve to the computer, going down (README: the point a good policy
    # loses most).
    first = re.fullmatch(
        r"    won, each game's first point: (0|100)% of 1 \(([01]) lost without touching the "
        r"ball; served (.*) in 1\)",
        lines[8],
    )
    assert first and first[3] == "to the computer going down", lines[8]
    assert (first[1] == "100") == (outcomes[0] == "W")
    # Every point after the first is served to the loser of the one before.
    served_to_agent = sum(int(line.rsplit(" of ", 1)[1]) for line in lines[9:11] if "of" in line)
    assert served_to_agent == outcomes[:-1].count("l")
    # The command's one-line error; the other refusals are the same function's, called here.
    missing = _run(str(tmp_path / "none"), script="pong_points")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert (
        missing.stderr.strip()
        .splitlines()[-1]
        .startswith(f"pong_points.py: error: {tmp_path / 'none'}: no such run folder")
    )
    save_checkpoints(str(tmp_path / "cartpole"))
    with pytest.raises(ValueError) as cartpole:
        pong_points.play_games(str(tmp_path / "cartpole"), num_games=1, seed=0)
    assert str(cartpole.value) == (
        f"{tmp_path / 'cartpole' / 'checkpoints' / 'ckpt-7'}: trained on 'CartPole-v1', not Pong"
    )
    save_checkpoints(
        str(tmp_path / "skip5"),
        level_name="PongNoFrameskip-v4",
        agent_name="ShallowConvNetAgent",
        shape=(84, 84, 4),
        num_actions=6,
        frames_per_step=5,
    )
    with pytest.raises(ValueError) as skip5:
        pong_points.play_games(str(tmp_path / "skip5"), num_games=1, seed=0)
    assert str(skip5.value) == (
        f"{tmp_path / 'skip5' / 'checkpoints' / 'ckpt-7'}: trained with 5 frames a step; the "
        "ball's serves and returns are read for at most 4"
    )


def test_parity_probe_reads_three_layers_and_refuses_what_it_cannot_probe(tmp_path):
    def pong(name, agent_name, **kwargs):
        save_checkpoints(
            str(tmp_path / name),
            level_name="PongNoFrameskip-v4",
            agent_name=agent_name,
            shape=(84, 84, 4),
            num_actions=6,
            **kwargs,
        )
        return str(tmp_path / name)

    # A recurrent agent (its torso read before the core) and one that sees the last action,
    # then a checkpoint of another game: the reports, then its one-line error.
    runs = [pong("lstm", "ShallowLSTMAgent"), pong("last", "ShallowConvNetLastActionAgent")]
    save_checkpoints(str(tmp_path / "cartpole"))
    completed = _run(
        "--num_games=16", "--steps=3", *runs, str(tmp_path / "cartpole"), script="parity_probe"
    )
    assert completed.returncode == 1 and "Traceback" not in completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 8
    for run, (title, *probes) in zip(runs, (lines[:4], lines[4:]), strict=True):
        head = re.fullmatch(
            rf"{re.escape(run)}/checkpoints/ckpt-7: 16 games \((\d+) from an odd frame\), their "
            r"first 3 steps; each quarter of the games held out from its probe",
            title,
        )
        assert head and 4 <= int(head[1]) <= 12, title
        names = ("paddle cue (4)", "torso (256)", "outputs (7)")
        for probe, name in zip(probes, names, strict=True):
            right = re.fullmatch(
                rf"  {re.escape(name)} +steps right +(\d+\.\d)%, games right +(\d+) of 16", probe
            )
            assert right and 0 <= float(right[1]) <= 100 and int(right[2]) <= 16, probe
    assert completed.stderr.strip().splitlines()[-1] == (
        f"parity_probe.py: error: {tmp_path / 'cartpole' / 'checkpoints' / 'ckpt-7'}: "
        "trained on 'CartPole-v1', not Pong"
    )
    # The other refusals are the same function's, called here.
    with pytest.raises(ValueError) as skip3:
        parity_probe.play_openings(
            pong("skip3", "ShallowConvNetAgent", frames_per_step=3), 64, 200, 100
        )
    assert str(skip3.value) == (
        f"{tmp_path / 'skip3' / 'checkpoints' / 'ckpt-7'}: trained with 3 frames a step, so a "
        "game's parity alternates from step to step and no game has one to probe"
    )
    # Too few games to hold out a quarter of each parity (these 8 games' starts).
    with pytest.raises(ValueError) as few:
        parity_probe.play_openings(runs[1], 8, 200, 100)
    assert str(few.value) == (
        "4 of 8 games began on an odd frame, too few of one parity to hold out a quarter of "
        "them; raise --num_games or change --seed"
    )


@pytest.mark.parametrize(
    "script, flag",
    [
        ("probe_games", "--num_envs=0"),
        ("probe_games", "--games_per_env=0"),
        ("probe_games", "--seed=-1"),
        ("pong_points", "--num_games=0"),
        ("pong_points", "--num_games=257"),
        ("pong_points", "--seed=-1"),
        ("pong_points", "--repeat_action_probability=1.5"),
        ("probe_games", "--repeat_action_probability=-0.1"),
        ("parity_probe", "--num_games=7"),
        ("parity_probe", "--steps=0"),
        ("parity_probe", "--steps=501"),
        ("parity_probe", "--seed=-1"),
    ],
)
def test_game_probes_refuse_bad_flags_in_one_line(tmp_path, script, flag):
    completed = _run(str(tmp_path), flag, script=script)
    assert completed.returncode != 0
    assert f"flag {flag}: " in completed.stderr and "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--batch_reuse=0", "--batch_reuse=0: must be at least 1"),
        ("--optimizer=sgd", "flag --optimizer=sgd: value should be one of"),
        ("--total_environment_frames=1e6", "the end-to-end budget is --e2e_frames"),
        ("--num_learners=0", "flag --num_learners=0: 0 is not a positive integer"),
        ("--num_learners=two", "flag --num_learners=two: invalid literal"),
    ],
)
def test_throughput_takes_experiment_flags_and_refuses_bad_ones_in_one_line(flag, message):
    completed = _run(flag, script="throughput")
    assert completed.returncode != 0
    assert message in completed.stderr
    assert "Traceback" not in completed.stderr


def _contents(folder):
    """Every file under `folder` with a digest of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


# The catch benchmark's run here is short: what learning Catch takes is proven by the Catch
# learning test (tests/e2e/test_policies.py), which two policies pass through the same path.
BENCH_FRAMES = 8_000


def _bench_argv(out_dir, frames=BENCH_FRAMES):
    """`benchmarks.learning` on Catch: the learning test's settings, BENCH_FRAMES unless given."""
    return [
        sys.executable,
        "-u",
        "-m",
        "benchmarks.learning",
        "--config=catch",
        f"--frames={frames}",
        f"--out_dir={out_dir}",
        "--extra=--seed=1",
        "--window=20",
        "--test_games=2",
    ]


class _CatchBench(NamedTuple):
    out_dir: object
    stopped: dict  # learning.json after SIGTERM
    leftovers_after_stop: list
    resumed: dict  # learning.json after the same command ran the run to its budget
    resumed_log: str
    leftovers_after_finish: list


@pytest.fixture(scope="module")
def catch_bench(tmp_path_factory):
    """One Catch benchmark run through the whole distributed path (run_local.py: a learner
    process and two actor processes over gRPC), stopped with SIGTERM (as a job scheduler stops
    it) after its first learner step and resumed by the same command to its budget: shared by
    the tests of its figures, stopping, resuming, training on and branching."""
    out_dir = tmp_path_factory.mktemp("bench") / "catch"
    processes = Processes(str(out_dir.parent))
    try:
        bench = processes.start("learning", _bench_argv(out_dir))
        learners_log = out_dir / "learners.log"
        wait_until(lambda: "  step " in read_text(learners_log), 120, lambda: processes.log(bench))
        bench.send_signal(signal.SIGTERM)
        assert processes.wait(bench, 120) == 0, processes.log(bench)
        stopped = json.loads((out_dir / "learning.json").read_text())
        leftovers_after_stop = processes_with(str(out_dir))
        again = processes.start("learning_again", _bench_argv(out_dir))
        assert processes.wait(again, 400) == 0, processes.log(again)
        return _CatchBench(
            out_dir=out_dir,
            stopped=stopped,
            leftovers_after_stop=leftovers_after_stop,
            resumed=json.loads((out_dir / "learning.json").read_text()),
            resumed_log=processes.log(again),
            leftovers_after_finish=processes_with(str(out_dir)),
        )
    finally:
        processes.kill_all()


@pytest.mark.slow
def test_the_catch_benchmark_reports_its_run_through_the_distributed_path(catch_bench):
    """learning.json of a Catch run through run_local.py (a learner process and two actor
    processes over gRPC): the budget trained, full windows of games, the first crossing of each
    of the configuration's thresholds (or none), the games of its test and its speed."""
    figures = catch_bench.resumed
    assert figures["frames"] == BENCH_FRAMES and figures["window"] == 20, figures
    assert figures["games"] >= 20 and -1 <= figures["final_mean_return"] <= 1, figures
    assert figures["best_mean_return"] >= figures["final_mean_return"], figures
    assert set(figures["frames_to_reach"]) == {"0", "0.5", "0.9"}, figures
    assert all(
        frames is None or 0 < frames <= BENCH_FRAMES
        for frames in figures["frames_to_reach"].values()
    ), figures
    assert figures["test"]["games"] == 2 and figures["frames_per_second_steady"] > 0, figures


@pytest.mark.slow
def test_the_catch_report_names_the_one_setting_its_command_changed(catch_bench):
    """learning.json and the last lines say what the run changed from its configuration, read
    from the flags its learner ran with: here the seed that --extra gave, nothing else."""
    assert catch_bench.stopped["changed_from_configuration"] == {"seed": 1}, catch_bench.stopped
    assert catch_bench.resumed["changed_from_configuration"] == {"seed": 1}, catch_bench.resumed
    assert "settings changed from --config=catch's: --seed=1\n" in catch_bench.resumed_log


@pytest.mark.slow
def test_sigterm_stops_the_training_saves_reports_and_the_same_command_resumes(
    catch_bench, processes, tmp_path
):
    """SIGTERM reaches the run: it saves and stops its processes, and the benchmark reports on
    the frames trained, with no process left behind. Run again, it resumes from the checkpoint
    and reports on the whole run; a larger budget trains it on; a branch from the checkpoint
    the stop saved trains a new run and leaves this one as it was."""
    out_dir = catch_bench.out_dir
    figures = catch_bench.stopped
    assert figures["stopped_early"] and 0 < figures["frames"] < BENCH_FRAMES
    assert figures["test"]["games"] == 2
    assert figures["policy_lag"]["steps"] >= 1 and figures["policy_lag"]["median"] >= 0
    assert catch_bench.leftovers_after_stop == []

    budget = BENCH_FRAMES
    assert "resuming the stopped run" in catch_bench.resumed_log
    resumed = catch_bench.resumed
    assert resumed["resumed"] and not resumed["stopped_early"]
    assert resumed["frames"] == budget and resumed["games"] > figures["games"]
    assert resumed["test"]["games"] == 2
    # The policy's entropy, against Catch's 3 actions, in each tenth of the whole run.
    entropy = resumed["policy_entropy"]
    assert entropy["maximum_nats"] == round(np.log(3), 4)
    tenths = entropy["fraction_of_maximum_by_tenth"]
    assert len(tenths) == 10 and tenths[-1] is not None
    assert all(0 < fraction <= 1 for fraction in tenths if fraction is not None), tenths
    assert catch_bench.leftovers_after_finish == []
    # The curve file holds the whole run's games, as the curve it was drawn from.
    curve = curves.load_curve(str(out_dir / "curve.csv"), "catch", 20)
    assert len(curve.returns) == resumed["games"]
    assert round(float(curve.smoothed[-1]), 2) == resumed["final_mean_return"]

    # Finished, it refuses the same budget in one line and trains on to a larger one.
    same = _run(*_bench_argv(out_dir)[4:])
    assert same.returncode != 0 and "Traceback" not in same.stderr
    assert f"already holds a finished run of {budget} frames; give a larger" in same.stderr
    # Finished with its report cut short (stopped before its learning.json was written), the
    # same command writes the report without training.
    learning_json = out_dir / "learning.json"
    learning_json.unlink()
    again = _run(*_bench_argv(out_dir)[4:], "--test_games=0")
    assert again.returncode == 0, again.stderr
    assert "before its report was complete: reporting it" in again.stdout, again.stdout
    reported = json.loads(learning_json.read_text())
    assert reported["frames"] == budget and reported["games"] == resumed["games"]
    assert reported["wall_minutes"] is None and reported["frames_per_second_overall"] is None
    assert processes_with(str(out_dir)) == []

    # (No test games: the run's figures are what this part is about.)
    longer = processes.start(
        "learning_longer", [*_bench_argv(out_dir, budget + 2000), "--test_games=0"]
    )
    assert processes.wait(longer, 180) == 0, processes.log(longer)
    assert f"on from {budget} frames to {budget + 2000}" in processes.log(longer)
    extended = json.loads((out_dir / "learning.json").read_text())
    assert extended["frames"] == budget + 2000 and extended["games"] > resumed["games"]
    assert processes_with(str(out_dir)) == []

    # A branch from the checkpoint the stop saved trains a new run on from there, with a flag
    # changed, and leaves the run as it was.
    (stop_checkpoint, *_), _ = checkpoints.listed(str(out_dir / "checkpoints"))
    assert checkpoints.read_counter(stop_checkpoint, "frames") == figures["frames"]
    run_files = _contents(out_dir)
    fork = tmp_path / "fork"
    branch_budget = figures["frames"] + 2000  # 25 learner steps of 8 x 10 frames past the stop
    branch_argv = [
        *_bench_argv(out_dir)[:4],
        "--config=catch",
        f"--frames={branch_budget}",
        f"--out_dir={fork}",
        f"--branch_from={stop_checkpoint}",
        "--extra=--entropy_cost=0.02",
        # The bonus's weight falling from there, which the progress lines show.
        "--extra=--entropy_cost_anneal_frames=1e6",
        "--test_games=0",
    ]
    forked = processes.start("learning_branch", branch_argv)
    assert processes.wait(forked, 180) == 0, processes.log(forked)
    assert f"branched {stop_checkpoint} ({figures['frames']} frames)" in processes.log(forked)
    fork_log = read_text(fork / "learners.log")
    assert "with changed flags: --entropy_cost: 0.01 -> 0.02" in fork_log
    weights = re.findall(r"entropy -\d+\.\d+ at weight (0\.\d{4})\) \| ", fork_log)
    assert weights and all(0.0198 <= float(weight) <= 0.02 for weight in weights), fork_log
    assert " at weight " not in read_text(out_dir / "learners.log")
    branched = json.loads((fork / "learning.json").read_text())
    since = branched["branched_from"]
    assert (since["checkpoint"], since["frames"]) == (stop_checkpoint, figures["frames"])
    assert branched["frames"] == branch_budget and branched["resumed"]
    # Its curve is the run's to the stop, then its own games, which it reports apart.
    assert since["games_since"] > 0 and np.isfinite(since["mean_return_since"])
    assert branched["games"] == figures["games"] + since["games_since"]
    assert "since the branch at" in processes.log(forked)
    # The same command again would resume it (here: it finished); another checkpoint is refused.
    again = _run(*branch_argv[4:])
    assert f"already holds a finished run of {branch_budget} frames" in again.stderr, again.stderr
    other = _run(*branch_argv[4:7], f"--branch_from={out_dir}")
    assert other.returncode != 0 and "Traceback" not in other.stderr
    assert f"--out_dir={fork} exists (branched from {stop_checkpoint}); --branch_from" in (
        other.stderr
    )
    assert _contents(out_dir) == run_files
    assert f"resumed from {fork}/checkpoints/{os.path.basename(stop_checkpoint)}: " in read_text(
        fork / "learners.log"
    )
    assert processes_with(str(fork)) == []
