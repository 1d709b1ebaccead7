"""Learning benchmark: train a named configuration for a frame budget and report how it learned.

  python -m benchmarks.learning                          # pong: the make-train set-up, 10M frames
  python -m benchmarks.learning --config=breakout
  python -m benchmarks.learning --config=catch           # a two-minute check of the whole path
  python -m benchmarks.learning --config=pong --frames=2e6 --out_dir=/tmp/pong-short
  make bench-learning ARGS="--config=breakout"

Trains through the real distributed path (`run_local.py`: a learner process and actor processes
over gRPC, the defaults of `make train` unless the configuration says otherwise), then writes into
`--out_dir` (default `runs/bench-<config>-<time>`, which is also the run folder):
  learning_curve.png  return against emulator frames and against training hours (`plot.py`);
  curve.csv           the same games, one row each: frames, return, length, training hours,
                      and for Atari the frames the game began with (its no-ops and FIRE)
                      (`plot.py` reads it as it reads a run folder; it outlives the folder's
                      checkpoints and event files, as the ones in `benchmarks/curves/` do);
  learning.json       the configuration and its flags, the settings the run changed from them
                      (read from the run's flags.json), the machine, the date, the final mean
                      return over the last `--window` games, the best such mean, the frames at
                      which that mean first reached each of `thresholds`, and frames/s (the
                      learner's steady rate and the overall rate, start-up included), the
                      policy lag its progress lines reported (median, 95th percentile and
                      largest), the policy's entropy against the uniform policy's in each
                      tenth of the frames, for Atari the last `--window` games' mean return
                      by their start frame's parity and modulo the frame skip (a policy that
                      wins the games of one phase only shows there), and the score of
                      `--test_games` games played with the final checkpoint as
                      `experiment.py --mode=test` plays them.
The last lines printed are the JSON's headline figures, the README's "Learning results" row.
Stopped early (Ctrl-C or SIGTERM), it reports on the frames trained so far; the same command
again (same --out_dir) resumes the run from its latest checkpoint and reports on the whole run,
and so does a larger --frames for a run that finished. With `--branch_from=<checkpoint>` it
trains a new run (`--out_dir`) on from another run's checkpoint, with that run's flags and the
ones `--extra` gives over them (`benchmarks/branch.py`): a setting tried from a point of a run,
beside a control branched from the same checkpoint.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from absl import app, flags

import plot
from impala import flags as experiment_flags
from impala import run_folder
from impala.envs import catch
from impala.envs.config import ATARI_FRAME_SKIP

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A named learning benchmark.

    Attributes:
      flags: experiment.py / run_local.py flags on top of the make-train defaults.
      frames: the default frame budget.
      thresholds: returns whose first crossing (by the moving mean) is reported, in frames.
    """

    flags: tuple[str, ...]
    frames: float
    thresholds: tuple[float, ...]


# A checkpoint a million frames (about 20 MB each with the Nature network) to follow the policy
# along the run or branch the run from (`--branch_from`).
_MILESTONES = "--keep_checkpoint_every_frames=1e6"

BENCHMARKS = {
    # `make train ARGS="--total_environment_frames=10e6"`: the default learning-rate schedule
    # scales with that budget, the rate held to 8.5M and falling to 0 over the last 1.5M frames.
    "pong": Benchmark(
        ("--level_name=PongNoFrameskip-v4", _MILESTONES),
        10e6,
        (-15.0, 0.0, 10.0, 18.0),
    ),
    "breakout": Benchmark(
        ("--level_name=BreakoutNoFrameskip-v4", _MILESTONES),
        10e6,
        (10.0, 50.0, 100.0),
    ),
    # The Catch learning test (tests/e2e/test_benchmarks.py runs this): small batches, Adam.
    "catch": Benchmark(catch.QUICK_LEARNING_FLAGS, 60e3, (0.0, 0.5, 0.9)),
}

# run_local.py's exit status when stopped (Ctrl-C, SIGTERM): the run saved and can be resumed.
_STOPPED = 130

FLAGS = flags.FLAGS
flags.DEFINE_enum("config", "pong", list(BENCHMARKS), "Which benchmark to run.")
flags.DEFINE_float("frames", 0, "Frame budget (default: the configuration's).", lower_bound=0)
flags.DEFINE_string("out_dir", "", "Run folder and results (default: runs/bench-<config>-<time>).")
flags.DEFINE_integer("window", 100, "Games in the mean return that is reported.", lower_bound=1)
flags.DEFINE_multi_string("extra", [], "More run_local.py flags, e.g. --extra=--seed=1.")
flags.DEFINE_string(
    "branch_from",
    "",
    "A checkpoint of another run (or a run folder: its latest) to start a new run from, in "
    "--out_dir: that run's flags, weights, optimiser state and learning curve to that point.",
)
flags.DEFINE_integer(
    "test_games",
    10,
    "Games the final checkpoint then plays as `experiment.py --mode=test` does (0: none).",
    lower_bound=0,
)


def train(benchmark: Benchmark, frames: float, run_dir: str, extra: list[str]) -> float:
    """Runs run_local.py into `run_dir`; returns the wall-clock seconds it took."""
    argv = [
        sys.executable,
        "-u",
        os.path.join(_ROOT, "run_local.py"),
        f"--logdir={os.path.dirname(run_dir)}",
        f"--experiment={os.path.basename(run_dir)}",
        f"--total_environment_frames={frames:.0f}",
        *benchmark.flags,
        *extra,
    ]
    print(f"[learning] {' '.join(argv[2:])}", flush=True)
    started = time.monotonic()
    # Ctrl-C reaches run_local.py too (same process group); SIGTERM and SIGHUP are passed on to
    # it, once. Either way run_local.py stops its processes and saves; this waits, then reports.
    child: subprocess.Popen | None = None
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        if child is not None and not stopping:
            stopping = True
            child.send_signal(signal.SIGTERM)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        child = subprocess.Popen(argv, cwd=_ROOT)
        while True:
            try:
                returncode = child.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    # 130: run_local.py stopped the run and saved; killed by a signal itself, it could not.
    if returncode == _STOPPED or (returncode < 0 and stopping):
        print("[learning] stopped before the budget: reporting the frames trained", flush=True)
    elif returncode != 0:
        raise SystemExit(f"[learning] training failed with exit status {returncode}")
    return time.monotonic() - started


# experiment.py flags that say where a run is and which process plays which part (the launchers'
# per-process ones, and --mode=test's checkpoint), not how it learns; `total_environment_frames`
# is the budget, which `--frames` gives.
_PLACEMENT_FLAGS = run_folder.PER_PROCESS_FLAGS | {"checkpoint", "total_environment_frames"}


def configuration_values(benchmark: Benchmark, preset: str = "") -> dict[str, object]:
    """The experiment.py flag values a run of `benchmark` gets from no `--extra` but `preset`:
    `make train`'s defaults (or the preset's), under the configuration's own flags."""
    values = {
        name: experiment_flags.unset_value(name, preset) for name in experiment_flags.flag_values()
    }
    for flag in benchmark.flags:
        name, _, text = flag.removeprefix("--").partition("=")
        values[name] = experiment_flags.FLAGS[name].parser.parse(text)
    return values


def changed_settings(benchmark: Benchmark, saved: dict) -> dict[str, object]:
    """The flags of a run (its flags.json, `saved`) whose value is not the one the
    configuration gives with no `--extra` and no preset: what the run changed, as saved."""
    base = configuration_values(benchmark)
    changed = {}
    for name, value in sorted(saved.items()):
        if name in _PLACEMENT_FLAGS or name not in base:
            continue
        try:
            same = experiment_flags.parse_saved(name, value) == base[name]
        except ValueError:
            same = False  # a value no process would take: not the configuration's
        if not same:
            changed[name] = value
    return changed


def repeated_values(benchmark: Benchmark, config: str, extra: list[str]) -> list[str]:
    """The `--extra` flags that give an experiment.py flag the value the configuration named
    `config` (with the `--preset` among them, if any) gives it already, each as a line saying
    so: a run meant to try a setting that changes nothing is one of the configuration's own.
    Of a flag given twice, the last value is the one the run takes, and the one looked at."""
    settings = experiment_flags.flag_values()
    parsed = {}
    for flag in extra:
        name, equals, text = flag.removeprefix("--").partition("=")
        if not equals and name not in experiment_flags.FLAGS and name.startswith("no"):
            name, text = name[2:], "false"  # absl's --noname
        elif not equals:
            text = "true"
        if name in settings and name not in _PLACEMENT_FLAGS:
            parsed[name] = (flag, text)
    preset = parsed.get("preset", (None, ""))[1]
    base = configuration_values(benchmark, preset if preset in experiment_flags.PRESETS else "")
    repeated = []
    for name, (flag, text) in parsed.items():
        try:
            value = experiment_flags.FLAGS[name].parser.parse(text)
        except (ValueError, TypeError, OverflowError):
            continue  # experiment.py names it in its own one-line error
        if value == base[name]:
            repeated.append(
                f"--extra={flag} gives --{name} the value --config={config} already has "
                f"({experiment_flags.as_text(value)}): this run does not change it"
            )
    return repeated


def first_crossing(frames: np.ndarray, smoothed: np.ndarray, threshold: float) -> int | None:
    """Frames at which the moving mean first reached `threshold`, None if it never did."""
    reached = np.flatnonzero(smoothed >= threshold)
    return int(frames[reached[0]]) if len(reached) else None


def results(
    benchmark: Benchmark, curve: plot.Curve, run_dir: str, wall_secs: float, argv: list[str]
) -> dict:
    """The benchmark's figures, from the run's learning curve and its learner summary."""
    # Only full windows of games count, so that a lucky first game is not a "best mean".
    first_full = min(curve.window, len(curve.returns)) - 1
    with open(os.path.join(run_dir, "learner_0.json")) as f:
        summary = json.load(f)
    scalars = plot.read_scalars(run_dir)  # the event files: read once, for both figures below
    try:
        saved = run_folder.read_flags(run_dir)  # read once, for both figures that need it
    except ValueError:
        saved = None  # an unreadable flags.json: no record of what the run changed
    return {
        "config": curve.name,
        "command": "python -m benchmarks.learning " + " ".join(argv[1:]),
        "flags": list(benchmark.flags),
        # What the run changed from its configuration's set-up, read from the flags it ran with.
        "changed_from_configuration": None if saved is None else changed_settings(benchmark, saved),
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
        "frames_per_second_overall": summary["frames"] / wall_secs,
        "policy_lag": policy_lag(scalars),
        "policy_entropy": policy_entropy(scalars, saved, run_dir, int(summary["frames"])),
        "by_start_frame": by_start_frame(curve, first_full + 1, saved),
        "wall_minutes": round(wall_secs / 60, 1),
        "training_hours": round(float(curve.hours[-1]), 3),
        "run_dir": run_dir,
    }


def by_start_frame(curve: plot.Curve, window: int, saved: dict | None) -> dict | None:
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
        "parity": {name: group(chosen) for name, chosen in plot.parity_masks(starts)},
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
    the run, from the run folder's summaries (`plot.read_scalars`). None before any was
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
    and that weight (`loss/entropy_cost`) in `scalars` (`plot.read_scalars(run_dir)`), the
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _frames(frames: float) -> str:
    return f"{frames / 1e6:.1f}M" if frames >= 1e6 else f"{frames / 1e3:.0f}k"


def _go_on(summary_path: str, frames: float, run_dir: str) -> None:
    """Says how the run in `run_dir` goes on to `frames`; a one-line error if it cannot."""
    try:
        with open(summary_path) as f:
            summary = json.load(f)
        stopped, done = bool(summary["stopped_early"]), int(summary["frames"])
    except (OSError, ValueError, KeyError, TypeError):
        raise app.UsageError(
            f"--out_dir={run_dir} already holds a finished run; name a new one"
        ) from None
    if stopped:
        print(f"[learning] resuming the stopped run in {run_dir}", flush=True)
    elif done < frames:
        print(
            f"[learning] training the run in {run_dir} on from {done} frames to {frames:.0f}",
            flush=True,
        )
    else:
        raise app.UsageError(
            f"--out_dir={run_dir} already holds a finished run of {done} frames; give a larger "
            f"--frames to train it on, or name a new one"
        )


def _branch_record(run_dir: str) -> dict | None:
    """The checkpoint the run in `run_dir` was branched from (`run_folder.read_branch`)."""
    try:
        return run_folder.read_branch(run_dir)
    except ValueError as error:
        raise app.UsageError(str(error)) from None


def _names(given: str, branched: dict | None) -> bool:
    """Whether --branch_from=`given` names the checkpoint `branched` records: the same command
    again resumes the branch it made."""
    return bool(branched) and os.path.abspath(given) in (branched["given"], branched["checkpoint"])


def _same(saved, value: str) -> bool:
    """Whether a flag's value saved in flags.json is the one given as text."""
    try:
        return float(saved) == float(value)
    except (TypeError, ValueError):
        return str(saved) == value


def _branch(benchmark: Benchmark, frames: float, run_dir: str) -> None:
    """Makes the new run folder `run_dir` from --branch_from's checkpoint; a one-line error,
    before anything is written, if the branch could not train to `frames`."""
    from benchmarks import branch  # imports TensorFlow: only for a branch

    where = f"--branch_from={FLAGS.branch_from}"
    if not FLAGS.out_dir:
        raise app.UsageError(f"{where}: give the new run's folder as --out_dir")
    try:
        start = branch.source(FLAGS.branch_from)
    except ValueError as error:
        message = str(error).removeprefix(f"{FLAGS.branch_from}: ")
        raise app.UsageError(f"{where}: {message}") from None
    # The configuration's flags go over the run's: refuse to change one unasked.
    given = {flag.removeprefix("--").partition("=")[0] for flag in FLAGS.extra}
    for flag in benchmark.flags:
        name, _, value = flag.removeprefix("--").partition("=")
        saved = start.flags.get(name)
        if name in given or name == "keep_checkpoint_every_frames" or _same(saved, value):
            continue
        raise app.UsageError(
            f"{where}: that run has --{name}={saved}, which --config={FLAGS.config} would "
            f"change to {value}; give --extra=--{name}=... to say which"
        )
    if start.frames >= frames:
        raise app.UsageError(
            f"{where}: the checkpoint is at {start.frames} frames; give a larger --frames "
            f"(now {frames:.0f})"
        )
    # SIGTERM (as Ctrl-C) lets the branch remove its half-made folder.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        branch.branch(start, run_dir)
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    except KeyboardInterrupt:
        raise SystemExit(f"[learning] stopped while making {run_dir}: nothing was made") from None
    except OSError as error:
        raise app.UsageError(
            f"{error.filename or run_dir}: {error.strerror or error} (making --out_dir={run_dir})"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(
        f"[learning] branched {start.checkpoint} ({start.frames} frames) into {run_dir}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    benchmark = BENCHMARKS[FLAGS.config]
    frames = FLAGS.frames or benchmark.frames
    run_dir = os.path.abspath(
        FLAGS.out_dir
        or os.path.join(
            _ROOT, "runs", f"bench-{FLAGS.config}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        )
    )
    for line in repeated_values(benchmark, FLAGS.config, FLAGS.extra):
        print(f"[learning] note: {line}", flush=True)
    resumed = False
    summary_path = os.path.join(run_dir, "learner_0.json")
    if FLAGS.branch_from and not os.path.lexists(run_dir):
        _branch(benchmark, frames, run_dir)
        resumed = True
    else:
        branched = _branch_record(run_dir)
        if FLAGS.branch_from and not _names(FLAGS.branch_from, branched):
            raise app.UsageError(
                f"--out_dir={run_dir} exists"
                + (f" (branched from {branched['checkpoint']})" if branched else "")
                + f"; --branch_from={FLAGS.branch_from} starts a new run folder"
            )
        if os.path.exists(summary_path):
            # A stopped run goes on from its latest checkpoint, with the flags it started
            # with; so does a finished one given a larger budget.
            _go_on(summary_path, frames, run_dir)
            resumed = True
        elif branched:
            resumed = True  # made, but stopped before its learner wrote a summary
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as error:
        raise app.UsageError(f"--out_dir={run_dir}: {error.strerror}") from None
    wall_secs = train(benchmark, frames, run_dir, FLAGS.extra)
    if not os.path.exists(summary_path):
        raise SystemExit(f"[learning] {run_dir}: the learner stopped before writing its summary")
    try:
        curve = plot.load_curve(run_dir, FLAGS.config, FLAGS.window)
    except plot.PlotError as error:
        raise SystemExit(f"[learning] nothing to report: {error}") from None
    figures = results(benchmark, curve, run_dir, wall_secs, sys.argv)
    if resumed:
        # This invocation's wall time covers only the frames since the resume.
        figures["resumed"] = True
        figures["frames_per_second_overall"] = None
    branched = _branch_record(run_dir)
    if branched:
        # The last `--window` games may reach back before the branch: these are its own.
        since = curve.returns[curve.frames > branched["frames"]]
        figures["branched_from"] = {
            "checkpoint": branched["checkpoint"],
            "frames": branched["frames"],
            "games_since": len(since),
            "mean_return_since": round(float(since.mean()), 2) if len(since) else None,
        }
    title = f"{FLAGS.config}: {_frames(figures['frames'])} frames"
    plot.write_png(plot.draw([curve], title), os.path.join(run_dir, "learning_curve.png"))
    plot.write_curve_csv(curve, os.path.join(run_dir, "curve.csv"))
    json_path = os.path.join(run_dir, "learning.json")
    run_folder.write_json(json_path, figures)
    reached = ", ".join(
        f"{threshold} at {'-' if at is None else _frames(at)}"
        for threshold, at in figures["frames_to_reach"].items()
    )
    print(
        f"[learning] {FLAGS.config}: mean return {figures['final_mean_return']} over the last "
        f"{figures['window']} games at {_frames(figures['frames'])} frames (best "
        f"{figures['best_mean_return']}); reached {reached}; "
        f"{figures['frames_per_second_steady'] or 0:.0f} frames/s steady, "
        f"{figures['wall_minutes']} min in all"
    )
    changed = figures["changed_from_configuration"]
    if changed is not None:
        settings = ", ".join(
            f"--{name}={experiment_flags.as_text(value)}" for name, value in changed.items()
        )
        print(f"[learning] settings changed from --config={FLAGS.config}'s: {settings or 'none'}")
    if figures["policy_lag"]:
        lag = figures["policy_lag"]
        print(
            f"[learning] policy lag: median {lag['median']}, 95th percentile {lag['p95']}, "
            f"largest {lag['max']} learner steps (over {lag['steps']} progress lines)"
        )
    if figures["policy_entropy"]:
        tenths = ", ".join(
            "-" if fraction is None else f"{fraction:.0%}"
            for fraction in figures["policy_entropy"]["fraction_of_maximum_by_tenth"]
        )
        print(
            f"[learning] policy entropy, of the uniform policy's, in each tenth of the "
            f"frames: {tenths}"
        )
    if figures["by_start_frame"]:
        starts = figures["by_start_frame"]

        def mean(group: dict) -> str:
            value = group["mean_return"]
            games = group["games"]
            return f"{'-' if value is None else f'{value:+.2f}'} ({games} game{'s' * (games != 1)})"

        phases = ", ".join(f"{phase}: {mean(g)}" for phase, g in starts["phase"].items())
        print(
            f"[learning] the last {starts['games']} games by the frame each began on: odd "
            f"{mean(starts['parity']['odd'])}, even {mean(starts['parity']['even'])}; modulo "
            f"{starts['modulo']}: {phases}"
        )
    if branched:
        since = figures["branched_from"]
        print(
            f"[learning] since the branch at {_frames(since['frames'])} frames: mean return "
            f"{since['mean_return_since']} over its {since['games_since']} games"
        )
    if FLAGS.test_games:
        # The figures above are saved already: a stop or an error here loses only the games.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            figures["test"] = test_checkpoint(run_dir, FLAGS.test_games)
        except KeyboardInterrupt:
            print("[learning] test games stopped: learning.json has no test score")
        except ValueError as error:
            print(f"[learning] test games failed: {error}")
        else:
            run_folder.write_json(json_path, figures)
            test = figures["test"]
            print(
                f"[learning] --mode=test with the final checkpoint: mean {test['mean_return']} "
                f"over {test['games']} games (min {test['min']:g}, max {test['max']:g})"
                + _parity_text(test["by_parity"])
            )
    print(f"[learning] {run_dir}/learning_curve.png, {run_dir}/learning.json, {run_dir}/curve.csv")
    return 0


if __name__ == "__main__":
    app.run(main)
