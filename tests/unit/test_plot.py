"""plot.py and impala/curves/: reading a run's TensorBoard events and curve files, and drawing
its learning curves."""

import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import tensorflow as tf
from absl import flags

import plot
from impala import curves
from impala.curves import curve_file, events, parity, summary
from tests.helpers import ROOT


def write_events(
    folder, steps, returns=None, training_secs=None, resume_at=None, lengths=None, starts=()
) -> str:
    """Writes one event file into `folder` the way the learner does, one learner start's worth.

    Args:
      folder: the run folder.
      steps: [N] emulator frames at which each episode is reported (repeats allowed).
      returns: [N] episode returns; default a noisy Pong-like climb from -21.
      training_secs: [N] training seconds at each step, or None to write no training time.
      resume_at: (step, training seconds) of a `time/training_secs` written first: where a
        resumed learner starts.
      lengths: episode lengths in frames, of the first len(lengths) episodes; default
        3000 + the episode's index for every episode; () for none.
      starts: the frames the first len(starts) episodes began with; default none.

    Returns:
      The path of the new event file.
    """
    before = set(events.event_files(str(folder)))
    steps = np.asarray(steps)
    if returns is None:
        rng = np.random.default_rng(len(steps))
        returns = np.clip(-21 + 42 * steps / steps.max() + rng.normal(0, 3, len(steps)), -21, 21)
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        if resume_at is not None:
            tf.summary.scalar("time/training_secs", resume_at[1], step=resume_at[0])
        for index, (step, episode_return) in enumerate(zip(steps, returns, strict=True)):
            step = int(step)
            tf.summary.scalar("episode/return", episode_return, step=step)
            if lengths is None:
                tf.summary.scalar("episode/length_frames", 3000 + index, step=step)
            elif index < len(lengths):
                tf.summary.scalar("episode/length_frames", lengths[index], step=step)
            if index < len(starts):
                tf.summary.scalar("episode/start_frames", starts[index], step=step)
            tf.summary.scalar("loss/total", 1.0 / (index + 1), step=step)
            if training_secs is not None:
                tf.summary.scalar("time/training_secs", training_secs[index], step=step)
    writer.close()
    (path,) = set(events.event_files(str(folder))) - before
    return path


def write_run(folder, episodes: int, frames_per_episode: int = 250_000, **kwargs) -> str:
    """A run of `episodes` games, two of them reported at each step, 1 s of training per game."""
    os.makedirs(folder, exist_ok=True)
    steps = frames_per_episode * (1 + np.arange(episodes) // 2) * 2
    return write_events(folder, steps, training_secs=1.0 + np.arange(episodes), **kwargs)


def run_cli(*args: str, module: bool = False, cwd=ROOT) -> subprocess.CompletedProcess:
    """Runs `python plot.py ARGS` (or `python -m plot ARGS`) as a user would."""
    command = ["-m", "plot"] if module else [os.path.join(ROOT, "plot.py")]
    return subprocess.run(
        [sys.executable, *command, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_main(*args: str) -> int:
    """plot.main as app.run calls it: flags parsed from `args`, run folders left in argv."""
    try:
        return plot.main(plot.FLAGS(["plot.py", *args]))
    finally:
        plot.FLAGS.unparse_flags()


def read_png(path) -> np.ndarray:
    image = cv2.imread(str(path))
    assert image is not None, f"{path} is not an image"
    return image


def colours(image: np.ndarray) -> set[tuple[int, int, int]]:
    return set(map(tuple, image.reshape(-1, 3).tolist()))


def bgr(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (5, 3, 1))


def test_two_runs_on_one_figure(tmp_path):
    write_run(tmp_path / "pong-a", episodes=120)
    write_run(tmp_path / "pong-b", episodes=80, frames_per_episode=400_000)
    out = tmp_path / "figures" / "pong.png"
    out.parent.mkdir()

    result = run_cli(
        str(tmp_path / "pong-a"), str(tmp_path / "pong-b"), f"--out={out}", "--title=Pong"
    )

    assert result.returncode == 0, result.stderr
    a, b = result.stdout.splitlines()
    assert a.startswith("pong-a: 120 episodes, 30,000,000 frames, smoothed return ")
    assert a.endswith(f" (last 20 episodes) -> {out}")
    assert b.startswith("pong-b: 80 episodes, 32,000,000 frames, smoothed return ")
    image = read_png(out)
    assert image.shape == (495, 1320, 3)  # 12 x 4.5 inches at 110 dpi
    assert len(colours(image)) > 50  # two curves, text and grid, not a blank canvas
    assert {bgr("#1f77b4"), bgr("#ff7f0e")} <= colours(image)  # one colour per run (C0, C1)
    assert os.listdir(out.parent) == ["pong.png"]  # no temporary file left behind


def test_dpi_sets_the_pictures_size_and_refuses_what_no_one_can_draw(tmp_path):
    write_run(tmp_path / "pong", episodes=30)
    out = tmp_path / "small.png"

    result = run_cli(str(tmp_path / "pong"), f"--out={out}", "--dpi=80")

    assert result.returncode == 0, result.stderr
    assert read_png(out).shape == (360, 960, 3)  # 12 x 4.5 inches at 80 dpi
    refused = run_cli(str(tmp_path / "pong"), f"--out={tmp_path / 'x.png'}", "--dpi=601")
    assert refused.returncode != 0 and "--dpi" in refused.stderr, refused.stderr
    for dpi in ("0", "many"):  # the same flag check, in this process
        with pytest.raises(flags.IllegalFlagValueError, match="--dpi"):
            run_main(str(tmp_path / "pong"), f"--out={tmp_path / 'x.png'}", f"--dpi={dpi}")
    assert not (tmp_path / "x.png").exists()


def test_default_out_and_wall_time_fallback(tmp_path, monkeypatch, capsys):
    run = tmp_path / "cartpole"
    run.mkdir()
    write_events(run, steps=[1000, 2000, 3000], returns=[10.0, 30.0, 200.0])
    monkeypatch.chdir(tmp_path)

    assert run_main(str(run), "--smooth=1") == 0

    assert capsys.readouterr().out == (
        "cartpole: 3 episodes, 3,000 frames, smoothed return 200.0 (last 1 episodes), hours "
        "from wall time (no time/training_secs yet) -> curves.png\n"
    )
    assert read_png(tmp_path / "curves.png").shape == (495, 1320, 3)


def test_resumed_run_drops_what_the_stopped_learner_wrote_past_its_checkpoint(tmp_path):
    # The first start reports episodes up to 10k frames, but its last checkpoint was at 6k; the
    # second start resumes there (training time 6 s then), and its file sorts first by name.
    first = write_events(
        tmp_path, [2000, 4000, 6000, 8000, 10000], returns=[1.0] * 5, training_secs=[2, 4, 6, 8, 10]
    )
    second = write_events(
        tmp_path, [7000, 9000], returns=[2.0] * 2, training_secs=[7, 9], resume_at=(6000, 6.0)
    )
    os.rename(second, os.path.join(tmp_path, "events.out.tfevents.0.resumed"))
    assert events.event_files(str(tmp_path))[1] == first

    scalars = events.read_scalars(str(tmp_path))

    steps, values = scalars["episode/return"]
    np.testing.assert_array_equal(steps, [2000, 4000, 7000, 9000])
    np.testing.assert_array_equal(values, [1.0, 1.0, 2.0, 2.0])
    steps, values = scalars["time/training_secs"]
    np.testing.assert_array_equal(steps, [2000, 4000, 6000, 7000, 9000])
    np.testing.assert_array_equal(values, [2, 4, 6, 7, 9])
    assert steps.dtype == np.int64 and values.dtype == np.float64
    assert set(scalars) == {
        "episode/return",
        "episode/length_frames",
        "loss/total",
        "time/training_secs",
    }


def test_truncated_last_record_keeps_what_was_read(tmp_path):
    path = write_run(tmp_path / "complete", episodes=40)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    with open(path, "rb") as file:
        (crashed / os.path.basename(path)).write_bytes(file.read()[:-7])

    steps, values = events.read_scalars(str(crashed))["episode/return"]
    all_steps, all_values = events.read_scalars(str(tmp_path / "complete"))["episode/return"]

    assert len(steps) >= 39  # at most the last episode is lost with the cut record
    np.testing.assert_array_equal(steps, all_steps[: len(steps)])
    np.testing.assert_array_equal(values, all_values[: len(steps)])
    out = tmp_path / "crashed.png"
    assert run_main(str(crashed), f"--out={out}") == 0
    assert len(colours(read_png(out))) > 50


def test_training_hours_are_training_secs_interpolated_at_each_episode(tmp_path):
    write_events(tmp_path, [5000, 10000], returns=[1.0, 2.0], training_secs=[1800, 3600])
    write_events(tmp_path, [20000], returns=[3.0], training_secs=[7200])

    curve = curves.load_curve(str(tmp_path), "run", window=2)

    np.testing.assert_allclose(curve.hours, [0.5, 1.0, 2.0])
    np.testing.assert_allclose(curve.smoothed, [1.0, 1.5, 2.5])
    assert curve.frames_reached == 20000 and not curve.hours_from_wall_time


def test_moving_mean_by_hand():
    values = np.array([1.0, 2.0, 3.0, 6.0])
    np.testing.assert_allclose(curves.moving_mean(values, 2), [1.0, 1.5, 2.5, 4.5])
    np.testing.assert_allclose(curves.moving_mean(values, 1), values)
    np.testing.assert_allclose(curves.moving_mean(values, 20), [1.0, 1.5, 2.0, 3.0])


def test_runs_sharing_a_folder_name_are_told_apart():
    assert curves.run_names(["runs/a/", "b"]) == ["a", "b"]
    assert curves.run_names(["x/pong", "y/pong"]) == ["x/pong", "y/pong"]


def test_missing_folder_from_the_command_line(tmp_path):
    result = run_cli(str(tmp_path / "nope"), f"--out={tmp_path / 'c.png'}", module=True)

    assert result.returncode == 2
    assert result.stderr.strip() == f"plot.py: error: run folder {tmp_path / 'nope'} does not exist"
    assert not os.listdir(tmp_path)


def _no_events(folder):
    (folder / "learner_0.json").write_text("{}")


def _no_episodes(folder):
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        tf.summary.scalar("time/training_secs", 5.0, step=4000)
        tf.summary.scalar("loss/total", 0.5, step=4000)
    writer.close()


@pytest.mark.parametrize(
    "make_run, message",
    [
        (_no_events, "no TensorBoard events in {run}: is it a run folder? (runs/<name>)"),
        (_no_episodes, "no finished episodes in {run} yet"),
    ],
)
def test_nothing_to_plot_is_one_line_and_no_png(tmp_path, capsys, make_run, message):
    good, run = tmp_path / "good", tmp_path / "run"
    write_run(good, episodes=4)
    run.mkdir()
    make_run(run)
    out = tmp_path / "curves.png"

    assert run_main(str(good), str(run), f"--out={out}") == 2

    assert capsys.readouterr().err == f"plot.py: error: {message.format(run=run)}\n"
    assert sorted(os.listdir(tmp_path)) == ["good", "run"]


def test_unwritable_out_is_one_line_and_no_png(tmp_path, capsys):
    write_run(tmp_path / "run", episodes=4)
    out = tmp_path / "missing" / "curves.png"

    assert run_main(str(tmp_path / "run"), f"--out={out}") == 2
    assert capsys.readouterr().err == (
        f"plot.py: error: cannot write --out={out}: folder {out.parent} does not exist\n"
    )

    assert run_main(str(tmp_path / "run"), f"--out={tmp_path}") == 2
    assert "it is a folder" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    write_run(tmp_path / "run", episodes=4)

    def fail(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(curves.CurveError, match="No space left on device"):
        plot.plot_runs([str(tmp_path / "run")], str(tmp_path / "curves.png"))
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_window_frames_prints_the_mean_return_of_the_games_ending_in_each_window(tmp_path, capsys):
    write_events(
        tmp_path / "pong",
        steps=[100_000, 400_000, 600_000, 900_000, 1_700_000],
        returns=[-21.0, -20.0, -15.0, -10.0, 3.0],
        training_secs=None,
        lengths=[3000, 4000, 6000, 8000, 9500],
    )
    out = tmp_path / "pong.png"
    assert run_main(str(tmp_path / "pong"), f"--out={out}", "--window_frames=5e5") == 0
    totals, windows = capsys.readouterr().out.splitlines()
    assert totals.startswith("pong: 5 episodes, ")
    # No game ended between 1M and 1.5M frames: that window is left out.
    assert windows == (
        "pong: mean return (game length in frames) of the games ending in each 0.5M frames "
        "from 0M: -20.5 (3.5k), 0.5M: -12.5 (7.0k), 1.5M: +3.0 (9.5k)"
    )
    bad = run_cli(str(tmp_path / "pong"), f"--out={out}", "--window_frames=-1")
    assert bad.returncode != 0
    assert "flag --window_frames=-1" in bad.stderr and "Traceback" not in bad.stderr


def test_window_frames_leaves_out_lengths_a_run_did_not_write(tmp_path, capsys):
    write_events(tmp_path / "old", steps=[100_000, 600_000], returns=[-21.0, -19.0], lengths=())
    assert (
        run_main(str(tmp_path / "old"), f"--out={tmp_path / 'old.png'}", "--window_frames=5e5") == 0
    )
    assert capsys.readouterr().out.splitlines()[1] == (
        "old: mean return of the games ending in each 0.5M frames from 0M: -21.0, 0.5M: -19.0"
    )


def test_window_frames_pairs_the_lengths_a_cut_or_resumed_run_wrote_with_their_games(
    tmp_path, capsys
):
    # Killed between a game's return and its length: the last game has no length.
    write_events(
        tmp_path / "cut", [100_000, 600_000, 700_000], [-21.0, -19.0, -17.0], lengths=[3000, 7000]
    )
    assert (
        run_main(str(tmp_path / "cut"), f"--out={tmp_path / 'cut.png'}", "--window_frames=5e5") == 0
    )
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .endswith("from 0M: -21.0 (3.0k), 0.5M: -18.0 (7.0k)")
    )
    # Started by a version that wrote no lengths, resumed by one that does.
    write_events(tmp_path / "resumed", [100_000, 600_000], [-21.0, -19.0], lengths=())
    write_events(
        tmp_path / "resumed",
        [1_100_000, 1_200_000],
        [-5.0, -3.0],
        lengths=[8000, 9000],
        resume_at=(650_000, 60.0),
    )
    assert (
        run_main(
            str(tmp_path / "resumed"), f"--out={tmp_path / 'resumed.png'}", "--window_frames=5e5"
        )
        == 0
    )
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .endswith("from 0M: -21.0 (-), 0.5M: -19.0 (-), 1M: -4.0 (8.5k)")
    )


def test_a_curve_file_holds_the_runs_games_and_plots_beside_a_run_folder(tmp_path, capsys):
    write_run(tmp_path / "pong", episodes=30, starts=[7 + index for index in range(30)])
    curve = curves.load_curve(str(tmp_path / "pong"), "pong", 20)
    np.testing.assert_array_equal(curve.start_frames, 7 + np.arange(30))
    path = tmp_path / "pong-record.csv"
    curve_file.write(curve, str(path))

    lines = path.read_text().splitlines()
    assert lines[0] == "frames,return,length_frames,training_hours,start_frames"
    return_text = np.format_float_positional(curve.returns[0], trim="-")
    assert lines[1] == f"500000,{return_text},3000,{curve.hours[0]:.5f},7"
    assert len(lines) == 31 and sorted(os.listdir(tmp_path)) == ["pong", "pong-record.csv"]
    again = curves.load_curve(str(path), "record", 20)
    np.testing.assert_array_equal(again.frames, curve.frames)
    np.testing.assert_array_equal(again.returns, curve.returns)
    np.testing.assert_array_equal(again.smoothed, curve.smoothed)
    np.testing.assert_array_equal(again.lengths, curve.lengths)
    np.testing.assert_array_equal(again.start_frames, curve.start_frames)
    np.testing.assert_allclose(again.hours, curve.hours, atol=1e-5)
    assert again.frames_reached == curve.frames_reached == 7_500_000

    out = tmp_path / "both.png"
    assert run_main(str(tmp_path / "pong"), str(path), f"--out={out}", "--window_frames=5e6") == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("pong: 30 episodes, 7,500,000 frames, smoothed return ")
    assert printed[1].startswith("pong-record: 30 episodes, 7,500,000 frames, smoothed return ")
    assert printed[2].split("from ")[1] == printed[3].split("from ")[1]  # the same windows
    assert read_png(out).shape == (495, 1320, 3)


def test_a_curve_file_without_lengths_reads_back_without_them(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    write_events(run, steps=[1000, 2000], returns=[-21.0, -20.0], training_secs=[1, 2], lengths=())
    curve_file.write(curves.load_curve(str(run), "old", 20), str(tmp_path / "old.csv"))

    assert (tmp_path / "old.csv").read_text().splitlines()[1:] == [
        "1000,-21,,0.00028,",
        "2000,-20,,0.00056,",
    ]
    again = curves.load_curve(str(tmp_path / "old.csv"), "old", 20)
    assert again.lengths is None and again.start_frames is None


def test_curve_files_written_before_start_frames_were_kept_still_read():
    """The committed curves have four columns; they read as they did, without start frames."""
    path = os.path.join(ROOT, "benchmarks", "curves", "pong-r6cf15-s1.csv")
    with open(path) as f:
        assert f.readline().strip() == "frames,return,length_frames,training_hours"
    curve = curves.load_curve(path, "r6cf15-s1", 100)
    assert curve.start_frames is None and curve.lengths is not None
    assert len(curve.returns) > 1000 and curve.smoothed[-1] > 18


def test_the_window_line_splits_each_window_by_the_start_frames_parity(tmp_path):
    """Games begun on odd frames won, on even ones lost: the windows say so apart. Games
    without a start (before a resumed run's version kept them) are left out of the split."""
    run = tmp_path / "split"
    run.mkdir()
    steps = [100_000, 200_000, 600_000, 700_000, 800_000]
    returns = [-21.0, -20.0, 20.0, -10.0, 18.0]
    write_events(run, steps, returns, training_secs=[1, 2, 3, 4, 5], starts=[])
    curve = curves.load_curve(str(run), "split", 20)
    assert curve.start_frames is None
    assert summary.window_line(curve, 5e5).endswith("0M: -20.5 (3.0k), 0.5M: +9.3 (3.0k)")

    # The first two games without starts, as in a curve file of a run resumed by this version.
    starts = [None, None, 3, 8, 29]
    later = tmp_path / "later.csv"
    later.write_text(
        "frames,return,length_frames,training_hours,start_frames\n"
        + "".join(
            f"{step},{value:g},,0.1,{'' if start is None else start}\n"
            for step, value, start in zip(steps, returns, starts, strict=True)
        )
    )
    curve = curves.load_curve(str(later), "later", 20)
    np.testing.assert_array_equal(curve.start_frames[2:], [3, 8, 29])
    assert np.isnan(curve.start_frames[:2]).all()
    assert summary.window_line(curve, 5e5).endswith(
        "from 0M: -20.5 (odd -, even -), 0.5M: +9.3 (odd +19.0, even -10.0)"
    )


def test_the_learners_summaries_pair_each_game_with_the_frames_it_began_with(tmp_path):
    """`Summaries.episodes` as the learner's loop calls it: games of a family without starts
    (-1) write none, and a curve of such games has none."""
    from impala.learner.summaries import Summaries

    atari = Summaries(str(tmp_path / "atari"))
    atari.episodes(1000, np.array([-21.0, -20.0]), np.array([3000.0, 3100.0]), np.array([5, 12]))
    atari.episodes(2000, np.array([-19.0]), np.array([3200.0]), np.array([0]))
    counter = Summaries(str(tmp_path / "counter"))
    counter.episodes(1000, np.array([3.0, 3.0]), np.array([10.0, 10.0]), np.array([-1, -1]))
    counter.episodes(2000, np.array([3.0]), np.array([10.0]))
    atari.close()
    counter.close()

    curve = curves.load_curve(str(tmp_path / "atari"), "atari", 20)
    np.testing.assert_array_equal(curve.start_frames, [5, 12, 0])
    # TensorBoard draws the two kinds of game apart: each return again under its parity.
    scalars = events.read_scalars(str(tmp_path / "atari"))
    assert scalars["episode/return_odd_start"][1].tolist() == [-21.0]
    assert scalars["episode/return_even_start"][1].tolist() == [-20.0, -19.0]
    assert "episode/return_odd_start" not in events.read_scalars(str(tmp_path / "counter"))
    np.testing.assert_array_equal(curve.lengths, [3000, 3100, 3200])
    curve = curves.load_curve(str(tmp_path / "counter"), "counter", 20)
    assert curve.start_frames is None and len(curve.returns) == 3


def test_the_learners_game_points_are_the_events_tf_summary_scalar_writes(tmp_path):
    """`Summaries.episodes` writes a step's points in one call: the same points (tag, step,
    value and its kind), in the same order, as one tf.summary.scalar a point, a NaN return and a
    game without a start among them; in one event where those were one event a point, which
    TensorBoard and plot.py read the same."""
    from impala.learner.summaries import Summaries

    returns, lengths, starts = [-21.0, np.nan, 3.0], [3000.0, 3100.0, 50.0], [5, 8, -1]
    written = Summaries(str(tmp_path / "learner"))
    written.episodes(1000, np.array(returns), np.array(lengths), np.array(starts))
    written.close()
    writer = tf.summary.create_file_writer(str(tmp_path / "scalar"))
    with writer.as_default(step=1000):
        for episode_return, length, start in zip(returns, lengths, starts, strict=True):
            tf.summary.scalar("episode/return", episode_return)
            tf.summary.scalar("episode/length_frames", length)
            if start >= 0:
                tf.summary.scalar("episode/start_frames", float(start))
                parity = "odd" if start % 2 else "even"
                tf.summary.scalar(f"episode/return_{parity}_start", episode_return)
    writer.close()

    def events(folder):
        (path,) = folder.glob("events.*")
        return [
            [
                (event.step, value.SerializeToString(deterministic=True))
                for value in event.summary.value
            ]
            for event in tf.compat.v1.train.summary_iterator(str(path))
            if event.HasField("summary")
        ]

    expected, written = events(tmp_path / "scalar"), events(tmp_path / "learner")
    assert len(expected) == 10 and len(written) == 1
    assert written[0] == [point for (point,) in expected]


def test_by_parity_draws_the_games_of_each_start_parity_as_a_run(tmp_path, capsys):
    """Odd games won and even ones lost: two curves, each with its own games and moving mean."""
    starts = [7 + index for index in range(30)]  # odd, even, odd, ...
    returns = [20.0 if start % 2 else -20.0 for start in starts]
    write_run(tmp_path / "pong", episodes=30, starts=starts, returns=returns)
    out = tmp_path / "parity.png"

    assert run_main(str(tmp_path / "pong"), f"--out={out}", "--by_parity", "--smooth=5") == 0

    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"pong {parity}: 15 episodes, 7,500,000 frames, smoothed return {mean} (last 5 "
        f"episodes) -> {out}"
        for parity, mean in (("odd", "20.0"), ("even", "-20.0"))
    ]
    assert read_png(out).shape == (495, 1320, 3)
    odd, even = parity.split_by_parity(curves.load_curve(str(tmp_path / "pong"), "pong", 5))
    np.testing.assert_array_equal(odd.start_frames % 2, 1)
    np.testing.assert_array_equal(even.lengths, 3001 + 2 * np.arange(15))  # every other game's


def test_by_parity_refuses_a_run_without_start_frames_in_one_line(tmp_path, capsys):
    write_run(tmp_path / "cartpole", episodes=4)
    out = tmp_path / "parity.png"

    assert run_main(str(tmp_path / "cartpole"), f"--out={out}", "--by_parity") == 2

    assert capsys.readouterr().err == (
        "plot.py: error: cartpole: its games have no start frames (not an Atari run, or trained "
        "before they were kept), so --by_parity cannot split them\n"
    )
    assert not out.exists()


_HEADER = "frames,return,length_frames,training_hours\n"
_HEADER_WITH_STARTS = "frames,return,length_frames,training_hours,start_frames\n"


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "line 1: expected the header frames,return,length_frames,training_hours,start"),
        ("frames,return\n1,2\n", "line 1: expected the header"),
        (_HEADER, "no finished episodes in {path}"),
        (_HEADER + "1000,-21,3000,0.1\n2000,-20,3000\n", "line 3: 3 fields, expected 4"),
        (_HEADER + "1e3,-21,3000,0.1\n", "line 2: frames '1e3' is not an integer"),
        (_HEADER + "-5,-21,3000,0.1\n", "line 2: frames '-5' must be a finite number >= 0"),
        (_HEADER + f"{10**30},-21,3000,0.1\n", f"line 2: frames '{10**30}' must be a finite"),
        (_HEADER + "2000,-21,,0.1\n1000,-20,,0.1\n", "line 3: frames 1000 is before the line"),
        (_HEADER + "1000,nan,3000,0.1\n", "line 2: return 'nan' must be a finite number"),
        (_HEADER + "1000,-21,inf,0.1\n", "line 2: length_frames 'inf' must be a finite number"),
        (_HEADER + "1000,-21,3000,x\n", "line 2: training_hours 'x' is not a number"),
        (_HEADER + "1000,-21,3000,-1\n", "line 2: training_hours '-1' must be a finite number"),
        ("frames,return,length_frames,training_hours\n1000,\xe9,1,1\n", "not ASCII text"),
        (_HEADER_WITH_STARTS + "1000,-21,3000,0.1\n", "line 2: 4 fields, expected 5"),
        (_HEADER_WITH_STARTS + "1000,-21,3000,0.1,x\n", "line 2: start_frames 'x' is not an"),
        (_HEADER_WITH_STARTS + "1000,-21,3000,0.1,1.5\n", "line 2: start_frames '1.5' is not"),
        (_HEADER_WITH_STARTS + "1000,-21,3000,0.1,-1\n", "line 2: start_frames '-1' must be"),
    ],
)
def test_a_bad_curve_file_is_one_line_naming_the_file_and_line(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_bytes(content.encode("latin-1"))
    out = tmp_path / "curves.png"

    assert run_main(str(path), f"--out={out}") == 2

    error = capsys.readouterr().err
    assert error.startswith("plot.py: error: ") and error.count("\n") == 1, error
    assert message.format(path=path) in error
    assert str(path) in error
    assert not out.exists()


def test_a_file_that_is_not_a_curve_file_is_refused(tmp_path, capsys):
    (tmp_path / "curves.png").write_bytes(b"\x89PNG")

    assert run_main(str(tmp_path / "curves.png"), f"--out={tmp_path / 'out.png'}") == 2
    assert capsys.readouterr().err == (
        f"plot.py: error: {tmp_path / 'curves.png'} is a file: give a run folder or a curve "
        "file (*.csv)\n"
    )
    assert run_main(str(tmp_path / "missing.csv"), f"--out={tmp_path / 'out.png'}") == 2
    assert "cannot read curve file" in capsys.readouterr().err


def test_csv_out_writes_one_runs_curve_file_and_refuses_two_runs(tmp_path, capsys):
    write_run(tmp_path / "a", episodes=6)
    write_run(tmp_path / "b", episodes=4)
    out, csv_out = tmp_path / "a.png", tmp_path / "a.csv"

    assert run_main(str(tmp_path / "a"), f"--out={out}", f"--csv_out={csv_out}") == 0

    assert capsys.readouterr().out.splitlines()[-1] == f"a: 6 games -> {csv_out}"
    curve_file.write(curves.load_curve(str(tmp_path / "a"), "a", 20), str(tmp_path / "x.csv"))
    assert csv_out.read_text() == (tmp_path / "x.csv").read_text()

    both = run_main(str(tmp_path / "a"), str(tmp_path / "b"), f"--csv_out={tmp_path / 'c.csv'}")
    assert both == 2
    assert capsys.readouterr().err == (
        f"plot.py: error: --csv_out={tmp_path / 'c.csv'}: give one run, not 2\n"
    )
    missing = tmp_path / "missing" / "a.csv"
    assert run_main(str(tmp_path / "a"), f"--out={out}", f"--csv_out={missing}") == 2
    assert capsys.readouterr().err == (
        f"plot.py: error: cannot write --csv_out={missing}: folder {missing.parent} does not "
        "exist\n"
    )
    assert not (tmp_path / "c.csv").exists()
