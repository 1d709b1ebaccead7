"""What plot.py prints for a run: one summary line, and its games' means window by window."""

from __future__ import annotations

import numpy as np

from impala.curves.curve import Curve
from impala.curves.parity import by_parity


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
            details.append(by_parity(curve.returns[games], curve.start_frames[games]))
        if details:
            mean += f" ({'; '.join(details)})"
        means.append(mean)
    what = "mean return" if curve.lengths is None else "mean return (game length in frames)"
    return (
        f"{curve.name}: {what} of the games ending in each {window_frames / 1e6:g}M frames "
        f"from {', '.join(means)}"
    )
