"""What a fault-injection run's logs say (`benchmarks/faults.py`): the learners' progress,
checkpoint and resume lines, read into frames and times of day."""

from __future__ import annotations

import re
import time

PROGRESS = re.compile(r"^(\d\d:\d\d:\d\d) frames ([\d.]+)([kM]?)/")
RESUMED = re.compile(r"resumed from (\S+): (\d+) frames done")
CHECKPOINT = re.compile(r"^(\d\d:\d\d:\d\d) checkpoint \S+ at (\d+) frames")
DONE = re.compile(r"^(\d\d:\d\d:\d\d) done: ", re.MULTILINE)
SUFFIX = {"": 1, "k": 1_000, "M": 1_000_000}


def progress_frames(log: str) -> list[int]:
    """The frame counts of every progress line of a learners' log, in order."""
    return [
        round(float(m[2]) * SUFFIX[m[3]])
        for m in (PROGRESS.match(line) for line in log.splitlines())
        if m
    ]


def read(path: str) -> str:
    """A file's text, or "" if it is not there (yet)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def frames_logged(log: str) -> int:
    """The most frames the log says the learners reached: progress and checkpoint lines."""
    saved = [int(m[2]) for m in map(CHECKPOINT.match, log.splitlines()) if m]
    return max([0, *progress_frames(log), *saved])


def seconds_of_day(text: str) -> int:
    """'HH:MM:SS', a log line's time, as seconds since midnight."""
    hours, minutes, seconds = (int(part) for part in text.split(":"))
    return 3600 * hours + 60 * minutes + seconds


def rate_before_kill(log: str, before: list[int]) -> float:
    """Frames per second over the progress lines before the kill (their clock times)."""
    clocks = [
        seconds_of_day(m[1]) for m in (PROGRESS.match(line) for line in log.splitlines()) if m
    ][: len(before)]
    if len(before) < 2 or clocks[-1] == clocks[0]:
        return float("nan")
    return (before[-1] - before[0]) / (clocks[-1] - clocks[0])


def clock(monotonic: float) -> int:
    """A monotonic time as the seconds of the day that log lines carry."""
    wall = monotonic + time.time() - time.monotonic()
    return seconds_of_day(time.strftime("%H:%M:%S", time.localtime(wall)))


def secs_lost(log: str, resumed_frames: int, killed_at: float) -> int | None:
    """Seconds of training between the checkpoint resumed from and the kill (whole seconds)."""
    saved = [
        seconds_of_day(m[1])
        for m in (CHECKPOINT.match(line) for line in log.splitlines())
        if m and int(m[2]) == resumed_frames
    ]
    return clock(killed_at) - saved[-1] if saved else None


def learner_recovery(log: str, killed_at: float) -> float | None:
    """Seconds from the kill to the restarted learners' first progress line."""
    killed = clock(killed_at)
    after_resume = log[log.rindex("resumed from") :]
    for line in after_resume.splitlines():
        match = PROGRESS.match(line)
        if match:
            return seconds_of_day(match[1]) - killed
    return None
