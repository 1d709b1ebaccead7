"""Training progress: honest frame counts, rates and recent episode scores, as one console line."""

from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Iterable

import numpy as np

from impala.trajectory import MAX_ABS_EPISODE_RETURN


class Progress:
    """Tracks frames and finished episodes and formats a progress line.

    Frames are emulator frames (agent steps times frame skip), the unit the IMPALA paper's budgets
    are given in. Rates are measured over the time since the previous report, so they reflect the
    current speed, not an average diluted by start-up.
    """

    def __init__(
        self, total_frames: int, window: int = 20, clock=time.monotonic, start_frames: int = 0
    ):
        self.total_frames = total_frames
        self.frames = start_frames  # a resumed run starts where it stopped
        self.episodes = 0
        # The best mean over a full window of recent episodes so far.
        self.best_mean_return: float | None = None
        self._returns: collections.deque[float] = collections.deque(maxlen=window)
        self._clock = clock
        self._start = clock()
        self._last_time = self._start
        self._last_frames = start_frames
        self._start_frames = start_frames

    def add_frames(self, frames: int) -> None:
        self.frames += frames

    def add_episode_returns(self, returns: Iterable[float]) -> None:
        """Counts finished games; one whose return is not finite or beyond
        `MAX_ABS_EPISODE_RETURN` is left out, so that no one score swamps the means."""
        for episode_return in returns:
            if not abs(float(episode_return)) <= MAX_ABS_EPISODE_RETURN:  # NaN too
                continue
            self._returns.append(float(episode_return))
            self.episodes += 1
            if len(self._returns) == self._returns.maxlen:
                mean = float(np.mean(self._returns))
                if self.best_mean_return is None or mean > self.best_mean_return:
                    self.best_mean_return = mean

    @property
    def done(self) -> bool:
        return self.frames >= self.total_frames

    @property
    def mean_return(self) -> float | None:
        """Mean real game score of the most recent episodes, None before the first ends."""
        return float(np.mean(self._returns)) if self._returns else None

    def rate(self) -> float:
        """Frames per second since the previous call (or since the start)."""
        now = self._clock()
        elapsed = max(now - self._last_time, 1e-9)
        rate = (self.frames - self._last_frames) / elapsed
        self._last_time, self._last_frames = now, self.frames
        return rate

    def line(self, rate: float | None = None) -> str:
        """The progress line, e.g.

        frames 1.2M/200M [----] 0.6% | 3,400 frames/s | return 12.3 (20 ep) | 0:05:10 < 16:20:00

        Args:
          rate: frames/s to show, if the caller measured it with `rate()`; else measured here.
        """
        fraction = min(self.frames / self.total_frames, 1.0)
        rate = self.rate() if rate is None else rate
        elapsed = self._clock() - self._start
        done_here = self.frames - self._start_frames
        if done_here > 0:
            remaining = elapsed * max(self.total_frames - self.frames, 0) / done_here
        else:
            remaining = float("nan")
        score = (
            "return n/a"
            if self.mean_return is None
            else f"return {self.mean_return:.1f} ({len(self._returns)} ep)"
        )
        return (
            f"frames {_si(self.frames)}/{_si(self.total_frames)} {_bar(fraction)} "
            f"{100 * fraction:.1f}% | {rate:,.0f} frames/s | {score} | "
            f"{_clock(elapsed)} < {_clock(remaining)}"
        )

    def summary(self) -> str:
        """A closing line: frames, wall time, average rate and the recent score."""
        elapsed = self._clock() - self._start
        score = (
            "no episode finished"
            if self.mean_return is None
            else (f"mean return {self.mean_return:.1f} over the last {len(self._returns)} episodes")
        )
        done_here = self.frames - self._start_frames
        return (
            f"{_si(done_here)} frames in {_clock(elapsed)} "
            f"({done_here / max(elapsed, 1e-9):,.0f} frames/s on average), {score}"
        )


def _bar(fraction: float, width: int = 20) -> str:
    filled = round(fraction * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _si(count: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.0f}"


def _clock(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?:??:??"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def thread_core_waits(task_dir: str = "/proc/self/task") -> dict[str, int] | None:
    """Nanoseconds each live thread of this process has spent runnable but not running: waiting
    for a core that another thread or process held (the second field of Linux's per-thread
    `schedstat`). None where the kernel does not say (not Linux, or built without it)."""
    try:
        threads = os.listdir(task_dir)
    except OSError:
        return None
    waits = {}
    for thread in threads:
        try:
            with open(os.path.join(task_dir, thread, "schedstat")) as f:
                waits[thread] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that has just exited, or no such field
    return waits or None


def core_wait_secs(since: dict[str, int] | None, now: dict[str, int] | None) -> float | None:
    """Seconds the threads waited for a core between two `thread_core_waits`: each thread's
    increase, and all of the wait of a thread started in between (a thread that ended in
    between takes its wait with it: short-lived RPC threads are undercounted)."""
    if since is None or now is None:
        return None
    return sum(max(0, wait - since.get(thread, 0)) for thread, wait in now.items()) / 1e9


def learner_time_line(
    steady_secs: dict[str, float], batches: int, core_wait_secs: float | None = None
) -> str:
    """Where a learner's steady-state time went, from its summary (`learner_<rank>.json`):
    `steady_secs` splits it into train steps, waiting for a batch and the rest, over `batches`
    batches. A learner that waits is fed too slowly; one that does not is the bottleneck.
    `core_wait_secs` (its threads' seconds runnable but not running, summed over threads) says
    how much of its step the cores it shares took from it."""
    total = sum(steady_secs.values())
    if total <= 0 or batches <= 0:
        return "too few steps to split the learner's time"
    train = steady_secs["train_steps"]
    line = (
        f"{train / total:.0%} in train steps ({train / batches:.3f} s per batch), "
        f"{steady_secs['waiting_for_batch'] / total:.0%} waiting for a batch, "
        f"{steady_secs['other'] / total:.0%} other"
    )
    if core_wait_secs is not None:
        line += (
            f"; its threads waited {core_wait_secs / batches:.3f} s per batch for a core "
            "(summed over threads)"
        )
    return line


def actor_exit_split(log: str) -> str | None:
    """Where an actor's time went and what it sent, from the line it logs when its learner has
    finished: '24% acting, ... waiting for room (240 unrolls, 720 chunks sent, ...)'; None if
    `log` has no such line."""
    found = re.search(
        r"learner finished after (\d+) unrolls \((.*); its time: (.*)\); exiting", log
    )
    if not found:
        return None
    unrolls, sent, split = found.groups()
    return f"{split} ({unrolls} unrolls, {sent})"


def cpu_line(
    learner_cpu_per_batch: float | None,
    actor_splits: Iterable[str],
    unrolls_per_batch: float,
    stages: dict[str, float],
    seconds_per_batch: float,
    cores: int,
) -> str:
    """CPU seconds per batch end to end against the stages alone: what a system spends beyond
    the computation its ceiling counts (transport, polling, contention), e.g. 'learner 2.68
    (the train stage alone: 2.20), actors 0.70 (the env and inference stages alone: 0.41);
    the 2 cores 94% busy'.

    Args:
      learner_cpu_per_batch: the learner's CPU seconds per batch end to end (None: unknown).
      actor_splits: each actor's `actor_exit_split`, which gives its CPU seconds per unroll.
      unrolls_per_batch: actors' unrolls a batch takes (batch size / environments per actor).
      stages: CPU seconds per batch of the stages alone: "train", and "play" (env and
        inference).
      seconds_per_batch: wall-clock seconds per batch end to end.
      cores: the machine's cores.
    """
    alone = (
        f"the train stage alone {stages['train']:.2f}, "
        f"the env and inference stages alone {stages['play']:.2f}"
    )
    per_unroll = [re.search(r"([\d.]+) CPU seconds per unroll", s) for s in actor_splits]
    if learner_cpu_per_batch is None or not per_unroll or not all(per_unroll):
        return alone
    actors = float(np.mean([float(found.group(1)) for found in per_unroll])) * unrolls_per_batch
    busy = (learner_cpu_per_batch + actors) / (cores * seconds_per_batch)
    return (
        f"learner {learner_cpu_per_batch:.2f} (the train stage alone: {stages['train']:.2f}), "
        f"actors {actors:.2f} (the env and inference stages alone: {stages['play']:.2f}); "
        f"the {cores} cores {busy:.0%} busy"
    )
