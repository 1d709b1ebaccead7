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
A run of several policies (`--extra=--num_policies=N`, with `--extra=--with_pbt` a population)
gets curve.csv and learning.json in each policy's folder (`policy_<k>/`, every policy trained to
`--frames`), every policy's curve in one learning_curve.png, a learning.json in the run folder
naming each policy's final mean return and the best and worst policies, and the test games of
the best one.
Stopped early (Ctrl-C or SIGTERM), it reports on the frames trained so far; the same command
again (same --out_dir) resumes the run from its latest checkpoint and reports on the whole run,
and so does a larger --frames for a run that finished. With `--branch_from=<checkpoint>` it
trains a new run (`--out_dir`) on from another run's checkpoint, with that run's flags and the
ones `--extra` gives over them (`benchmarks/branch.py`): a setting tried from a point of a run,
beside a control branched from the same checkpoint.

The configurations are in `learning_configs.py`; the figures, and the lines printed of them, in
`learning_figures.py`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from benchmarks import learning_configs, learning_figures
from benchmarks.learning_configs import BENCHMARKS, Benchmark
from impala import curves, run_folder
from impala.curves import curve_file, drawing

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# run_local.py's exit status when stopped (Ctrl-C, SIGTERM): the run saved and can be resumed.
_STOPPED = 130
_MAX_SUMMARY_BYTES = 1 << 20  # a learner's summary is a few hundred bytes

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


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _read_summary(summary_path: str, run_dir: str) -> tuple[bool, int]:
    """(stopped early, frames done) of a learner's summary; a one-line error if unreadable."""
    try:
        with open(summary_path, "rb") as f:
            summary = json.loads(f.read(_MAX_SUMMARY_BYTES))
        if not isinstance(summary, dict):
            raise TypeError(f"a JSON {type(summary).__name__}, not an object")
        return bool(summary["stopped_early"]), int(summary["frames"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "empty"
        if isinstance(error, KeyError):
            reason = f"no {error.args[0]}"
        raise app.UsageError(
            f"--out_dir={run_dir} already holds a finished run, whose {summary_path} cannot be "
            f"read ({reason}); name a new one"
        ) from None


def _go_on(summary_paths: list[str], frames: float, run_dir: str) -> bool:
    """Says how the run in `run_dir` (its learners' summaries: one per policy) goes on to
    `frames`: whether it trains on (False: it finished, but its report was cut short, which is
    written now); a one-line error if it cannot."""
    read = [_read_summary(path, run_dir) for path in summary_paths]
    stopped, done = any(s for s, _ in read), min(d for _, d in read)
    if stopped:
        print(f"[learning] resuming the stopped run in {run_dir}", flush=True)
    elif done < frames:
        print(
            f"[learning] training the run in {run_dir} on from {done} frames to {frames:.0f}",
            flush=True,
        )
    elif not _reported(run_dir):
        print(
            f"[learning] the run in {run_dir} finished {done} frames before its report was "
            "complete: reporting it",
            flush=True,
        )
        return False
    else:
        raise app.UsageError(
            f"--out_dir={run_dir} already holds a finished run of {done} frames; give a larger "
            f"--frames to train it on, or name a new one"
        )
    return True


def _reported(run_dir: str) -> bool:
    """Whether the report of the finished run in `run_dir` was written in full: its
    learning.json, and with --test_games a policy's test games (the best's)."""
    try:
        written = [
            run_folder.read_json(os.path.join(folder, "learning.json"))
            for _, folder in {(None, run_dir), *result_folders(run_dir)}
        ]
    except (OSError, ValueError):
        return False
    tested = any(isinstance(figures, dict) and "test" in figures for figures in written)
    return tested or not FLAGS.test_games


def result_folders(run_dir: str) -> list[tuple[int | None, str]]:
    """(policy, folder) of each policy a run trains (`--num_policies`), or (None, `run_dir`)
    for a run of one: where its learner's summary, events and checkpoints are."""
    policies = run_folder.policies_in(run_dir)
    if not policies:
        return [(None, run_dir)]
    return [(policy, run_folder.policy_path(run_dir, policy)) for policy in policies]


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


def prepare(benchmark: Benchmark, frames: float, run_dir: str) -> tuple[bool, bool]:
    """Makes or checks `run_dir` before training: a new run, a branch (--branch_from), or the
    run it holds going on (stopped, finished and given a larger budget, or finished with its
    report cut short); a one-line error if it cannot. Returns whether the run goes on from
    frames trained before, and whether it trains."""
    resumed, trains = False, True
    summary_paths = [
        os.path.join(folder, "learner_0.json")
        for _, folder in result_folders(run_dir)
        if os.path.exists(os.path.join(folder, "learner_0.json"))
    ]
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
        if summary_paths:
            # A stopped run goes on from its latest checkpoint, with the flags it started
            # with; so does a finished one given a larger budget.
            trains = _go_on(summary_paths, frames, run_dir)
            resumed = True
        elif branched:
            resumed = True  # made, but stopped before its learner wrote a summary
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as error:
        raise app.UsageError(f"--out_dir={run_dir}: {error.strerror}") from None
    return resumed, trains


def figures_of(
    benchmark: Benchmark, run_dir: str, wall_secs: float | None, resumed: bool, name: str = ""
) -> tuple[curves.Curve, dict]:
    """The trained run's learning curve (named `name`, else the configuration) and figures
    (`learning_figures.results`); `run_dir` may be one policy's folder of a run of several."""
    if not os.path.exists(os.path.join(run_dir, "learner_0.json")):
        raise SystemExit(f"[learning] {run_dir}: the learner stopped before writing its summary")
    try:
        curve = curves.load_curve(run_dir, name or FLAGS.config, FLAGS.window)
    except curves.CurveError as error:
        raise SystemExit(f"[learning] nothing to report: {error}") from None
    figures = learning_figures.results(benchmark, curve, run_dir, wall_secs, sys.argv)
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
    return curve, figures


def play_test_games(figures: dict, run_dir: str, json_path: str) -> None:
    """Adds the final checkpoint's --mode=test score to `figures` and to learning.json (saved
    already: a stop or an error here loses only the games)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        figures["test"] = learning_figures.test_checkpoint(run_dir, FLAGS.test_games)
    except KeyboardInterrupt:
        print("[learning] test games stopped: learning.json has no test score")
    except ValueError as error:
        print(f"[learning] test games failed: {error}")
    else:
        run_folder.write_json(json_path, figures)
        print(f"[learning] {learning_figures.test_games_line(figures['test'])}")


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
    for line in learning_configs.repeated_values(benchmark, FLAGS.config, FLAGS.extra):
        print(f"[learning] note: {line}", flush=True)
    resumed, trains = prepare(benchmark, frames, run_dir)
    wall_secs = train(benchmark, frames, run_dir, FLAGS.extra) if trains else None
    results = [
        _report(benchmark, policy, folder, wall_secs, resumed)
        for policy, folder in result_folders(run_dir)
    ]
    title = f"{FLAGS.config}: {learning_figures.frames_text(results[0].figures['frames'])} frames"
    drawing.write_png(
        drawing.draw([result.curve for result in results], title),
        os.path.join(run_dir, "learning_curve.png"),
    )
    # On a tie the best is the first such policy.
    best = max(results, key=lambda result: _final(result, -math.inf))
    if len(results) > 1:
        _report_population(results, best, run_dir)
    if FLAGS.test_games:  # the best policy's, in a population
        play_test_games(best.figures, best.folder, os.path.join(best.folder, "learning.json"))
    written = ", ".join(f"{r.folder}/learning.json, {r.folder}/curve.csv" for r in results)
    print(f"[learning] {run_dir}/learning_curve.png, {written}")
    return 0


class _Result(NamedTuple):
    policy: int | None  # in a run of several policies; None in a run of one
    folder: str
    curve: curves.Curve
    figures: dict


def _report(
    benchmark: Benchmark, policy: int | None, folder: str, wall_secs: float | None, resumed: bool
) -> _Result:
    """One policy's (or a run of one's) curve and figures, written into its folder and said."""
    name = FLAGS.config if policy is None else f"{FLAGS.config} policy {policy}"
    curve, figures = figures_of(benchmark, folder, wall_secs, resumed, name)
    curve_file.write(curve, os.path.join(folder, "curve.csv"))
    run_folder.write_json(os.path.join(folder, "learning.json"), figures)
    for line in learning_figures.report_lines(FLAGS.config, figures):
        print(f"[learning] {'' if policy is None else f'policy {policy}: '}{line}")
    return _Result(policy, folder, curve, figures)


def _final(result: _Result, missing: float) -> float:
    """The mean return of the result's last games (`missing` if it played none)."""
    value = result.figures["final_mean_return"]
    return missing if value is None else value


def _report_population(results: list[_Result], best_result: _Result, run_dir: str) -> None:
    """A run of several policies: learning.json in the run folder names each one's final
    mean return, the best (`best_result`) and the worst."""
    finals = {result.policy: result.figures["final_mean_return"] for result in results}
    best = best_result.policy
    # On a tie the worst is the last such policy.
    worst = min(reversed(results), key=lambda result: _final(result, math.inf)).policy
    population = {"final_mean_returns": finals, "best_policy": best, "worst_policy": worst}
    run_folder.write_json(os.path.join(run_dir, "learning.json"), population)
    print(f"[learning] population: final mean returns {finals}; best policy {best}, worst {worst}")


if __name__ == "__main__":
    app.run(main)
