"""Sample Factory 2 (APPO), the peer users compare this system with, run on this machine on the CPU,
so that both are measured in the same sitting.

  python -m benchmarks.peer throughput                     # 150 s of its Atari settings on Pong
  python -m benchmarks.peer throughput --num_epochs=6      # 6 passes per frame, as ours makes
  python -m benchmarks.peer pong --out_dir=runs/peer-pong  # its Pong run to 10M frames
  python -m benchmarks.peer pong --out_dir=runs/peer-pong --report_only

Both run `sf_examples.atari.train_atari --env=atari_pong` (Sample Factory 2.1.1's Atari example
with its own defaults: APPO run synchronously, Nature encoder `convnet_atari`, rollouts of 128,
4 epochs over each iteration's samples in minibatches of 256) with `--device=cpu --num_workers=2
--num_envs_per_worker=8` and, so that its synchronous mode accepts 16 environments, 8 minibatches
an iteration instead of 4 (see `peer_commands.BASE_FLAGS`), and print the exact command.
Sample Factory lives in its own venv, made on first use outside the repository
(`benchmarks/peer_setup.py`: `$IMPALA_PEER_DIR`, else `~/.cache/impala-peer/sf2`, with its
set-up log; a few minutes once, then instant). What Sample Factory counts and writes, and how
it is read: `benchmarks/peer_results.py`; its command lines: `benchmarks/peer_commands.py`;
running it in a process group of its own: `benchmarks/peer_process.py`.

throughput: runs it for `--seconds` under `timeout` (its own `--train_for_seconds` does not stop
  it in 2.1.1), in a new temporary train_dir, and prints its throughput in emulator frames/s:
  its log's 60-s figure, from the last line whose 60 s all come after the first `--skip_seconds`
  (start-up and warm-up), and the samples (agent steps) it collected. `--num_epochs` sets its
  passes over each frame (its default 4; ours makes about 6: 3 passes over batches half
  fresh, half replayed, so `--num_epochs=6` compares the same work per frame). Its log is kept as
  `<peer folder>/throughput-last.log`.
pong: trains into `--out_dir` to `--frames` emulator frames (Sample Factory's
  `--train_for_env_steps` counts emulator frames, agent steps x 4): its train_dir `sf/`
  (experiment `pong`), its output in `sf_output.log` and its command lines in
  `sf_commands.txt`. Then it writes `curve.csv` (this project's curve file, with one row per
  100-game mean Sample Factory wrote: see peer_results.py) and `peer.json`: the frames and the
  training hours at which the 100-game mean first reached -15, 0, +10 and +18 (as
  `benchmarks/learning.py` finds them), the final and best mean, frames/s, the settings it ran
  with. Stopped (Ctrl-C, SIGTERM), Sample Factory saves a checkpoint and the run is reported so
  far; the same command again resumes it from that checkpoint (its default
  `--restart_behavior=resume`); if it cannot load that checkpoint and starts from scratch, it
  is killed at once and the command fails. `--report_only` reports on the run in `--out_dir` as
  it is.

Stopping this command stops every Sample Factory process (its whole process group): first as
Ctrl-C would (its learner saves), then, after a minute or at a second signal, killed.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import shlex
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow reads the event files

from absl import app, flags

from benchmarks import one_line_flags, peer_results, peer_setup
from benchmarks.learning_configs import BENCHMARKS
from benchmarks.peer_commands import (
    EXPERIMENT,
    RESERVED,
    UsageError,
    check_extra,
    checkpoint_frames,
    pong_command,
    throughput_command,
)
from benchmarks.peer_process import ResumeError, run_sf, tail
from impala import run_folder
from impala.curves import curve_file

FLAGS = flags.FLAGS


def _define_flags() -> None:
    # Defined only when run as a script: the tests import this module beside others whose
    # --frames, --out_dir and --extra are other flags.
    flags.DEFINE_float(
        "seconds",
        150,
        "throughput: how long Sample Factory runs, start-up included.",
        lower_bound=1,
    )
    flags.DEFINE_float(
        "skip_seconds",
        60,
        "throughput: the first seconds (start-up, warm-up) the 60-s figure reported leaves out.",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "num_epochs",
        0,
        "throughput: Sample Factory's passes over each frame (0: its Atari default, 4; ours: 6).",
        lower_bound=0,
    )
    flags.DEFINE_string(
        "out_dir", "", "pong: the run's folder (Sample Factory's run, the results)."
    )
    flags.DEFINE_float("frames", 10e6, "pong: the frame budget, in emulator frames.", lower_bound=1)
    flags.DEFINE_bool(
        "report_only", False, "pong: report on the run in --out_dir, training nothing."
    )
    flags.DEFINE_multi_string(
        "extra", [], "More Sample Factory flags, as --name=value, e.g. --extra=--seed=1."
    )


MODES = ("throughput", "pong")
SCRIPT = "peer.py"
_STOPPED = 130  # this command's exit status when stopped with nothing to report
_TIMED_OUT = 124  # timeout's exit status when the time was up
_COMMANDS = "sf_commands.txt"  # in --out_dir: Sample Factory's command line, one per start
# The settings peer.json records, read from Sample Factory's config.json.
_SETTINGS = (
    "algo",
    "encoder_conv_architecture",
    "num_workers",
    "num_envs_per_worker",
    "async_rl",
    "with_vtrace",
    "rollout",
    "batch_size",
    "num_batches_per_epoch",
    "num_epochs",
    "learning_rate",
    "lr_schedule",
    "env_frameskip",
    "stats_avg",
    "summaries_use_frameskip",
    "train_for_env_steps",
    "device",
    "seed",
)


class RunError(Exception):
    """Sample Factory failed, or gave nothing to report: one line, exit status 1."""


def _failed(status: int, log_path: str) -> RunError:
    """Sample Factory's failure, its log's last lines printed before."""
    last = tail(log_path, 4096).strip().splitlines()[-15:]
    print("\n".join(f"[sf] {line}" for line in last), file=sys.stderr)
    return RunError(f"Sample Factory stopped with exit status {status}: see {log_path}")


# --- the two modes -----------------------------------------------------------------------------


def _ensure_peer() -> peer_setup.Peer:
    try:
        return peer_setup.ensure(report=lambda line: print(f"[peer] {line}", flush=True))
    except peer_setup.SetupError as error:
        raise RunError(str(error)) from None


def throughput() -> int:
    """Runs Sample Factory for `--seconds` and prints its steady throughput."""
    check_extra(FLAGS.extra, RESERVED | {"num_epochs", "encoder_conv_architecture"})
    if FLAGS.seconds < FLAGS.skip_seconds + peer_results.FPS_WINDOW_SECS:
        raise UsageError(
            f"--seconds={FLAGS.seconds:g}: the 60-s figure after --skip_seconds="
            f"{FLAGS.skip_seconds:g} needs at least {FLAGS.skip_seconds + 60:g} s (start-up "
            f"takes more)"
        )
    peer = _ensure_peer()
    kept = os.path.join(peer.folder, "throughput-last.log")
    with tempfile.TemporaryDirectory(prefix="impala-peer-") as train_dir:
        argv = throughput_command(
            peer.python, train_dir, FLAGS.seconds, FLAGS.num_epochs, FLAGS.extra
        )
        print(f"[peer] {shlex.join(argv)}", flush=True)
        log_path = os.path.join(train_dir, "sf_output.log")
        status, stopped = run_sf(argv, log_path, cwd=train_dir)
        shutil.copyfile(log_path, kept)
    if stopped:
        print("[peer] stopped before the time was up", file=sys.stderr)
        return _STOPPED
    if status != _TIMED_OUT:
        raise _failed(status, kept)
    with open(kept, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        result = peer_results.steady_throughput(text, FLAGS.skip_seconds, kept)
    except peer_results.PeerError as error:
        raise RunError(str(error)) from None
    for line in throughput_lines(result, FLAGS.num_epochs or 4, FLAGS.seconds):
        print(f"[peer] {line}")
    return 0


def throughput_lines(result: peer_results.Throughput, epochs: int, seconds: float) -> list[str]:
    """What the throughput mode prints of its measurement."""
    start, end = result.window
    return [
        f"Sample Factory 2.1.1 APPO on Pong, CPU, 2 workers x 8 envs, convnet_atari, {epochs} "
        f"passes per frame (--num_epochs; ours: 6)",
        f"{result.frames_per_second:,.0f} emulator frames/s ({result.frames_per_second / 4:,.0f} "
        f"agent steps/s): its 60-s figure, over {start:.0f}-{end:.0f} s after its start",
        f"{result.samples:,} samples (agent steps) collected and {result.frames:,} frames "
        f"trained by then; {result.lines} throughput lines in {seconds:g} s",
    ]


def pong() -> int:
    """Trains (or goes on training) Sample Factory's Pong run in `--out_dir`, then reports."""
    if not FLAGS.out_dir:
        raise UsageError("pong: give the run's folder as --out_dir")
    check_extra(FLAGS.extra, RESERVED)
    out_dir = os.path.abspath(FLAGS.out_dir)
    train_dir = os.path.join(out_dir, "sf")
    experiment_dir = os.path.join(train_dir, EXPERIMENT)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out_dir={FLAGS.out_dir}: not a folder")
    if FLAGS.report_only:
        if FLAGS.extra:
            raise UsageError("--report_only trains nothing: --extra has nothing to change")
        return report(out_dir, experiment_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out_dir={FLAGS.out_dir}: {error.strerror or error}") from None
    done = checkpoint_frames(experiment_dir)
    if done is not None and done >= FLAGS.frames:
        print(f"[peer] {out_dir} holds a run of {done:,} frames already: reporting", flush=True)
        return report(out_dir, experiment_dir)
    peer = _ensure_peer()
    argv = pong_command(peer.python, train_dir, FLAGS.frames, FLAGS.extra)
    if done is not None:
        print(f"[peer] resuming from its checkpoint at {done:,} frames", flush=True)
    print(f"[peer] {shlex.join(argv)}", flush=True)
    with open(os.path.join(out_dir, _COMMANDS), "a") as f:
        f.write(shlex.join(argv) + "\n")
    log_path = os.path.join(out_dir, "sf_output.log")
    try:
        status, stopped = run_sf(argv, log_path, cwd=out_dir, resuming=done is not None)
    except ResumeError as error:
        raise RunError(str(error)) from None
    if stopped:
        print("[peer] stopped before the budget: reporting the frames trained", flush=True)
    elif status != 0:
        raise _failed(status, log_path)
    return report(out_dir, experiment_dir)


def _sf_config(experiment_dir: str) -> dict:
    """Sample Factory's config.json of the run (what it ran with, the command line too)."""
    path = os.path.join(experiment_dir, "config.json")
    try:
        with open(path, "rb") as f:
            config = json.loads(f.read(1 << 20))
    except FileNotFoundError:
        raise RunError(f"no Sample Factory run in {experiment_dir} (no config.json)") from None
    except (OSError, ValueError) as error:
        raise RunError(f"{path}: cannot be read ({error})") from None
    if not isinstance(config, dict):
        raise RunError(f"{path}: not Sample Factory's config (a JSON {type(config).__name__})")
    return config


def _read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def frame_factor(config: dict) -> int:
    """What a summary step of the run is multiplied by to give emulator frames: 1 when Sample
    Factory counted frames (`summaries_use_frameskip`, its Atari default), else its skip."""
    if config.get("summaries_use_frameskip", True):
        return 1
    return int(config.get("env_frameskip", 4))


def report(out_dir: str, experiment_dir: str) -> int:
    """Writes `curve.csv` and `peer.json` of the run in `experiment_dir` into `out_dir` and
    prints the headline figures."""
    config = _sf_config(experiment_dir)
    # summary_iterator's deprecation notice is noise for users of this command.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    factor = frame_factor(config)
    games = int(config.get("stats_avg", 100))
    try:
        run = peer_results.load_run(experiment_dir, "sample-factory-pong", games, factor)
    except peer_results.PeerError as error:
        raise RunError(str(error)) from None

    thresholds = BENCHMARKS["pong"].thresholds
    figures = peer_results.figures(run, thresholds, factor)
    budget = config.get("train_for_env_steps")
    trained = checkpoint_frames(experiment_dir)
    trained = None if trained is None else trained * factor
    results = {
        "peer": "sample-factory 2.1.1, APPO (sf_examples.atari.train_atari --env=atari_pong)",
        "command": "python -m benchmarks.peer " + " ".join(sys.argv[1:]),
        # Sample Factory's command line at each of its starts.
        "sf_commands": _read_lines(os.path.join(out_dir, _COMMANDS)),
        "settings": {name: config.get(name) for name in _SETTINGS},
        "return_tag": peer_results.RETURN_TAG,
        "row": peer_results.row_meaning(games),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
        **figures,
        # The latest checkpoint's frames: the learner trains on after the last summary.
        "frames_trained": trained,
        "stopped_early": budget is not None and (trained or 0) < int(budget) * factor,
        "out_dir": out_dir,
    }
    curve_file.write(run.curve, os.path.join(out_dir, "curve.csv"))
    run_folder.write_json(os.path.join(out_dir, "peer.json"), results)
    for line in report_lines(results):
        print(f"[peer] {line}")
    print(f"[peer] {out_dir}/peer.json, {out_dir}/curve.csv (plot with --smooth=1)")
    return 0


def report_lines(results: dict) -> list[str]:
    """The lines printed of a Pong run's figures (`report`)."""

    def frames_text(frames: int | None) -> str:
        return "-" if frames is None else f"{frames / 1e6:.2f}M"

    reached = ", ".join(
        f"{threshold} at {frames_text(frames)}" + ("" if hours is None else f" ({hours:.2f} h)")
        for (threshold, frames), hours in zip(
            results["frames_to_reach"].items(), results["hours_to_reach"].values(), strict=True
        )
    )
    steady, overall = results["frames_per_second_steady"], results["frames_per_second_overall"]
    return [
        f"Sample Factory Pong: {results['games_per_mean']}-game mean "
        f"{results['final_mean_return']:+.2f} at {frames_text(results['frames'])} frames (best "
        f"{results['best_mean_return']:+.2f}); reached {reached}; "
        f"{steady or 0:,.0f} frames/s steady, {overall or 0:,.0f} overall, "
        f"{results['training_hours']:.2f} training hours"
        + (" (stopped before its budget)" if results["stopped_early"] else "")
    ]


# --- the command line --------------------------------------------------------------------------

_FLAGS_OF = {
    "throughput": {"seconds", "skip_seconds", "num_epochs", "extra"},
    "pong": {"out_dir", "frames", "report_only", "extra"},
}


def _check_mode(argv: list[str]) -> str:
    """The mode the command names; UsageError for none, another word, or a flag of the other
    mode."""
    if len(argv) != 2 or argv[1] not in MODES:
        given = " ".join(argv[1:]) or "nothing"
        raise UsageError(f"give one mode, throughput or pong (given: {given})")
    mode = argv[1]
    other = set().union(*_FLAGS_OF.values()) - _FLAGS_OF[mode]
    for name in sorted(other):
        if FLAGS[name].present:
            hint = " (for pong give --extra=--num_epochs=K)" if name == "num_epochs" else ""
            raise UsageError(f"--{name} is not a flag of {mode}{hint}")
    return mode


def main(argv: list[str]) -> int:
    try:
        mode = _check_mode(argv)
        return throughput() if mode == "throughput" else pong()
    except UsageError as error:
        print(f"{SCRIPT}: error: {error}", file=sys.stderr)
        return 2
    except RunError as error:
        print(f"{SCRIPT}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=one_line_flags.parser(SCRIPT))
