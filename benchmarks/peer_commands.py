"""Sample Factory's command lines for `benchmarks.peer` (pure: nothing here runs anything), and
what its experiment folder says of a run's progress."""

from __future__ import annotations

import os
import re

EXPERIMENT = "pong"  # Sample Factory's experiment name in `--out_dir/sf/`
# What every run is given: the game, the CPU, and the workers our actors have (2 processes of
# 8 environments each). Its Atari settings are synchronous (`--async_rl=False`): an iteration
# must train on exactly one rollout of every environment, 128 steps each, in minibatches of 256,
# and its default of 4 minibatches fits its default 8 environments, not 16 (it refuses to start:
# "Ratio is 0.5 (should be a positive integer)"). 8 minibatches keep all else as it is: each
# sample is still trained on --num_epochs (4) times, in minibatches of 256.
BASE_FLAGS = (
    "--env=atari_pong",
    "--device=cpu",
    "--num_workers=2",
    "--num_envs_per_worker=8",
    "--num_batches_per_epoch=8",
)
# Flags the benchmark sets, or whose change would make its figures mean something else.
RESERVED = {
    "env",
    "device",
    "num_workers",
    "num_envs_per_worker",
    "experiment",
    "train_dir",
    "train_for_env_steps",
    "train_for_seconds",
    "restart_behavior",
    "summaries_use_frameskip",
}
_CHECKPOINT = re.compile(r"^checkpoint_\d+_(\d+)\.pth$")


class UsageError(Exception):
    """A bad command line or `--out_dir`: one line, exit status 2."""


def check_extra(extra: list[str], reserved: set[str]) -> None:
    """UsageError unless each of `extra` is `--name=value` and sets no flag in `reserved`."""
    for flag in extra:
        name, equals, _ = flag.removeprefix("--").partition("=")
        if not flag.startswith("--") or not equals or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise UsageError(f"--extra={flag}: give a Sample Factory flag as --name=value")
        if name in reserved:
            raise UsageError(
                f"--extra={flag}: the benchmark sets --{name} itself"
                + (" (give --num_epochs)" if name == "num_epochs" else "")
            )


def sf_command(python: str, train_dir: str, experiment: str, *flags_: str) -> list[str]:
    """Sample Factory's Atari example on Pong, on the CPU with our actors' workers."""
    return [
        python,
        "-m",
        "sf_examples.atari.train_atari",
        *BASE_FLAGS,
        f"--experiment={experiment}",
        f"--train_dir={train_dir}",
        *flags_,
    ]


def throughput_command(
    python: str, train_dir: str, seconds: float, num_epochs: int, extra: list[str]
) -> list[str]:
    """The throughput run: Sample Factory under `timeout`, which sends Ctrl-C's signal when the
    time is up (it saves and stops) and kills it 30 s later if it has not."""
    epochs = [f"--num_epochs={num_epochs}"] if num_epochs else []
    return [
        "timeout",
        "--signal=INT",
        "--kill-after=30",
        f"{seconds:g}",
        *sf_command(
            python,
            train_dir,
            "throughput",
            "--encoder_conv_architecture=convnet_atari",
            *epochs,
            *extra,
        ),
    ]


def pong_command(python: str, train_dir: str, frames: float, extra: list[str]) -> list[str]:
    """The Pong run: Sample Factory's own settings, to `frames` emulator frames."""
    return sf_command(python, train_dir, EXPERIMENT, f"--train_for_env_steps={frames:.0f}", *extra)


def checkpoint_frames(experiment_dir: str) -> int | None:
    """The frames of the latest checkpoint in a Sample Factory experiment folder (its name,
    `checkpoint_<train step>_<env steps>.pth`, tells them), None if it has none."""
    folder = os.path.join(experiment_dir, "checkpoint_p0")
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    found = [int(m.group(1)) for name in names if (m := _CHECKPOINT.match(name))]
    return max(found) if found else None
