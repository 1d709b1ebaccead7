"""One run's learning curve, whatever it was read from (a run folder's event files, a curve file):
the type, the moving mean drawn over it, and the error for what cannot be shown."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np


class CurveError(Exception):
    """Something the user can fix: a wrong folder, a run with nothing to plot yet, a damaged or
    foreign file, a bad --out. The message is one line and names the file or flag."""


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


def moving_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving mean, [N] -> [N]: element i is the mean of values[max(0, i-window+1):i+1]."""
    sums = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def run_names(run_folders: list[str]) -> list[str]:
    """Each run's folder name, or its whole path where two runs share a folder name."""
    names = [
        os.path.basename(os.path.normpath(folder)).removesuffix(".csv") for folder in run_folders
    ]
    return [
        name if names.count(name) == 1 else os.path.normpath(folder)
        for name, folder in zip(names, run_folders, strict=True)
    ]
