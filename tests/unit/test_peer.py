"""benchmarks.peer (Sample Factory 2 beside this project): its log and event files read, the
curve and figures made of them, its command lines, stopping its process group, its set-up's
fixes, and its one-line errors. Nothing here installs or runs Sample Factory: its output comes
from tests/data/peer/, captured from a real run (see the README there)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import learning_figures, peer, peer_commands, peer_process, peer_results, peer_setup
from impala import curves
from impala.curves import curve_file
from tests.helpers import ROOT

DATA = os.path.join(ROOT, "tests", "data", "peer")
LOG = os.path.join(DATA, "throughput.log")
EXPERIMENT = os.path.join(DATA, "pong")


def _log_text() -> str:
    with open(LOG, encoding="utf-8") as f:
        return f.read()


# --- the log's throughput lines -----------------------------------------------------------------


def test_throughput_lines_are_read_from_a_real_log_colours_and_all():
    lines = peer_results.fps_lines(_log_text())
    assert len(lines) == 11
    # Before two reports every figure is "nan"; times count from the log's first line.
    assert np.isnan(lines[0].fps_60) and lines[0].frames == 0
    assert lines[0].seconds == pytest.approx(20.015)
    last = lines[-1]
    assert last.seconds == pytest.approx(70.121)
    assert (last.fps_10, last.fps_60, last.fps_300) == (810.5, 327.0, 327.0)
    assert (last.frames, last.samples) == (16384, 6144)


def test_the_steady_figure_is_the_last_60_s_one_after_the_skipped_start():
    result = peer_results.steady_throughput(_log_text(), 0, LOG)
    assert result.frames_per_second == 327.0
    assert result.window == pytest.approx((10.121, 70.121))
    assert (result.frames, result.samples, result.lines) == (16384, 6144, 11)
    # Skipping 5 s, the line at 70.1 s still qualifies; skipping 11 s, the one before, at
    # 65.0 s, does not either: a 60-s figure needs a line at 71 s or later.
    assert peer_results.steady_throughput(_log_text(), 5, LOG).frames_per_second == 327.0
    with pytest.raises(peer_results.PeerError) as error:
        peer_results.steady_throughput(_log_text(), 11, LOG)
    assert str(error.value) == (
        f"{LOG}: the last throughput line came 70 s after the start; skipping 11 s, a 60-s "
        f"figure needs one at 71 s or later: run longer (--seconds)"
    )


def test_a_log_without_throughput_lines_is_named():
    with pytest.raises(peer_results.PeerError, match=r"^sf\.log: no throughput lines"):
        peer_results.steady_throughput("Traceback ...\nImportError: x\n", 60, "sf.log")


def test_the_throughput_mode_prints_frames_samples_and_the_passes_per_frame():
    result = peer_results.steady_throughput(_log_text(), 0, LOG)
    assert peer.throughput_lines(result, 4, 75) == [
        "Sample Factory 2.1.1 APPO on Pong, CPU, 2 workers x 8 envs, convnet_atari, 4 passes "
        "per frame (--num_epochs; ours: 6)",
        "327 emulator frames/s (82 agent steps/s): its 60-s figure, over 10-70 s after its start",
        "6,144 samples (agent steps) collected and 16,384 frames trained by then; 11 throughput "
        "lines in 75 s",
    ]


# --- the event files: the curve and its figures -------------------------------------------------


def test_the_curve_is_the_whole_game_means_not_the_clipped_per_life_ones():
    run = peer_results.load_run(EXPERIMENT, "sf", games_per_mean=2)
    curve = run.curve
    assert len(curve.returns) == 16 and curve.window == 2
    assert curve.frames.tolist() == [0] * 5 + [8192] * 4 + [16384] * 5 + [24576] * 2
    # Whole games (-21, -20), where Sample Factory's own episodes, cut by its decorrelation
    # of the environments at the start, scored -1.5 to -12.
    assert set(curve.returns.tolist()) == {-21.0, -20.0}
    assert run.scalars[peer_results.CLIPPED_RETURN_TAG].values.max() == -1.5
    assert curve.lengths.tolist()[:2] == [3493.0, 3493.0]
    assert np.array_equal(curve.smoothed, curve.returns)  # means already
    assert curve.frames_reached == 24576
    assert np.all(np.diff(curve.hours) > 0) and curve.hours[-1] < 0.03
    assert len(run.spans) == 1


def test_steps_counted_in_agent_steps_are_turned_into_frames():
    curve = peer_results.load_run(EXPERIMENT, "sf", 2, frame_factor=4).curve
    assert curve.frames[-1] == 4 * 24576 and curve.frames_reached == 4 * 24576
    assert peer.frame_factor({"summaries_use_frameskip": True, "env_frameskip": 4}) == 1
    assert peer.frame_factor({"summaries_use_frameskip": False, "env_frameskip": 4}) == 4


def test_the_curve_file_keeps_one_row_per_mean(tmp_path):
    curve = peer_results.load_run(EXPERIMENT, "sf", 2).curve
    path = str(tmp_path / "curve.csv")
    curve_file.write(curve, path)
    with open(path) as f:
        rows = f.read().splitlines()
    assert rows[0] == "frames,return,length_frames,training_hours,start_frames"
    assert rows[1].startswith("0,-21,3493,") and rows[1].endswith(",")
    assert rows[-1].startswith("24576,-21,3327,")
    back = curves.load_curve(path, "sf", 1)  # as plot.py --smooth=1 reads it
    assert np.array_equal(back.returns, curve.returns) and np.array_equal(back.frames, curve.frames)


def test_a_folder_without_means_or_events_is_named(tmp_path):
    with pytest.raises(peer_results.PeerError, match="no TensorBoard events in"):
        peer_results.load_run(str(tmp_path), "sf", 100)
    folder = tmp_path / ".summary" / "0"
    _write_events(folder / "events.out.tfevents.1.vm", 1000.0, [(1010.0, 0, "perf/_fps", 0.0)])
    with pytest.raises(peer_results.PeerError) as error:
        peer_results.load_run(str(tmp_path), "sf", 100)
    assert str(error.value) == (
        f"no 100-game means in {tmp_path} yet (policy_stats/avg_RecordEpisodeStatistics_reward"
        f"): Sample Factory writes one once 100 games have finished"
    )


def _write_events(path, start: float, scalars: list[tuple[float, int, str, float]]) -> None:
    """An event file as tensorboardX writes one: its version record at `start`, then one scalar
    per record, (wall time, step, tag, value)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        first = tf.compat.v1.Event(wall_time=start, file_version="brain.Event:2")
        writer.write(first.SerializeToString())
        for wall_time, step, tag, value in scalars:
            summary = tf.compat.v1.Summary(
                value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)]
            )
            event = tf.compat.v1.Event(wall_time=wall_time, step=step, summary=summary)
            writer.write(event.SerializeToString())


def _means(times, steps, values) -> list[tuple[float, int, str, float]]:
    return [
        (t, s, tag, v)
        for t, s, v in zip(times, steps, values, strict=True)
        for tag in (peer_results.RETURN_TAG, peer_results.FPS_TAG)
    ]


def test_a_resumed_run_drops_what_it_trained_again_and_its_time_stopped(tmp_path):
    folder = tmp_path / ".summary" / "0"
    # First start: 0-200 s, means at 100 and 200 s. Stopped, its checkpoint at step 1000;
    # started again at 1000 s (an hour off is left out), means from step 1000 on.
    _write_events(
        folder / "events.out.tfevents.1000.vm",
        0.0,
        _means([100.0, 200.0], [500, 1500], [-20.0, -19.0]),
    )
    _write_events(
        folder / "events.out.tfevents.2000.vm",
        3800.0,
        _means([3900.0, 4000.0], [1000, 2000], [-18.0, 17.5]),
    )
    run = peer_results.load_run(str(tmp_path), "sf", 100)
    # Step 1500 of the first start was trained again after the resume: dropped.
    assert run.curve.frames.tolist() == [500, 1000, 2000]
    assert run.curve.returns.tolist() == [-20.0, -18.0, 17.5]
    assert run.spans == [(0.0, 200.0), (3800.0, 4000.0)]
    assert (run.curve.hours * 3600).tolist() == pytest.approx([100.0, 300.0, 400.0])
    figures = peer_results.figures(run, (-19.0, 18.0))
    assert figures["frames_to_reach"] == {"-19": 1000, "18": None}
    assert figures["hours_to_reach"] == {"-19": round(300 / 3600, 3), "18": None}
    assert figures["training_hours"] == round(400 / 3600, 3)
    assert figures["frames_per_second_overall"] == 5.0  # 2000 frames in 400 s
    # After the first minute of each start: 1000 frames in 100 s, then 1000 in 100 s.
    assert figures["frames_per_second_steady"] == 10.0


def test_training_seconds_leave_out_the_time_between_starts():
    spans = [(0.0, 100.0), (500.0, 600.0)]
    times = np.array([-5.0, 50.0, 100.0, 300.0, 550.0, 700.0])
    assert peer_results.training_seconds(spans, times).tolist() == [0, 50, 100, 100, 150, 200]


def test_frames_to_18_are_the_learning_benchmarks_first_crossing_of_the_mean():
    means = np.array([-21.0, 0.0, 17.99, 18.0, 17.0, 19.0])
    frames = np.arange(1, 7) * 1_000_000
    curve = curves.Curve(
        name="sf",
        frames=frames,
        hours=np.arange(1, 7) / 4,
        returns=means,
        smoothed=means,
        window=100,
        frames_reached=6_500_000,
        hours_from_wall_time=False,
    )
    run = peer_results.PeerRun(curve, {}, [(0.0, 6 * 900.0)])
    figures = peer_results.figures(run, (18.0, 20.0))
    assert figures["frames_to_reach"] == {"18": 4_000_000, "20": None}
    assert figures["frames_to_reach"]["18"] == learning_figures.first_crossing(frames, means, 18.0)
    assert figures["hours_to_reach"] == {"18": 1.0, "20": None}
    assert (figures["final_mean_return"], figures["best_mean_return"]) == (19.0, 19.0)
    assert figures["frames"] == 6_500_000 and figures["frames_per_second_steady"] is None


def test_the_report_writes_the_curve_and_peer_json(tmp_path):
    out_dir = tmp_path / "run"
    experiment_dir = out_dir / "sf" / "pong"
    shutil.copytree(EXPERIMENT, experiment_dir)
    (experiment_dir / "checkpoint_p0").mkdir()
    (experiment_dir / "checkpoint_p0" / "checkpoint_000000128_32768.pth").write_bytes(b"")
    (out_dir / "sf_commands.txt").write_text("python -m sf_examples.atari.train_atari --x=1\n")
    assert peer.report(str(out_dir), str(experiment_dir)) == 0
    results = json.loads((out_dir / "peer.json").read_text())
    assert results["return_tag"] == "policy_stats/avg_RecordEpisodeStatistics_reward"
    assert results["row"].startswith("one row per mean Sample Factory wrote, not per game")
    assert results["games_per_mean"] == 2 and results["rows"] == 16
    assert (results["frames"], results["frames_trained"]) == (24576, 32768)
    assert results["stopped_early"] is True  # its budget was 10M frames
    assert results["frames_to_reach"] == {"-15": None, "0": None, "10": None, "18": None}
    assert results["final_mean_return"] == -21.0 and results["best_mean_return"] == -20.0
    assert results["settings"]["num_batches_per_epoch"] == 8
    assert results["settings"]["encoder_conv_architecture"] == "convnet_atari"
    assert results["sf_commands"] == ["python -m sf_examples.atari.train_atari --x=1"]
    assert curve_file.read(str(out_dir / "curve.csv"), "sf", 1).returns[-1] == -21.0


# --- command lines, checkpoints ---------------------------------------------------------------


def test_the_command_lines_are_sample_factorys_atari_example_on_16_cpu_environments():
    base = [
        "py",
        "-m",
        "sf_examples.atari.train_atari",
        "--env=atari_pong",
        "--device=cpu",
        "--num_workers=2",
        "--num_envs_per_worker=8",
        "--num_batches_per_epoch=8",
    ]
    assert peer_commands.throughput_command("py", "/tmp/t", 150, 6, ["--seed=1"]) == [
        "timeout",
        "--signal=INT",
        "--kill-after=30",
        "150",
        *base,
        "--experiment=throughput",
        "--train_dir=/tmp/t",
        "--encoder_conv_architecture=convnet_atari",
        "--num_epochs=6",
        "--seed=1",
    ]
    # Its own number of epochs unless one is given.
    assert "--num_epochs" not in " ".join(peer_commands.throughput_command("py", "/t", 150, 0, []))
    assert peer_commands.pong_command("py", "/r/sf", 10e6, []) == [
        *base,
        "--experiment=pong",
        "--train_dir=/r/sf",
        "--train_for_env_steps=10000000",
    ]


def test_extra_flags_must_be_name_value_and_leave_the_benchmarks_own_alone():
    peer_commands.check_extra(["--seed=1", "--async_rl=True"], {"device"})
    for flag, message in [
        ("seed=1", "--extra=seed=1: give a Sample Factory flag as --name=value"),
        ("--seed", "--extra=--seed: give a Sample Factory flag as --name=value"),
        ("--device=gpu", "--extra=--device=gpu: the benchmark sets --device itself"),
    ]:
        with pytest.raises(peer_commands.UsageError) as error:
            peer_commands.check_extra([flag], {"device"})
        assert str(error.value) == message


def test_the_latest_checkpoint_names_the_frames_trained(tmp_path):
    assert peer_commands.checkpoint_frames(str(tmp_path)) is None
    folder = tmp_path / "checkpoint_p0"
    folder.mkdir()
    for name in ["checkpoint_000000064_16384.pth", "checkpoint_000000128_32768.pth"]:
        (folder / name).write_bytes(b"")
    (folder / "checkpoint_temp").write_bytes(b"")  # one being written
    (folder / "best_000000100_99999999.pth").write_bytes(b"")  # the best, not the latest
    assert peer_commands.checkpoint_frames(str(tmp_path)) == 32768


# --- stopping Sample Factory's process group --------------------------------------------------

# A stand-in for Sample Factory: a main process and a worker in its process group; the main one
# asks this test's process to stop (as a user would), then waits.
_STAND_IN = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
worker = subprocess.Popen(["sleep", "60"])
print("worker", worker.pid, flush=True)
os.kill(os.getppid(), signal.SIGTERM)
time.sleep(60)
"""


def _stand_in(tmp_path, mode: str) -> tuple[tuple[int, bool], int]:
    log = tmp_path / "sf.log"
    result = peer_process.run_sf(
        [sys.executable, "-c", _STAND_IN, mode], str(log), cwd=str(tmp_path)
    )
    worker = int(log.read_text().split()[1])
    return result, worker


def _gone(pid: int) -> bool:
    """Whether the process has stopped (exited, whether or not its parent has waited for it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def test_a_stop_signal_stops_the_whole_group_as_ctrl_c_would(tmp_path):
    (status, stopped), worker = _stand_in(tmp_path, "interrupt")
    assert stopped and status != 0  # Ctrl-C's signal ended it
    assert _gone(worker)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers given back


def test_a_group_that_ignores_ctrl_c_is_killed_after_the_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_process, "STOP_GRACE_SECS", 1)
    (status, stopped), worker = _stand_in(tmp_path, "ignore")
    assert stopped and status == -signal.SIGKILL
    assert _gone(worker)


# A stand-in for Sample Factory's start: it logs what Sample Factory's learner logs when it
# could not load a checkpoint (argv[2] "scratch") or loaded one ("loaded"), with a worker in its
# group, and both go on for argv[1] seconds.
_START = f"""
import subprocess, sys, time
worker = subprocess.Popen(["sleep", sys.argv[1]])
print("worker", worker.pid, flush=True)
said = {{"scratch": "{peer_process.FROM_SCRATCH}!", "loaded": "{peer_process.LOADED} 416"}}
print("[2026-12-07 05:39:02,538][15509] Loading state from checkpoint /r/checkpoint_7.pth...")
print("[2026-12-07 05:39:02,539][15509]", said[sys.argv[2]], flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_a_resume_that_starts_from_scratch_is_killed_at_once(tmp_path):
    log = tmp_path / "sf.log"
    began = time.monotonic()
    with pytest.raises(
        peer_process.ResumeError, match=r"could not load its checkpoint /r/checkpoint_7.pth and"
    ):
        peer_process.run_sf(
            [sys.executable, "-c", _START, "60", "scratch"], str(log), str(tmp_path), resuming=True
        )
    assert time.monotonic() - began < 20
    assert _gone(int(log.read_text().split("worker ")[1].split()[0]))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_first_start_from_scratch_is_left_to_train(tmp_path):
    log = tmp_path / "sf.log"
    status, stopped = peer_process.run_sf(
        [sys.executable, "-c", _START, "2", "scratch"], str(log), str(tmp_path)
    )
    assert (status, stopped) == (0, False)


def test_a_resume_is_judged_on_its_own_start_not_on_the_log_of_earlier_ones(tmp_path):
    log = tmp_path / "sf.log"
    log.write_text(f"the first start: {peer_process.FROM_SCRATCH}!\n")
    status, stopped = peer_process.run_sf(
        [sys.executable, "-c", _START, "2", "loaded"], str(log), str(tmp_path), resuming=True
    )
    assert (status, stopped) == (0, False)


def test_sample_factory_loads_its_own_checkpoints_as_torch_did_before_2_6():
    assert peer_process._child_env()["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"


# --- the set-up's fixes -----------------------------------------------------------------------

_LEARNER = (
    "        stats.act_max = var.mb.actions.max()\n\n" + peer_setup.LEARNER_ORIGINAL + "        "
    "stats.adv_std = var.adv_std\n"
)


def test_the_summary_guard_is_applied_once_by_exact_text():
    fixed = peer_setup.patch_text(_LEARNER, "learner.py")
    assert fixed is not None and peer_setup.LEARNER_FIXED in fixed
    assert fixed.replace(peer_setup.LEARNER_FIXED, peer_setup.LEARNER_ORIGINAL) == _LEARNER
    assert peer_setup.patch_text(fixed, "learner.py") is None  # already applied


def test_a_learner_without_the_lines_fails_in_one_line_naming_the_file():
    other = _LEARNER.replace("var.mb.advantages.min()", "var.mb.adv.min()")
    with pytest.raises(peer_setup.SetupError) as error:
        peer_setup.patch_text(other, "/x/sample_factory/algo/learning/learner.py")
    assert str(error.value).startswith("/x/sample_factory/algo/learning/learner.py: the two")
    assert "\n" not in str(error.value)


def test_a_stamped_venv_is_used_at_once(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (tmp_path / "venv" / peer_setup.STAMP_NAME).write_text(peer_setup.stamp_text())
    made = peer_setup.ensure(str(tmp_path), report=pytest.fail)
    assert made.python == str(python) and made.installed_secs == 0
    assert peer_setup.PINS[0] == "torch==2.13.0+cpu"  # never a CUDA build
    assert all("==" in pin for pin in peer_setup.PINS)


def test_a_cache_folder_that_cannot_be_made_fails_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(peer_setup.SetupError) as error:
        peer_setup.ensure(str(blocker / "sf2"), report=lambda line: None)
    assert str(error.value) == f"{blocker / 'sf2'}: Not a directory (the peer's cache folder)"


# --- the command line's one-line errors -------------------------------------------------------


def _peer(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    # A cache folder that is a file: a command that got as far as the set-up would fail there.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.peer", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ROOT, "IMPALA_PEER_DIR": str(blocker / "sf2")},
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        ((), "give one mode, throughput or pong (given: nothing)"),
        (("bench",), "give one mode, throughput or pong (given: bench)"),
        (("pong",), "pong: give the run's folder as --out_dir"),
        (("throughput", "--out_dir=x"), "--out_dir is not a flag of throughput"),
        (
            ("pong", "--out_dir=x", "--num_epochs=6"),
            "--num_epochs is not a flag of pong (for pong give --extra=--num_epochs=K)",
        ),
        (("throughput", "--seconds=-1"), "flag --seconds=-1: -1.0 is not number >= 1"),
        (("throughput", "--frame=3"), "Unknown command line flag 'frame'"),
        (("throughput", "--batch_size=3"), "Unknown command line flag 'batch_size'"),
        (
            ("throughput", "--seconds=100"),
            "--seconds=100: the 60-s figure after --skip_seconds=60 needs at least 120 s",
        ),
        (
            ("throughput", "--extra=--num_epochs=6"),
            "--extra=--num_epochs=6: the benchmark sets --num_epochs itself (give --num_epochs)",
        ),
    ],
)
def test_bad_command_lines_are_one_line_errors(tmp_path, argv, message):
    result = _peer(tmp_path, *argv)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"peer.py: error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout


def test_the_command_reports_on_a_run_with_means(tmp_path):
    """The command line's own path, not only `report` in a process that holds experiment.py's
    flags already: reporting reads the learning benchmark's thresholds, and must not define
    experiment.py's flags beside this command's (both have a --num_epochs)."""
    out_dir = tmp_path / "run"
    shutil.copytree(EXPERIMENT, out_dir / "sf" / "pong")
    completed = _peer(tmp_path, "pong", f"--out_dir={out_dir}", "--report_only")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "[peer] Sample Factory Pong: 2-game mean -21.00 at 0.02M frames" in completed.stdout
    assert json.loads((out_dir / "peer.json").read_text())["rows"] == 16


def test_reporting_on_a_folder_without_a_run_is_a_one_line_error(tmp_path):
    result = _peer(tmp_path, "pong", f"--out_dir={tmp_path / 'none'}", "--report_only")
    assert result.returncode == 1
    assert result.stderr == (
        f"peer.py: error: no Sample Factory run in {tmp_path / 'none' / 'sf' / 'pong'} "
        f"(no config.json)\n"
    )
    assert not (tmp_path / "none").exists()
