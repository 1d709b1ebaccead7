"""The learning benchmark's figures: what `benchmarks/learning.py` computes from a trained run
(its learning curve, its learner's summary, its event files, its flags and its checkpoint) and
writes into learning.json, and the lines it prints of them."""

from __future__ import annotations

import datetime
import json
import os
import platform

import numpy as np

from benchmarks import learning_configs
from benchmarks.learning_configs import Benchmark
from impala import curves, run_folder
from impala.curves import events, parity
from impala.envs.config import ATARI_FRAME_SKIP


def first_crossing(frames: np.ndarray, smoothed: np.ndarray, threshold: float) -> int | None:
    """Frames at which the moving mean first reached `threshold`, None if it never did."""
    reached = np.flatnonzero(smoothed >= threshold)
    return int(frames[reached[0]]) if len(reached) else None


def results(
    benchmark: Benchmark,
    curve: curves.Curve,
    run_dir: str,
    wall_secs: float | None,
    argv: list[str],
) -> dict:
    """The benchmark's figures, from the run's learning curve and its learner summary."""
    # Only full windows of games count, so that a lucky first game is not a "best mean".
    first_full = min(curve.window, len(curve.returns)) - 1
    with open(os.path.join(run_dir, "learner_0.json")) as f:
        summary = json.load(f)
    scalars = events.read_scalars(run_dir)  # the event files: read once, for both figures below
    try:
        saved = run_folder.read_flags(run_dir)  # read once, for both figures that need it
    except ValueError:
        saved = None  # an unreadable flags.json: no record of what the run changed
    return {
        "config": curve.name,
        "command": "python -m benchmarks.learning " + " ".join(argv[1:]),
        "flags": list(benchmark.flags),
        # What the run changed from its configuration's set-up, read from the flags it ran with.
        "changed_from_configuration": None
        if saved is None
        else learning_configs.changed_settings(benchmark, saved),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
        "frames": int(summary["frames"]),
        "stopped_early": summary["stopped_early"],
        "games": len(curve.returns),
        "window": first_full + 1,
        "final_mean_return": round(float(curve.smoothed[-1]), 2),
        "best_mean_return": round(float(np.max(curve.smoothed[first_full:])), 2),
        "frames_to_reach": {
            f"{threshold:g}": first_crossing(
                curve.frames[first_full:], curve.smoothed[first_full:], threshold
            )
            for threshold in benchmark.thresholds
        },
        # None when the run took fewer than two steps.
        "frames_per_second_steady": summary["frames_per_second_steady"],
        "frames_per_second_overall": summary["frames"] / wall_secs if wall_secs else None,
        "policy_lag": policy_lag(scalars),
        "policy_entropy": policy_entropy(scalars, saved, run_dir, int(summary["frames"])),
        "by_start_frame": by_start_frame(curve, first_full + 1, saved),
        "wall_minutes": round(wall_secs / 60, 1) if wall_secs is not None else None,
        "training_hours": round(float(curve.hours[-1]), 3),
        "run_dir": run_dir,
    }


def by_start_frame(curve: curves.Curve, window: int, saved: dict | None) -> dict | None:
    """The last `window` games' mean return by the frame each began on: its parity, and its
    phase modulo the frames of an agent step (a frame skip of k keeps a game at its start
    modulo k all game long, and Pong answers the same actions differently by that phase), e.g.
    {"games": 100, "parity": {"odd": {"games": 48, "mean_return": 19.0}, "even": ...},
    "modulo": 4, "phase": {"0": ..., "1": ..., "2": ..., "3": ...}}. None for a run whose
    games have no start frames (not Atari, or written before they were kept)."""
    if curve.start_frames is None:
        return None
    starts, returns = curve.start_frames[-window:], curve.returns[-window:]
    known = ~np.isnan(starts)
    starts, returns = starts[known].astype(np.int64), returns[known]
    if not len(starts):
        return None
    saved = saved if isinstance(saved, dict) else {}
    try:
        frame_skip = int(saved.get("frame_skip") or 0) or ATARI_FRAME_SKIP
        modulo = frame_skip * int(saved.get("num_action_repeats", 1))
    except (TypeError, ValueError):
        modulo = 0
    if not 1 <= modulo <= 64:
        modulo = ATARI_FRAME_SKIP  # an unreadable or implausible record: the default skip

    def group(chosen: np.ndarray) -> dict:
        games = returns[chosen]
        mean = round(float(games.mean()), 2) if len(games) else None
        return {"games": len(games), "mean_return": mean}

    return {
        "games": len(starts),
        "parity": {name: group(chosen) for name, chosen in parity.parity_masks(starts)},
        "modulo": modulo,
        "phase": {str(phase): group(starts % modulo == phase) for phase in range(modulo)},
    }


def _parity_text(by_parity: dict | None) -> str:
    """'; begun on an odd frame: 3 games at +4.3, on an even one: 7 games at -8.0' for the test
    games' `by_parity`; '' where they have none."""
    if by_parity is None:
        return ""

    def games(group: dict) -> str:
        mean = group["mean_return"]
        return f"{group['games']} games" + ("" if mean is None else f" at {mean:+.1f}")

    return f"; begun on an odd frame: {games(by_parity['odd'])}, on an even one: " + games(
        by_parity["even"]
    )


def policy_lag(scalars: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict | None:
    """The policy lag (learner steps between acting and learning, a batch's mean) of the steps
    the learner's progress lines reported: its median, 95th percentile and largest value over
    the run, from the run folder's summaries (`events.read_scalars`). None before any was
    written."""
    _, lags = scalars.get("actors/policy_lag", (None, np.empty(0)))
    lags = lags[np.isfinite(lags)]
    if not len(lags):
        return None
    return {
        "median": round(float(np.median(lags)), 2),
        "p95": round(float(np.percentile(lags, 95)), 2),
        "max": round(float(np.max(lags)), 2),
        "steps": len(lags),
    }


def policy_entropy(
    scalars: dict[str, tuple[np.ndarray, np.ndarray]],
    saved_flags: dict | None,
    run_dir: str,
    frames: int,
) -> dict | None:
    """How random the learner's policy was along the run: its mean entropy per agent step, as a
    fraction of the uniform policy's (ln of the number of actions), averaged over the steps the
    progress lines reported in each tenth of the run's `frames` (None for a tenth without one).

    Read from the entropy term of the loss (`loss/entropy`: the entropy bonus's weight times the
    negative entropy summed over a batch's `batch_size` x `unroll_length` steps, rank 0's batch)
    and that weight (`loss/entropy_cost`) in `scalars` (`events.read_scalars(run_dir)`), the
    batch shape in the run's flags (`saved_flags`, its flags.json; None if it has none it can
    read) and the number of actions in its latest checkpoint. None if any of these is missing or
    the weight was 0.
    """
    from impala.evaluation import restore  # TensorFlow: only once training is over

    saved = saved_flags or {}
    shape = [saved.get("batch_size"), saved.get("unroll_length")]
    # flags.json is only read: a field that is not a positive whole number gives no figure.
    if not all(type(size) is int and size > 0 for size in shape):
        return None
    steps_per_batch = shape[0] * shape[1]
    if "loss/entropy" not in scalars or "loss/entropy_cost" not in scalars:
        return None
    try:
        identity = restore.read_identity(restore.resolve_checkpoint(run_dir))
    except ValueError:
        return None
    steps, terms = scalars["loss/entropy"]
    cost_steps, costs = scalars["loss/entropy_cost"]
    if not np.array_equal(steps, cost_steps):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        nats = -terms / costs / steps_per_batch
    maximum = float(np.log(identity["num_actions"]))
    usable = np.isfinite(nats) & (costs > 0)
    tenths = []
    for tenth in range(10):
        inside = usable & (steps > tenth * frames / 10) & (steps <= (tenth + 1) * frames / 10)
        tenths.append(round(float(np.mean(nats[inside])) / maximum, 3) if inside.any() else None)
    if all(fraction is None for fraction in tenths):
        return None
    return {"maximum_nats": round(maximum, 4), "fraction_of_maximum_by_tenth": tenths}


def test_checkpoint(run_dir: str, num_games: int) -> dict:
    """Plays `num_games` with the run's latest checkpoint as `experiment.py --mode=test
    --checkpoint=<run_dir> --test_num_episodes=<num_games>` does (its defaults: sampled policy,
    seed 0, the training game's settings); the figures of that score."""
    from impala import evaluation  # TensorFlow and the games: only once training is over

    config = evaluation.EvalConfig(checkpoint=run_dir, num_episodes=num_games)
    result = evaluation.run(config, report=lambda line: print(f"[test] {line}", flush=True))
    parity = result.by_parity
    return {
        "checkpoint": result.checkpoint,
        "policy": result.policy,
        "seed": config.seed,
        "games": len(result.games),
        "mean_return": round(result.mean, 2),
        "std": round(result.std, 2),
        "min": result.min,
        "max": result.max,
        # Atari: the games begun on an odd frame and on an even one, apart.
        "by_parity": None
        if parity is None
        else {
            name: {"games": games, "mean_return": None if mean is None else round(mean, 2)}
            for name, (games, mean) in parity.items()
        },
    }


def frames_text(frames: float) -> str:
    """1.5M, 60k."""
    return f"{frames / 1e6:.1f}M" if frames >= 1e6 else f"{frames / 1e3:.0f}k"


def report_lines(config: str, figures: dict) -> list[str]:
    """The lines printed of a run's `figures` (`results`) after training: its headline figures
    (the README's "Learning results" row), then what the run changed, its policy lag and
    entropy, its games by start frame and since a branch, where it has them."""
    reached = ", ".join(
        f"{threshold} at {'-' if at is None else frames_text(at)}"
        for threshold, at in figures["frames_to_reach"].items()
    )
    lines = [
        f"{config}: mean return {figures['final_mean_return']} over the last "
        f"{figures['window']} games at {frames_text(figures['frames'])} frames (best "
        f"{figures['best_mean_return']}); reached {reached}; "
        f"{figures['frames_per_second_steady'] or 0:.0f} frames/s steady"
        + ("" if figures["wall_minutes"] is None else f", {figures['wall_minutes']} min in all")
    ]
    changed = figures["changed_from_configuration"]
    if changed is not None:
        as_text = learning_configs.load_experiment_flags().as_text
        settings = ", ".join(f"--{name}={as_text(value)}" for name, value in changed.items())
        lines.append(f"settings changed from --config={config}'s: {settings or 'none'}")
    if figures["policy_lag"]:
        lag = figures["policy_lag"]
        lines.append(
            f"policy lag: median {lag['median']}, 95th percentile {lag['p95']}, "
            f"largest {lag['max']} learner steps (over {lag['steps']} progress lines)"
        )
    if figures["policy_entropy"]:
        tenths = ", ".join(
            "-" if fraction is None else f"{fraction:.0%}"
            for fraction in figures["policy_entropy"]["fraction_of_maximum_by_tenth"]
        )
        lines.append(
            f"policy entropy, of the uniform policy's, in each tenth of the frames: {tenths}"
        )
    if figures["by_start_frame"]:
        lines.append(_by_start_frame_text(figures["by_start_frame"]))
    if figures.get("branched_from"):
        since = figures["branched_from"]
        lines.append(
            f"since the branch at {frames_text(since['frames'])} frames: mean return "
            f"{since['mean_return_since']} over its {since['games_since']} games"
        )
    return lines


def _by_start_frame_text(starts: dict) -> str:
    """The last games' mean returns by the parity and the phase of the frame each began on."""

    def mean(group: dict) -> str:
        value = group["mean_return"]
        games = group["games"]
        return f"{'-' if value is None else f'{value:+.2f}'} ({games} game{'s' * (games != 1)})"

    phases = ", ".join(f"{phase}: {mean(g)}" for phase, g in starts["phase"].items())
    return (
        f"the last {starts['games']} games by the frame each began on: odd "
        f"{mean(starts['parity']['odd'])}, even {mean(starts['parity']['even'])}; modulo "
        f"{starts['modulo']}: {phases}"
    )


def test_games_line(test: dict) -> str:
    """The line printed of the test games' figures (`test_checkpoint`)."""
    return (
        f"--mode=test with the final checkpoint: mean {test['mean_return']} "
        f"over {test['games']} games (min {test['min']:g}, max {test['max']:g})"
        + _parity_text(test["by_parity"])
    )
