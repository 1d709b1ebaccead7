"""Learning curves: episode return against emulator frames and against training hours.

  python plot.py runs/PongNoFrameskip-v4-20261122-101500 --out pong.png
  python plot.py runs/pong-a runs/pong-b --smooth=50 --title="Pong, 2 seeds"
  python plot.py runs/pong-c benchmarks/curves/pong-b4-s0.csv --window_frames=5e5
  python plot.py runs/pong-d --by_parity     # its games begun on odd and on even frames apart
  python plot.py runs/population             # a run of several policies: one curve each

Reads the TensorBoard event files the learner writes into a run folder, or a curve file (the
`curve.csv` `make bench-learning` writes beside its results, one row per game: what outlives
the run folder, as the ones in `benchmarks/curves/` do), and draws one PNG with two
panels: `episode/return` against the run's emulator frames, and against its training hours
(`time/training_secs`, which leaves out the time a run was stopped). Each run gets one colour: its
per-episode returns faintly, their moving mean clearly on top. A run that was stopped and resumed
is read like TensorBoard reads it: what the stopped learner wrote past the checkpoint the run
resumed from is dropped. The reading, drawing and analysis live in `impala/curves/`.
"""

from __future__ import annotations

import logging
import os
import sys

# TensorFlow's C++ start-up notices (oneDNN, CPU features) are noise for users; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from impala import run_folder
from impala.curves import CurveError, curve_file, drawing, load_curve, parity, run_names, summary

FLAGS = flags.FLAGS

flags.DEFINE_string("out", "curves.png", "Where the PNG goes.")
flags.DEFINE_integer(
    "smooth", 20, "Episodes in the moving mean drawn over the raw returns (1: none).", lower_bound=1
)
flags.DEFINE_string("title", "", "Title above both panels (default: none).")
flags.DEFINE_integer(
    "dpi",
    drawing.DEFAULT_DPI,
    "Resolution of the 12 x 4.5 inch picture in pixels per inch (80: 960 x 360 pixels, a "
    "smaller file).",
    lower_bound=30,
    upper_bound=600,
)
flags.DEFINE_float(
    "window_frames",
    0,
    "Also print each run's mean return and game length over the games that ended in each window "
    "of this many frames, e.g. 5e5 (0: not).",
    lower_bound=0,
)

flags.DEFINE_bool(
    "by_parity",
    False,
    "Draw each run's games begun on an odd frame and those begun on an even one as two runs "
    "(Atari runs that kept their games' start frames). A frame skip of 4 keeps a game's parity "
    "all game long, and a Pong policy may win the games of one parity only.",
)

flags.DEFINE_string(
    "csv_out",
    "",
    "Also write the run's games as a curve file (CSV: frames, return, length, training hours, "
    "start frames) here; one run only.",
)


def plot_runs(
    run_folders: list[str],
    out: str,
    smooth: int = 20,
    title: str = "",
    window_frames: float = 0,
    csv_out: str = "",
    by_parity: bool = False,
    dpi: int = drawing.DEFAULT_DPI,
) -> list[str]:
    """Draws the runs' learning curves into the PNG `out`, and with `csv_out` writes the one
    run's games as a curve file there. Returns one summary line per run, and with
    `window_frames` one more per run (`summary.window_line`). With `by_parity` each run is
    drawn and summed up as two, its games begun on odd frames and on even ones
    (`parity.split_by_parity`); the curve file still holds all its games.

    Raises:
      CurveError: one line naming the run, file or flag that is wrong.
    """
    if smooth < 1:
        raise CurveError(f"--smooth={smooth}: must be >= 1 (1: no smoothing)")
    drawing.check_out(out)
    if csv_out:
        if len(run_folders) != 1:
            raise CurveError(f"--csv_out={csv_out}: give one run, not {len(run_folders)}")
        drawing.check_out(csv_out, "--csv_out", "curve.csv")
    run_folders = with_policies(run_folders)
    curves = [
        load_curve(folder, name, smooth)
        for folder, name in zip(run_folders, run_names(run_folders), strict=True)
    ]
    drawn = [part for c in curves for part in parity.split_by_parity(c)] if by_parity else curves
    drawing.write_png(drawing.draw(drawn, title, dpi), out)
    lines = [summary.summary_line(curve, out) for curve in drawn]
    if csv_out:
        try:
            curve_file.write(curves[0], csv_out)
        except OSError as error:
            raise CurveError(f"cannot write --csv_out={csv_out}: {error.strerror}") from None
        lines.append(f"{curves[0].name}: {len(curves[0].returns):,} games -> {csv_out}")
    if window_frames:
        lines += [summary.window_line(curve, window_frames) for curve in drawn]
    return lines


def with_policies(paths: list[str]) -> list[str]:
    """`paths`, with the folder of a run of several policies (`--num_policies`) in place of its
    policies' folders: each policy is drawn as a run."""
    expanded = []
    for path in paths:
        policies = run_folder.policies_in(path) if os.path.isdir(path) else []
        expanded += [run_folder.policy_path(path, policy) for policy in policies] or [path]
    return expanded


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise app.UsageError(
            "give one or more run folders or curve files, e.g. plot.py runs/<name>", exitcode=2
        )
    # summary_iterator's deprecation notice is noise for users of this command.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        lines = plot_runs(
            argv[1:],
            FLAGS.out,
            FLAGS.smooth,
            FLAGS.title,
            FLAGS.window_frames,
            FLAGS.csv_out,
            FLAGS.by_parity,
            FLAGS.dpi,
        )
    except CurveError as error:
        print(f"plot.py: error: {error}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    app.run(main)
