"""A run folder's TensorBoard event files, read as TensorBoard shows them, and its learning curve.

A resumed run has one event file per learner start; when a later file starts at step s, what
earlier files wrote at steps >= s is dropped (TensorBoard's purge). A file cut short (a learner
that crashed mid-write) or damaged after its first records keeps the events before that point.
A file that is no event file at all (not one record readable, records that are not events)
raises CurveError naming it; a value TensorFlow cannot read as a number is left out.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import stat
from typing import NamedTuple

import numpy as np

from impala.curves.curve import Curve, CurveError, moving_mean

RETURN_TAG = "episode/return"
LENGTH_TAG = "episode/length_frames"  # written beside each return, in the same order
START_TAG = "episode/start_frames"  # likewise, for the games that have a start (Atari's)
TRAINING_SECS_TAG = "time/training_secs"


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


def event_files(run_folder: str) -> list[str]:
    """The TensorBoard event files directly in `run_folder`, by name."""
    return sorted(glob.glob(os.path.join(glob.escape(run_folder), "events.out.tfevents.*")))


def read_scalars(run_folder: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every scalar tag in a run folder's event files, as TensorBoard would show it.

    Args:
      run_folder: the folder holding `events.out.tfevents.*` (`<logdir>/<experiment>`).

    Returns:
      {tag: (steps, values)}: [N] int64 steps and [N] float64 values, sorted by step; {} when
      the folder holds no event files.

    Raises:
      CurveError: one of the files is no event file (see the module's docstring).
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


def load_run_folder(run_folder: str, name: str, window: int) -> Curve:
    """The learning curve of the run whose event files are in `run_folder`; CurveError if there
    is none to show."""
    if os.path.isfile(run_folder):
        raise CurveError(f"{run_folder} is a file: give a run folder or a curve file (*.csv)")
    if not os.path.isdir(run_folder):
        raise CurveError(f"run folder {run_folder} does not exist")
    paths = event_files(run_folder)
    if not paths:
        raise CurveError(
            f"no TensorBoard events in {run_folder}: is it a run folder? (runs/<name>)"
        )
    run = read_run(paths)
    episodes = run.scalars.get(RETURN_TAG)
    if episodes is None or not len(episodes.steps):
        raise CurveError(f"no finished episodes in {run_folder} yet")
    training_secs = run.scalars.get(TRAINING_SECS_TAG)
    has_training_time = training_secs is not None and len(training_secs.steps) > 0
    if has_training_time:
        # Steps are sorted, as np.interp needs.
        seconds = np.interp(episodes.steps, training_secs.steps, training_secs.values)
    else:
        seconds = episodes.wall_times - run.start_wall_time
    return Curve(
        name=name,
        frames=episodes.steps,
        hours=seconds / 3600,
        returns=episodes.values,
        smoothed=moving_mean(episodes.values, window),
        window=window,
        frames_reached=int(max(scalars.steps.max() for scalars in run.scalars.values())),
        hours_from_wall_time=not has_training_time,
        lengths=_paired(run.scalars.get(LENGTH_TAG), episodes.steps),
        start_frames=_paired(run.scalars.get(START_TAG), episodes.steps),
    )


def _read_events(path: str) -> tuple[tuple[float, float], list[_Event]]:
    """One event file: when it was started, and its scalar events.

    When it was started is the wall time of its first event (the file version, in whole seconds),
    then that of its first summary to tell apart files started in the same second (inf if none).
    """
    # TensorFlow takes seconds to import: only done once there are event files to read, so that
    # a mistyped folder or --out is answered at once.
    from google.protobuf import message

    from impala import tensorflow_import

    tf = tensorflow_import.without_keras()

    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as error:
        raise CurveError(f"cannot read event file {path}: {error.strerror or error}") from None
    if not regular:  # a pipe or a device would be read forever
        raise CurveError(f"{path}: not a TensorBoard event file (not a regular file)")
    first_wall_time = first_summary_wall_time = math.inf
    events = []
    records = 0
    try:
        for event in tf.compat.v1.train.summary_iterator(path):
            records += 1
            first_wall_time = min(first_wall_time, event.wall_time)
            if event.summary.value:
                first_summary_wall_time = min(first_summary_wall_time, event.wall_time)
            for value in event.summary.value:
                number = _scalar(value)
                if number is not None:
                    events.append(_Event(value.tag, event.step, event.wall_time, number))
    except tf.errors.DataLossError as error:
        reason = error.message.strip().splitlines()[0] if error.message.strip() else "damaged"
        if not records and "truncated" not in reason:
            # Not one record could be read, and not because the file was cut short.
            raise CurveError(f"{path}: not a TensorBoard event file ({reason})") from None
        # A learner that crashed mid-write leaves a truncated last record: keep what came before.
        logging.info("%s: stopped reading at a damaged record; kept the events before it", path)
    except (tf.errors.NotFoundError, tf.errors.PermissionDeniedError) as error:
        raise CurveError(f"cannot read event file {path}: {_first_line(error)}") from None
    except (message.DecodeError, tf.errors.OpError) as error:
        raise CurveError(
            f"{path}: not a TensorBoard event file (record {records + 1}: {_first_line(error)})"
        ) from None
    return (first_wall_time, first_summary_wall_time), events


def _scalar(value) -> float | None:
    """A summary value as a float if it is a numeric scalar (not an image, histogram or text)."""
    import tensorflow as tf

    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        try:
            array = tf.make_ndarray(value.tensor)
        except (TypeError, ValueError):
            return None  # a tensor TensorFlow cannot read (a dtype or size it does not know)
        if array.size == 1 and array.dtype.kind in "biuf":
            return float(array.reshape(()))
    return None


def _first_line(error: BaseException) -> str:
    message = str(getattr(error, "message", None) or error).strip()
    return message.splitlines()[0] if message else type(error).__name__


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


def _paired(values: Scalars | None, return_steps: np.ndarray) -> np.ndarray | None:
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
