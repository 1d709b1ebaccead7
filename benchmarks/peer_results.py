"""What `benchmarks/peer.py` reads from a Sample Factory 2 run: its log's throughput lines, and its
TensorBoard event files turned into this project's learning curve and figures.

How Sample Factory 2.1.1 counts and reports (read from its source, and seen in its runs here):
- Frames. With its Atari settings (`--summaries_use_frameskip=True`, `--env_frameskip=4`), the
  learner counts each agent step it trains on as 4 environment steps: its "env steps" are
  emulator frames, and so are the step of every summary, the "Total num frames" and "Fps" of its
  log and `--train_for_env_steps` (a budget of 10M stops it after 10M emulator frames, 2.5M agent
  steps). Its log's "Samples" are agent steps (observations) collected since that process began.
- Throughput. Every 5 s its log has `Fps is (10 sec: a, 60 sec: b, 300 sec: c). Total num
  frames: n. ... Samples: m. ...`: frames over the last 10 s, 60 s and 300 s of this process.
- Returns. It keeps the last `--stats_avg` (100) finished episodes of each kind and writes their
  mean, at the frames trained so far, every `--experiment_summaries_interval` seconds (3 for
  Atari), once that many have finished: it never writes single episodes, and (its
  `total_train_seconds` staying 0 in 2.1.1) never a mean over fewer. Two such means:
  `reward/reward`, over its own episodes, which end at each lost life, whose rewards are
  clipped to [-1, 1], and the first of which count only the part of the game played after it
  decorrelated its environments (a run here wrote -1.5 to -12 where the whole games were -20
  and -21); and `policy_stats/avg_RecordEpisodeStatistics_reward`, over whole games with their
  real scores (Gymnasium's RecordEpisodeStatistics sits beneath its life and clip wrappers and
  counts from the game's reset), with `policy_stats/avg_RecordEpisodeStatistics_len` their mean
  length in emulator frames. The second is a 100-game mean as this project's benchmarks define
  it, and the one read here. A resumed run starts its window empty.

So the curve made here has one row per written mean, not per game: `return` is the mean score of
the last 100 games finished when the learner had trained on `frames` frames, `length_frames`
their mean length. Drawn with `plot.py --smooth=1` (it is a mean already).
"""

from __future__ import annotations

import datetime
import glob
import math
import os
import re
from typing import NamedTuple

import numpy as np

from impala import curves
from impala.curves import events

RETURN_TAG = "policy_stats/avg_RecordEpisodeStatistics_reward"
LENGTH_TAG = "policy_stats/avg_RecordEpisodeStatistics_len"
CLIPPED_RETURN_TAG = "reward/reward"  # per life, clipped: not used for the curve
FPS_TAG = "perf/_fps"  # the log's 10-s figure, written with each summary: its steps and times
FPS_WINDOW_SECS = 60  # the log's figure that is reported


def row_meaning(games: int) -> str:
    """What a row of the curve made here is, for peer.json."""
    return (
        f"one row per mean Sample Factory wrote, not per game: return is the mean score of the "
        f"last {games} whole games finished when its learner had trained on `frames` emulator "
        f"frames ({RETURN_TAG}), length_frames their mean length in emulator frames; "
        f"training_hours leaves out the time between its starts"
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\s*\d+\]")
_FPS = re.compile(
    r"Fps is \(10 sec: (?P<fps10>[-+.\w]+), 60 sec: (?P<fps60>[-+.\w]+), "
    r"300 sec: (?P<fps300>[-+.\w]+)\)\. Total num frames: (?P<frames>\d+)\..*?"
    r"Samples: (?P<samples>\d+)\."
)


class FpsLine(NamedTuple):
    """One of Sample Factory's throughput lines.

    Attributes:
      seconds: when it was written, in seconds after the log's first timestamped line.
      fps_10, fps_60, fps_300: emulator frames/s over the last 10, 60 and 300 s (NaN before
        that process had two reports).
      frames: emulator frames the learner had trained on (the whole run's, after a resume).
      samples: agent steps collected since this process began.
    """

    seconds: float
    fps_10: float
    fps_60: float
    fps_300: float
    frames: int
    samples: int


class Throughput(NamedTuple):
    """The steady throughput read off a log (`steady_throughput`).

    Attributes:
      frames_per_second: Sample Factory's 60-s figure on the line chosen.
      window: (start, end) of the 60 s it covers, in seconds after the log began.
      frames: the frames trained by then.
      samples: the agent steps collected by then.
      lines: the throughput lines the log held.
      last_seconds: when the last throughput line was written, after the log began.
    """

    frames_per_second: float
    window: tuple[float, float]
    frames: int
    samples: int
    lines: int
    last_seconds: float


class PeerError(Exception):
    """Something the run did not give: the message is one line and names the file."""


def _time(line: str) -> datetime.datetime | None:
    match = _TIME.match(line)
    if match is None:
        return None
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def fps_lines(text: str) -> list[FpsLine]:
    """Sample Factory's throughput lines in a log (its standard output or `sf_log.txt`), with
    their times after the log's first timestamped line (its start-up)."""
    start = None
    found = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        when = _time(line)
        if when is None:
            continue
        start = start or when
        match = _FPS.search(line)
        if match is None:
            continue
        found.append(
            FpsLine(
                seconds=(when - start).total_seconds(),
                fps_10=_number(match["fps10"]),
                fps_60=_number(match["fps60"]),
                fps_300=_number(match["fps300"]),
                frames=int(match["frames"]),
                samples=int(match["samples"]),
            )
        )
    return found


def steady_throughput(text: str, skip_seconds: float, path: str) -> Throughput:
    """The last 60-s figure of the log whose 60 s all come after its first `skip_seconds`
    (start-up and warm-up); PeerError naming `path` if it has none."""
    lines = fps_lines(text)
    if not lines:
        raise PeerError(f"{path}: no throughput lines (Fps is ...): see the log")
    needed = skip_seconds + FPS_WINDOW_SECS
    steady = [line for line in lines if line.seconds >= needed and math.isfinite(line.fps_60)]
    if not steady:
        raise PeerError(
            f"{path}: the last throughput line came {lines[-1].seconds:.0f} s after the start; "
            f"skipping {skip_seconds:g} s, a 60-s figure needs one at {needed:g} s or later: "
            f"run longer (--seconds)"
        )
    last = steady[-1]
    return Throughput(
        frames_per_second=last.fps_60,
        window=(last.seconds - FPS_WINDOW_SECS, last.seconds),
        frames=last.frames,
        samples=last.samples,
        lines=len(lines),
        last_seconds=lines[-1].seconds,
    )


def summary_files(experiment_dir: str) -> list[str]:
    """The event files of policy 0 in a Sample Factory experiment folder (one per start)."""
    folder = os.path.join(experiment_dir, ".summary", "0")
    return sorted(glob.glob(os.path.join(glob.escape(folder), "events.out.tfevents.*")))


def training_seconds(spans: list[tuple[float, float]], wall_times: np.ndarray) -> np.ndarray:
    """Seconds of training at each of `wall_times` (seconds since the epoch), leaving out the
    time between a run's starts: the sum over `spans`, each start's (first, last) event time, of
    the part of it before that moment. [N] -> [N]."""
    seconds = np.zeros(len(wall_times))
    for first, last in spans:
        seconds += np.clip(wall_times - first, 0.0, max(last - first, 0.0))
    return seconds


class PeerRun(NamedTuple):
    """What a Sample Factory run's event files hold (`load_run`).

    Attributes:
      curve: its learning curve, one row per mean written (see the module's docstring).
      scalars: every scalar tag, as TensorBoard shows them (what a resumed run wrote again
        replaces what it wrote before).
      spans: each start's (first, last) event time, seconds since the epoch.
    """

    curve: curves.Curve
    scalars: dict[str, events.Scalars]
    spans: list[tuple[float, float]]


def load_run(experiment_dir: str, name: str, games_per_mean: int, frame_factor: int = 1) -> PeerRun:
    """Reads a Sample Factory experiment folder's event files: its learning curve, frames in
    emulator frames (its steps times `frame_factor`, 1 when it counted frames already), hours
    of training (the time between its starts left out).

    Raises:
      PeerError: no event files, a damaged one, or no means written yet.
    """
    paths = summary_files(experiment_dir)
    if not paths:
        raise PeerError(f"no TensorBoard events in {experiment_dir}/.summary/0: has it started?")
    try:
        run = events.read_run(paths)
        spans = [span for path in paths if (span := _span(events.read_run([path])))]
    except curves.CurveError as error:
        raise PeerError(str(error)) from None
    means = run.scalars.get(RETURN_TAG)
    if means is None or not len(means.steps):
        raise PeerError(
            f"no {games_per_mean}-game means in {experiment_dir} yet ({RETURN_TAG}): Sample "
            f"Factory writes one once {games_per_mean} games have finished"
        )
    lengths = run.scalars.get(LENGTH_TAG)
    # Written in the same summary as each mean, so at the same steps.
    paired = lengths is not None and np.array_equal(lengths.steps, means.steps)
    reached = max(int(s.steps.max()) for s in run.scalars.values() if len(s.steps))
    curve = curves.Curve(
        name=name,
        frames=means.steps * frame_factor,
        hours=training_seconds(spans, means.wall_times) / 3600,
        returns=means.values,
        smoothed=means.values,  # each is a mean over `games_per_mean` games already
        window=games_per_mean,
        frames_reached=reached * frame_factor,
        hours_from_wall_time=False,
        lengths=lengths.values if paired else None,
        start_frames=None,
    )
    return PeerRun(curve, run.scalars, spans)


def _span(run: events.Run) -> tuple[float, float] | None:
    """An event file's (first, last) event time: one start of the run; None if it is empty."""
    times = [float(s.wall_times.max()) for s in run.scalars.values() if len(s.steps)]
    if not times or not math.isfinite(run.start_wall_time):
        return None
    return run.start_wall_time, max(times)


def hours_to_reach(curve: curves.Curve, threshold: float) -> float | None:
    """Training hours at the row where the mean first reached `threshold` (the row whose
    frames `learning_figures.first_crossing` gives), None if it never did."""
    reached = np.flatnonzero(curve.smoothed >= threshold)
    return round(float(curve.hours[reached[0]]), 3) if len(reached) else None


def steady_frames_per_second(run: PeerRun, skip_seconds: float = 60) -> float | None:
    """Frames trained per second of training after the first `skip_seconds` of each start
    (start-up, warm-up), from the steps and times of the summaries written with each 10-s
    figure; None if no start lasted long enough to tell."""
    fps = run.scalars.get(FPS_TAG)
    if fps is None:
        return None
    frames = seconds = 0.0
    for first, last in run.spans:
        inside = (fps.wall_times >= first + skip_seconds) & (fps.wall_times <= last)
        steps, times = fps.steps[inside], fps.wall_times[inside]
        if len(steps) > 1 and times[-1] > times[0]:
            frames += float(steps[-1] - steps[0])
            seconds += float(times[-1] - times[0])
    return frames / seconds if seconds > 0 else None


def figures(run: PeerRun, thresholds: tuple[float, ...], frame_factor: int = 1) -> dict:
    """The run's headline figures, as `benchmarks/learning.py` defines them: the frames (and
    training hours) at which the 100-game mean first reached each threshold, the final and best
    such mean, and frames/s."""
    from benchmarks import learning_figures  # TensorFlow's summaries: only when reporting

    curve = run.curve
    training_secs = sum(last - first for first, last in run.spans)
    steady = steady_frames_per_second(run)
    return {
        "frames": int(curve.frames_reached),
        "rows": len(curve.returns),
        "games_per_mean": curve.window,
        "final_mean_return": round(float(curve.smoothed[-1]), 2),
        "best_mean_return": round(float(np.max(curve.smoothed)), 2),
        "frames_to_reach": {
            f"{t:g}": learning_figures.first_crossing(curve.frames, curve.smoothed, t)
            for t in thresholds
        },
        "hours_to_reach": {f"{t:g}": hours_to_reach(curve, t) for t in thresholds},
        "training_hours": round(training_secs / 3600, 3),
        # After the first minute of each start; and over all training time, start-ups included.
        "frames_per_second_steady": None if steady is None else round(steady * frame_factor, 1),
        "frames_per_second_overall": round(curve.frames_reached / training_secs, 1)
        if training_secs > 0
        else None,
    }
