"""Learning curves: episode return against emulator frames and against training hours.

  python plot.py runs/PongNoFrameskip-v4-20261122-101500 --out pong.png
  python plot.py runs/pong-a runs/pong-b --smooth=50 --title="Pong, 2 seeds"
  python plot.py runs/pong-c benchmarks/curves/pong-b4-s0.csv --window_frames=5e5
  python plot.py runs/pong-d --by_parity     # its games begun on odd and on even frames apart

Reads the TensorBoard event files the learner writes into a run folder, or a curve file (the
`curve.csv` `make bench-learning` writes beside its results, one row per game: what outlives
the run folder, as the ones in `benchmarks/curves/` do), and draws one PNG with two
panels: `episode/return` against the run's emulator frames, and against its training hours
(`time/training_secs`, which leaves out the time a run was stopped). Each run gets one colour: its
per-episode returns faintly, their moving mean clearly on top. A run that was stopped and resumed
is read like TensorBoard reads it: what the stopped learner wrote past the checkpoint the run
resumed from is dropped.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import sys
import tempfile
from typing import NamedTuple

# TensorFlow's C++ start-up notices (oneDNN, CPU features) are noise for users; errors still show.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from absl import app, flags
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from impala import run_folder

FLAGS = flags.FLAGS

flags.DEFINE_string("out", "curves.png", "Where the PNG goes.")
flags.DEFINE_integer(
    "smooth", 20, "Episodes in the moving mean drawn over the raw returns (1: none).", lower_bound=1
)
flags.DEFINE_string("title", "", "Title above both panels (default: none).")
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

RETURN_TAG = "episode/return"
LENGTH_TAG = "episode/length_frames"  # written beside each return, in the same order
START_TAG = "episode/start_frames"  # likewise, for the games that have a start (Atari's)
TRAINING_SECS_TAG = "time/training_secs"
# A curve file's header: one row per finished game, in the order the run reported them.
CURVE_COLUMNS = ("frames", "return", "length_frames", "training_hours", "start_frames")
# The header of the curve files written before games' start frames were kept: still read.
_CURVE_COLUMNS_WITHOUT_STARTS = CURVE_COLUMNS[:4]
_MAX_CURVE_BYTES = 64 << 20  # far above a 200M-frame run's games


class PlotError(Exception):
    """Something the user can fix: a wrong folder, a run with nothing to plot yet, a bad --out."""


class Scalars(NamedTuple):
    """One tag's scalar events, sorted by step (events of one step in the order written).

    Attributes:
      steps: [N] int64, the step each value was written at (emulator frames for the learner).
      values: [N] float64.
      wall_times: [N] float64, seconds since the epoch when each value was written.
    """

    steps: np.ndarray
    values: np.ndarray
    wall_times: np.ndarray


class _Event(NamedTuple):
    tag: str
    step: int
    wall_time: float
    value: float


class Run(NamedTuple):
    """What a run folder's event files hold, after dropping what a resumed run overwrote.

    Attributes:
      scalars: each tag's scalar events.
      start_wall_time: wall time of the run's first event (seconds since the epoch).
    """

    scalars: dict[str, Scalars]
    start_wall_time: float


class Curve(NamedTuple):
    """One run's learning curve, one entry per finished episode.

    Attributes:
      name: the run's name in the legend.
      frames: [N] emulator frames of the run when each episode was reported.
      hours: [N] training hours then.
      returns: [N] episode returns (real game scores).
      smoothed: [N] moving mean of `returns`.
      window: episodes in the moving mean.
      frames_reached: the largest step the run wrote anything at.
      hours_from_wall_time: True when the run has no training time yet, so that `hours` is wall
        time since its first event (including any time it was stopped).
      lengths: [N] each episode's length in emulator frames (NaN where the run wrote none), or
        None for a run that wrote no lengths (or ones that cannot be paired with its returns).
      start_frames: [N] the frames each game began with (Atari's no-ops and FIRE; NaN where
        the run wrote none), or None, as `lengths`. A frame skip of k keeps a game at its start
        frame modulo k, and returns grouped by it show a policy that wins one kind of game only.
    """

    name: str
    frames: np.ndarray
    hours: np.ndarray
    returns: np.ndarray
    smoothed: np.ndarray
    window: int
    frames_reached: int
    hours_from_wall_time: bool
    lengths: np.ndarray | None = None
    start_frames: np.ndarray | None = None


def event_files(run_folder: str) -> list[str]:
    """The TensorBoard event files directly in `run_folder`, by name."""
    return sorted(glob.glob(os.path.join(glob.escape(run_folder), "events.out.tfevents.*")))


def read_scalars(run_folder: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every scalar tag in a run folder's event files, as TensorBoard would show it.

    A resumed run has one event file per learner start; when a later file starts at step s,
    what earlier files wrote at steps >= s is dropped (TensorBoard's purge). A truncated last
    record (a crash mid-write) ends that file's events without an error.

    Args:
      run_folder: the folder holding `events.out.tfevents.*` (`<logdir>/<experiment>`).

    Returns:
      {tag: (steps, values)}: [N] int64 steps and [N] float64 values, sorted by step; {} when
      the folder holds no event files.
    """
    return {
        tag: (scalars.steps, scalars.values)
        for tag, scalars in read_run(event_files(run_folder)).scalars.items()
    }


def read_run(paths: list[str]) -> Run:
    """Reads a run's event files (see `read_scalars`), keeping wall times."""
    files = sorted((_read_events(path) for path in paths), key=lambda file: file[0])
    events: list[_Event] = []
    for _, file_events in files:
        if file_events:
            start = min(event.step for event in file_events)
            events = [event for event in events if event.step < start]
            events.extend(file_events)
    start_wall_time = files[0][0][0] if files else math.inf
    return Run(_group_by_tag(events), start_wall_time)


def _read_events(path: str) -> tuple[tuple[float, float], list[_Event]]:
    """One event file: when it was started, and its scalar events.

    When it was started is the wall time of its first event (the file version, in whole seconds),
    then that of its first summary to tell apart files started in the same second (inf if none).
    """
    # TensorFlow takes seconds to import: only done once there are event files to read, so that
    # a mistyped folder or --out is answered at once.
    import tensorflow as tf

    first_wall_time = first_summary_wall_time = math.inf
    events = []
    try:
        for event in tf.compat.v1.train.summary_iterator(path):
            first_wall_time = min(first_wall_time, event.wall_time)
            if event.summary.value:
                first_summary_wall_time = min(first_summary_wall_time, event.wall_time)
            for value in event.summary.value:
                number = _scalar(value)
                if number is not None:
                    events.append(_Event(value.tag, event.step, event.wall_time, number))
    except tf.errors.DataLossError:
        # A learner that crashed mid-write leaves a truncated last record: keep what came before.
        logging.info("%s: stopped reading at a damaged record; kept the events before it", path)
    return (first_wall_time, first_summary_wall_time), events


def _scalar(value) -> float | None:
    """A summary value as a float if it is a numeric scalar (not an image, histogram or text)."""
    import tensorflow as tf

    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        array = tf.make_ndarray(value.tensor)
        if array.size == 1 and array.dtype.kind in "biuf":
            return float(array.reshape(()))
    return None


def _group_by_tag(events: list[_Event]) -> dict[str, Scalars]:
    by_tag: dict[str, list[_Event]] = {}
    for event in events:
        by_tag.setdefault(event.tag, []).append(event)
    grouped = {}
    for tag, tag_events in by_tag.items():
        steps = np.array([event.step for event in tag_events], dtype=np.int64)
        order = np.argsort(steps, kind="stable")
        grouped[tag] = Scalars(
            steps=steps[order],
            values=np.array([event.value for event in tag_events], dtype=np.float64)[order],
            wall_times=np.array([event.wall_time for event in tag_events])[order],
        )
    return grouped


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving mean, [N] -> [N]: element i is the mean of values[max(0, i-window+1):i+1]."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def load_curve(run_folder: str, name: str, window: int) -> Curve:
    """Reads one run's learning curve, from its run folder or a curve file (`*.csv`), raising
    PlotError if there is none to show."""
    if run_folder.endswith(".csv"):
        return read_curve_csv(run_folder, name, window)
    if os.path.isfile(run_folder):
        raise PlotError(f"{run_folder} is a file: give a run folder or a curve file (*.csv)")
    if not os.path.isdir(run_folder):
        raise PlotError(f"run folder {run_folder} does not exist")
    paths = event_files(run_folder)
    if not paths:
        raise PlotError(f"no TensorBoard events in {run_folder}: is it a run folder? (runs/<name>)")
    run = read_run(paths)
    episodes = run.scalars.get(RETURN_TAG)
    if episodes is None or not len(episodes.steps):
        raise PlotError(f"no finished episodes in {run_folder} yet")
    training_secs = run.scalars.get(TRAINING_SECS_TAG)
    has_training_time = training_secs is not None and len(training_secs.steps) > 0
    if has_training_time:
        # Steps are sorted, as np.interp needs.
        seconds = np.interp(episodes.steps, training_secs.steps, training_secs.values)
    else:
        seconds = episodes.wall_times - run.start_wall_time
    lengths = _paired(run.scalars.get(LENGTH_TAG), episodes.steps)
    start_frames = _paired(run.scalars.get(START_TAG), episodes.steps)
    return Curve(
        name=name,
        frames=episodes.steps,
        hours=seconds / 3600,
        returns=episodes.values,
        smoothed=moving_mean(episodes.values, window),
        window=window,
        frames_reached=int(max(scalars.steps.max() for scalars in run.scalars.values())),
        hours_from_wall_time=not has_training_time,
        lengths=lengths,
        start_frames=start_frames,
    )


def _paired(values, return_steps: np.ndarray) -> np.ndarray | None:
    """Each episode's value of a tag written beside its return (its length, or its start
    frames), NaN where the run wrote none, or None if it wrote none at all.

    Both tags are sorted stably by step, so one per episode pairs each value with its return.
    Values may cover only the first episodes (a learner killed between an episode's records)
    or the last ones (a run resumed by a version that writes them); otherwise they cannot be
    paired and none are used.
    """
    if values is None or not len(values.steps):
        return None
    paired = np.full(len(return_steps), np.nan)
    count = min(len(values.steps), len(return_steps))
    if np.array_equal(values.steps[:count], return_steps[:count]):
        paired[:count] = values.values[:count]
    elif np.array_equal(values.steps[-count:], return_steps[-count:]):
        paired[-count:] = values.values[-count:]
    else:
        return None
    return paired


def write_curve_csv(curve: Curve, path: str) -> None:
    """Writes `curve`'s games as a curve file (`CURVE_COLUMNS`, one row per game), whole or not
    at all. A length or start the run did not write is left empty."""
    unknown = np.full(len(curve.returns), np.nan)
    lengths = curve.lengths if curve.lengths is not None else unknown
    starts = curve.start_frames if curve.start_frames is not None else unknown
    rows = [",".join(CURVE_COLUMNS)]
    for frames, value, length, hours, start in zip(
        curve.frames, curve.returns, lengths, curve.hours, starts, strict=True
    ):
        length_text = "" if np.isnan(length) else f"{int(length)}"
        start_text = "" if np.isnan(start) else f"{int(start)}"
        value_text = np.format_float_positional(value, trim="-")  # exact, "-21" for -21.0
        rows.append(f"{int(frames)},{value_text},{length_text},{float(hours):.5f},{start_text}")
    run_folder.write_text(path, "\n".join(rows) + "\n")


def read_curve_csv(path: str, name: str, window: int) -> Curve:
    """Reads a curve file (`write_curve_csv`), which may come from anyone: every field is
    checked, and the first wrong one raises PlotError naming the file and line."""
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_CURVE_BYTES + 1)
    except OSError as error:
        raise PlotError(f"cannot read curve file {path}: {error.strerror or error}") from None
    if len(data) > _MAX_CURVE_BYTES:
        raise PlotError(f"{path}: larger than {_MAX_CURVE_BYTES >> 20} MiB: not a curve file")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise PlotError(f"{path}: not a curve file (not ASCII text)") from None
    lines = text.splitlines()
    header = ",".join(CURVE_COLUMNS)
    columns = {",".join(c): c for c in (CURVE_COLUMNS, _CURVE_COLUMNS_WITHOUT_STARTS)}.get(
        lines[0].strip() if lines else ""
    )
    if columns is None:
        raise PlotError(f"{path}, line 1: expected the header {header}")
    frames, returns, lengths, hours, starts = [], [], [], [], []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.strip().split(",")
        if fields == [""]:
            continue
        if len(fields) != len(columns):
            raise PlotError(
                f"{path}, line {number}: {len(fields)} fields, expected {len(columns)} "
                f"({','.join(columns)})"
            )
        frame = _curve_field(path, number, "frames", fields[0], integer=True)
        if frames and frame < frames[-1]:
            raise PlotError(f"{path}, line {number}: frames {frame} is before the line above's")
        frames.append(frame)
        returns.append(_curve_field(path, number, "return", fields[1], negative=True))
        length = fields[2].strip()
        lengths.append(
            math.nan if not length else _curve_field(path, number, "length_frames", length)
        )
        hours.append(_curve_field(path, number, "training_hours", fields[3]))
        start = fields[4].strip() if len(fields) > 4 else ""
        starts.append(
            math.nan
            if not start
            else _curve_field(path, number, "start_frames", start, integer=True)
        )
    if not frames:
        raise PlotError(f"no finished episodes in {path}")
    returns_array = np.asarray(returns, dtype=np.float64)
    lengths_array = np.asarray(lengths, dtype=np.float64)
    starts_array = np.asarray(starts, dtype=np.float64)
    return Curve(
        name=name,
        frames=np.asarray(frames, dtype=np.int64),
        hours=np.asarray(hours, dtype=np.float64),
        returns=returns_array,
        smoothed=moving_mean(returns_array, window),
        window=window,
        frames_reached=frames[-1],  # the last game's: a curve file keeps games only
        hours_from_wall_time=False,
        lengths=None if np.isnan(lengths_array).all() else lengths_array,
        start_frames=None if np.isnan(starts_array).all() else starts_array,
    )


def _curve_field(
    path: str, number: int, column: str, text: str, integer: bool = False, negative: bool = False
) -> float:
    """One field of a curve file: a finite number (an integer for `integer`), >= 0 unless
    `negative`, and below 2**53 (what a float holds exactly)."""
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise PlotError(f"{path}, line {number}: {column} {text.strip()!r} is not {kind}") from None
    if not math.isfinite(value) or (value < 0 and not negative) or abs(value) >= 2**53:
        what = "a finite number" if negative else "a finite number >= 0"
        raise PlotError(f"{path}, line {number}: {column} {text.strip()!r} must be {what}")
    return value


def run_names(run_folders: list[str]) -> list[str]:
    """Each run's folder name, or its whole path where two runs share a folder name."""
    names = [
        os.path.basename(os.path.normpath(folder)).removesuffix(".csv") for folder in run_folders
    ]
    return [
        name if names.count(name) == 1 else os.path.normpath(folder)
        for name, folder in zip(names, run_folders, strict=True)
    ]


def draw(curves: list[Curve], title: str = "") -> Figure:
    """Two panels side by side: return against emulator frames, and against training hours."""
    figure = Figure(figsize=(12, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)  # renders with Agg, into a file: no display, no pyplot state
    by_frames, by_hours = figure.subplots(1, 2)
    for index, curve in enumerate(curves):
        color = f"C{index % 10}"
        for axes, x in ((by_frames, curve.frames), (by_hours, curve.hours)):
            # Every run's raw returns under every run's smoothed curve.
            axes.plot(x, curve.returns, color=color, alpha=0.25, linewidth=0.7, zorder=1)
            axes.plot(x, curve.smoothed, color=color, linewidth=1.8, label=curve.name, zorder=3)
    by_frames.xaxis.set_major_formatter(EngFormatter(sep=""))  # 50M, not 5e7
    by_frames.set_xlabel("emulator frames")
    by_hours.set_xlabel("training hours")
    for axes in (by_frames, by_hours):
        axes.set_ylabel("episode return (game score)")
        axes.grid(alpha=0.3)
    by_frames.legend(loc="best", fontsize="small")
    if title:
        figure.suptitle(title)
    return figure


def check_out(out: str, flag: str = "--out", example: str = "curves.png") -> None:
    """Raises PlotError early if `out` cannot be written, before runs are read."""
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise PlotError(f"cannot write {flag}={out}: folder {folder} does not exist")
    if os.path.isdir(out):
        raise PlotError(f"cannot write {flag}={out}: it is a folder; name a file such as {example}")
    if not os.access(folder, os.W_OK):
        raise PlotError(f"cannot write {flag}={out}: folder {folder} is not writable")


def write_png(figure: Figure, out: str) -> None:
    """Writes `figure` to `out` whole or not at all: a temporary file, then a rename."""
    try:
        handle, temporary = tempfile.mkstemp(
            dir=os.path.dirname(os.path.abspath(out)), prefix=".plot-", suffix=".png"
        )
    except OSError as error:
        raise PlotError(f"cannot write --out={out}: {error.strerror}") from None
    try:
        with os.fdopen(handle, "wb") as file:
            figure.savefig(file, format="png")
        # mkstemp makes it private; a plot need not be.
        os.chmod(temporary, 0o666 & ~run_folder.current_umask())
        os.replace(temporary, out)
    except OSError as error:
        raise PlotError(f"cannot write --out={out}: {error.strerror or error}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def summary_line(curve: Curve, out: str) -> str:
    """What the command prints for one run, e.g.

    pong: 1,234 episodes, 50,000,000 frames, smoothed return 18.3 (last 20 episodes) -> curves.png
    """
    window = min(curve.window, len(curve.returns))
    wall_time = ", hours from wall time (no time/training_secs yet)"
    note = wall_time if curve.hours_from_wall_time else ""
    return (
        f"{curve.name}: {len(curve.returns):,} episodes, {curve.frames_reached:,} frames, "
        f"smoothed return {curve.smoothed[-1]:.1f} (last {window} episodes){note} -> {out}"
    )


def window_line(curve: Curve, window_frames: float) -> str:
    """The mean return of the games that ended in each window of `window_frames` frames, and
    their mean length (which grows while a Pong agent learns to return the ball, before its
    score does), e.g.

    pong: mean return (game length in frames) of the games ending in each 0.5M frames from
    0M: -20.5 (3.6k), ..., 9.5M: +17.8 (7.9k)

    and where the run kept its games' start frames, also the games begun on an odd frame and
    on an even one apart: "7M: +10.4 (6.1k; odd +19.0, even +1.9)".
    """
    ends = np.floor(curve.frames / window_frames).astype(np.int64)
    means = []
    for start in np.unique(ends):
        games = ends == start
        mean = f"{start * window_frames / 1e6:g}M: {curve.returns[games].mean():+.1f}"
        details = []
        if curve.lengths is not None:
            known = curve.lengths[games][~np.isnan(curve.lengths[games])]
            details.append(f"{known.mean() / 1e3:.1f}k" if len(known) else "-")
        if curve.start_frames is not None:
            details.append(_by_parity(curve.returns[games], curve.start_frames[games]))
        if details:
            mean += f" ({'; '.join(details)})"
        means.append(mean)
    what = "mean return" if curve.lengths is None else "mean return (game length in frames)"
    return (
        f"{curve.name}: {what} of the games ending in each {window_frames / 1e6:g}M frames "
        f"from {', '.join(means)}"
    )


def parity_masks(start_frames: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """[("odd", mask), ("even", mask)]: which games began on an odd frame and which on an even
    one (a NaN start, a game whose start was not kept, is in neither: NaN % 2 is NaN)."""
    return [(name, start_frames % 2 == parity) for name, parity in (("odd", 1), ("even", 0))]


def _by_parity(returns: np.ndarray, start_frames: np.ndarray) -> str:
    """ "odd +19.0, even +1.9": the mean return of the games begun on an odd frame and of
    those begun on an even one ("-" for a kind with no game; NaN starts are left out)."""
    parts = []
    for name, chosen in parity_masks(start_frames):
        parts.append(f"{name} {returns[chosen].mean():+.1f}" if chosen.any() else f"{name} -")
    return ", ".join(parts)


def split_by_parity(curve: Curve) -> list[Curve]:
    """The run's games begun on an odd frame and those begun on an even one, as two curves
    ("<name> odd", "<name> even"; a parity without games is left out). PlotError for a run
    that kept no start frames."""
    if curve.start_frames is None:
        raise PlotError(
            f"{curve.name}: its games have no start frames (not an Atari run, or trained "
            "before they were kept), so --by_parity cannot split them"
        )
    parts = []
    for name, chosen in parity_masks(curve.start_frames):
        if not chosen.any():
            continue
        returns = curve.returns[chosen]
        lengths = curve.lengths[chosen] if curve.lengths is not None else None
        parts.append(
            curve._replace(
                name=f"{curve.name} {name}",
                frames=curve.frames[chosen],
                hours=curve.hours[chosen],
                returns=returns,
                smoothed=moving_mean(returns, curve.window),
                lengths=lengths,
                start_frames=curve.start_frames[chosen],
            )
        )
    return parts


def plot_runs(
    run_folders: list[str],
    out: str,
    smooth: int = 20,
    title: str = "",
    window_frames: float = 0,
    csv_out: str = "",
    by_parity: bool = False,
) -> list[str]:
    """Draws the runs' learning curves into the PNG `out`, and with `csv_out` writes the one
    run's games as a curve file there. Returns one summary line per run, and with
    `window_frames` one more per run (`window_line`). With `by_parity` each run is drawn and
    summed up as two, its games begun on odd frames and on even ones (`split_by_parity`); the
    curve file still holds all its games."""
    if smooth < 1:
        raise PlotError(f"--smooth={smooth}: must be >= 1 (1: no smoothing)")
    check_out(out)
    if csv_out:
        if len(run_folders) != 1:
            raise PlotError(f"--csv_out={csv_out}: give one run, not {len(run_folders)}")
        check_out(csv_out, "--csv_out", "curve.csv")
    curves = [
        load_curve(folder, name, smooth)
        for folder, name in zip(run_folders, run_names(run_folders), strict=True)
    ]
    drawn = [part for curve in curves for part in split_by_parity(curve)] if by_parity else curves
    write_png(draw(drawn, title), out)
    lines = [summary_line(curve, out) for curve in drawn]
    if csv_out:
        try:
            write_curve_csv(curves[0], csv_out)
        except OSError as error:
            raise PlotError(f"cannot write --csv_out={csv_out}: {error.strerror}") from None
        lines.append(f"{curves[0].name}: {len(curves[0].returns):,} games -> {csv_out}")
    if window_frames:
        lines += [window_line(curve, window_frames) for curve in drawn]
    return lines


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
        )
    except PlotError as error:
        print(f"plot.py: error: {error}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    app.run(main)
