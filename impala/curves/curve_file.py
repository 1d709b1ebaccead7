"""The curve file: one run's finished games as CSV, what outlives its run folder.

`make bench-learning` writes one beside its results (`curve.csv`), `plot.py --csv_out` writes
one for any run, and the ones in `benchmarks/curves/` keep the README's runs. One row per game, in
the order the run reported them:

  frames,return,length_frames,training_hours,start_frames
  94080,-21,3032,0.01846,

A length or start the run did not write is left empty. Files written before games' start frames
were kept have the first four columns only, and are still read. A curve file may come from
anyone: every field is checked, and the first wrong one is named with its file and line.
"""

from __future__ import annotations

import math

import numpy as np

from impala import run_folder
from impala.curves.curve import Curve, CurveError, moving_mean

# A curve file's header: one row per finished game, in the order the run reported them.
COLUMNS = ("frames", "return", "length_frames", "training_hours", "start_frames")
# The header of the curve files written before games' start frames were kept: still read.
COLUMNS_WITHOUT_STARTS = COLUMNS[:4]
MAX_BYTES = 64 << 20  # far above a 200M-frame run's games


def write(curve: Curve, path: str) -> None:
    """Writes `curve`'s games as a curve file (`COLUMNS`, one row per game), whole or not at
    all. A length or start the run did not write is left empty."""
    unknown = np.full(len(curve.returns), np.nan)
    lengths = curve.lengths if curve.lengths is not None else unknown
    starts = curve.start_frames if curve.start_frames is not None else unknown
    rows = [",".join(COLUMNS)]
    for frames, value, length, hours, start in zip(
        curve.frames, curve.returns, lengths, curve.hours, starts, strict=True
    ):
        length_text = "" if np.isnan(length) else f"{int(length)}"
        start_text = "" if np.isnan(start) else f"{int(start)}"
        value_text = np.format_float_positional(value, trim="-")  # exact, "-21" for -21.0
        rows.append(f"{int(frames)},{value_text},{length_text},{float(hours):.5f},{start_text}")
    run_folder.write_text(path, "\n".join(rows) + "\n")


def read(path: str, name: str, window: int) -> Curve:
    """Reads a curve file (`write`), checking every field; the first wrong one raises
    CurveError naming the file and line."""
    lines = _lines(path)
    header = ",".join(COLUMNS)
    columns = {",".join(c): c for c in (COLUMNS, COLUMNS_WITHOUT_STARTS)}.get(
        lines[0].strip() if lines else ""
    )
    if columns is None:
        raise CurveError(f"{path}, line 1: expected the header {header}")
    frames, returns, lengths, hours, starts = [], [], [], [], []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.strip().split(",")
        if fields == [""]:
            continue
        if len(fields) != len(columns):
            raise CurveError(
                f"{path}, line {number}: {len(fields)} fields, expected {len(columns)} "
                f"({','.join(columns)})"
            )
        frame = _field(path, number, "frames", fields[0], integer=True)
        if frames and frame < frames[-1]:
            raise CurveError(f"{path}, line {number}: frames {frame} is before the line above's")
        frames.append(frame)
        returns.append(_field(path, number, "return", fields[1], negative=True))
        lengths.append(_optional(path, number, "length_frames", fields[2]))
        hours.append(_field(path, number, "training_hours", fields[3]))
        start = fields[4] if len(fields) > 4 else ""
        starts.append(_optional(path, number, "start_frames", start, integer=True))
    if not frames:
        raise CurveError(f"no finished episodes in {path}")
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


def _lines(path: str) -> list[str]:
    """The file's lines, if it is ASCII text of a plausible size."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as error:
        raise CurveError(f"cannot read curve file {path}: {error.strerror or error}") from None
    if len(data) > MAX_BYTES:
        raise CurveError(f"{path}: larger than {MAX_BYTES >> 20} MiB: not a curve file")
    try:
        return data.decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise CurveError(f"{path}: not a curve file (not ASCII text)") from None


def _optional(path: str, number: int, column: str, text: str, integer: bool = False) -> float:
    """A field that may be empty (NaN): a length or start the run did not write."""
    text = text.strip()
    return math.nan if not text else _field(path, number, column, text, integer=integer)


def _field(
    path: str, number: int, column: str, text: str, integer: bool = False, negative: bool = False
) -> float:
    """One field of a curve file: a finite number (an integer for `integer`), >= 0 unless
    `negative`, and below 2**53 (what a float holds exactly)."""
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise CurveError(
            f"{path}, line {number}: {column} {text.strip()!r} is not {kind}"
        ) from None
    if not math.isfinite(value) or (value < 0 and not negative) or abs(value) >= 2**53:
        what = "a finite number" if negative else "a finite number >= 0"
        raise CurveError(f"{path}, line {number}: {column} {text.strip()!r} must be {what}")
    return value
