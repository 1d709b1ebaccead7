"""Learning curves: one run's finished games against emulator frames and training hours.

  curve.py       the `Curve` type, its moving mean, and `CurveError` (one line, for the user)
  curve_file.py  the curve file (CSV) that outlives a run folder: read and written
  events.py      a run folder's TensorBoard event files, as TensorBoard shows them
  parity.py      games by the parity of the frame they began on
  summary.py     the lines plot.py prints for a run
  drawing.py     the PNG of the curves

`plot.py` is their command line; the learning benchmark (`benchmarks/learning.py`) reads and
writes curves with them too. Nothing here imports TensorFlow until an event file is read.
"""

from __future__ import annotations

from impala.curves import curve_file, events
from impala.curves.curve import Curve, CurveError, moving_mean, run_names

__all__ = ["Curve", "CurveError", "load_curve", "moving_mean", "run_names"]


def load_curve(source: str, name: str, window: int) -> Curve:
    """One run's learning curve, from its run folder or a curve file (`*.csv`), with a moving
    mean over `window` games; CurveError if there is none to show."""
    if source.endswith(".csv"):
        return curve_file.read(source, name, window)
    return events.load_run_folder(source, name, window)
