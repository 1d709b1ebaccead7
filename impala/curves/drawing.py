"""Learning curves drawn into a PNG: return against emulator frames and against training hours,
written whole or not at all."""

from __future__ import annotations

import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from impala import run_folder
from impala.curves.curve import Curve, CurveError

# Pixels per inch of the 12 x 4.5 inch figure: 1320 x 495 pixels by default.
DEFAULT_DPI = 110


def draw(curves: list[Curve], title: str = "", dpi: int = DEFAULT_DPI) -> Figure:
    """Two panels side by side: return against emulator frames, and against training hours."""
    figure = Figure(figsize=(12, 4.5), dpi=dpi, layout="constrained")
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
    """Raises CurveError early if `out` cannot be written, before runs are read."""
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise CurveError(f"cannot write {flag}={out}: folder {folder} does not exist")
    if os.path.isdir(out):
        raise CurveError(
            f"cannot write {flag}={out}: it is a folder; name a file such as {example}"
        )
    if not os.access(folder, os.W_OK):
        raise CurveError(f"cannot write {flag}={out}: folder {folder} is not writable")


def write_png(figure: Figure, out: str) -> None:
    """Writes `figure` to `out` whole or not at all (`run_folder.replacing`)."""
    try:
        with run_folder.replacing(os.path.abspath(out), binary=True) as file:
            figure.savefig(file, format="png")
    except OSError as error:
        raise CurveError(f"cannot write --out={out}: {error.strerror or error}") from None
