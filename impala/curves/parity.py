"""Games by the parity of the frame each began on: a frame skip of 4 keeps a game's parity all
game long, and a Pong policy may win the games of one parity only."""

from __future__ import annotations

import numpy as np

from impala.curves.curve import Curve, CurveError, moving_mean


def parity_masks(start_frames: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """[("odd", mask), ("even", mask)]: which games began on an odd frame and which on an even
    one (a NaN start, a game whose start was not kept, is in neither: NaN % 2 is NaN)."""
    return [(name, start_frames % 2 == parity) for name, parity in (("odd", 1), ("even", 0))]


def by_parity(returns: np.ndarray, start_frames: np.ndarray) -> str:
    """ "odd +19.0, even +1.9": the mean return of the games begun on an odd frame and of
    those begun on an even one ("-" for a kind with no game; NaN starts are left out)."""
    parts = []
    for name, chosen in parity_masks(start_frames):
        parts.append(f"{name} {returns[chosen].mean():+.1f}" if chosen.any() else f"{name} -")
    return ", ".join(parts)


def split_by_parity(curve: Curve) -> list[Curve]:
    """The run's games begun on an odd frame and those begun on an even one, as two curves
    ("<name> odd", "<name> even"; a parity without games is left out). CurveError for a run
    that kept no start frames."""
    if curve.start_frames is None:
        raise CurveError(
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
