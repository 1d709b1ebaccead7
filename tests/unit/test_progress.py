"""The progress line, the episode-score statistics and the time and CPU lines."""

import os
import subprocess
import sys
import time

import pytest

from impala.progress import (
    Progress,
    actor_exit_split,
    core_wait_secs,
    cpu_line,
    learner_time_line,
    thread_core_waits,
)
from impala.trajectory import MAX_ABS_EPISODE_RETURN


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_best_mean_counts_only_full_windows():
    progress = Progress(total_frames=1000, window=3)
    progress.add_episode_returns([100.0, 100.0])
    assert progress.mean_return == 100.0
    assert progress.best_mean_return is None  # fewer than 3 episodes: no full window yet
    progress.add_episode_returns([10.0])
    assert progress.best_mean_return == 70.0
    progress.add_episode_returns([400.0, 400.0, 400.0, 1.0])
    assert progress.best_mean_return == 400.0
    assert progress.mean_return == 267.0
    assert progress.episodes == 7


def test_one_absurd_return_cannot_swamp_the_statistics():
    """The issue's report: one game's return of 1e30 made `best_mean_return` 5e28. A return that
    is not finite or beyond `MAX_ABS_EPISODE_RETURN` (which the transport refuses too) is left
    out and not counted as a game."""
    progress = Progress(total_frames=1000, window=3)
    progress.add_episode_returns([20.0, 1e30, 21.0, float("nan"), -float("inf"), 19.0])
    assert progress.best_mean_return == 20.0 and progress.mean_return == 20.0
    assert progress.episodes == 3
    progress.add_episode_returns([MAX_ABS_EPISODE_RETURN, -MAX_ABS_EPISODE_RETURN])
    assert progress.episodes == 5  # within the bound: a real, if unlikely, score


def test_line_and_summary():
    clock = _Clock()
    progress = Progress(total_frames=200_000_000, window=20, clock=clock)
    clock.now = 10.0
    progress.add_frames(40_000)
    progress.add_episode_returns([-21.0, -20.0])
    assert progress.line() == (
        "frames 40k/200M [--------------------] 0.0% | 4,000 frames/s | return -20.5 (2 ep) | "
        "0:00:10 < 13:53:10"
    )
    clock.now = 20.0
    progress.add_frames(20_000)
    assert "| 2,000 frames/s |" in progress.line()  # the rate since the previous line
    assert progress.summary() == (
        "60k frames in 0:00:20 (3,000 frames/s on average), mean return -20.5 over the last "
        "2 episodes"
    )
    assert not progress.done
    progress.add_frames(200_000_000)
    assert progress.done


def test_learner_time_line_splits_the_steady_time_and_gives_the_train_time_per_batch():
    split = {"train_steps": 6.0, "waiting_for_batch": 3.0, "other": 1.0}
    assert learner_time_line(split, batches=10) == (
        "60% in train steps (0.600 s per batch), 30% waiting for a batch, 10% other"
    )


def test_learner_time_line_gives_the_wait_for_a_core_per_batch():
    split = {"train_steps": 6.0, "waiting_for_batch": 3.0, "other": 1.0}
    assert learner_time_line(split, batches=10, core_wait_secs=2.5) == (
        "60% in train steps (0.600 s per batch), 30% waiting for a batch, 10% other; its threads "
        "waited 0.250 s per batch for a core (summed over threads)"
    )


def _schedstat(task_dir, thread, waited_ns):
    os.makedirs(task_dir / thread)
    (task_dir / thread / "schedstat").write_text(f"123456 {waited_ns} 42\n")


def test_core_waits_count_each_threads_increase_and_a_new_threads_whole_wait(tmp_path):
    _schedstat(tmp_path / "first", "10", 1_000_000_000)
    _schedstat(tmp_path / "first", "11", 5_000_000_000)  # ends before the second reading
    _schedstat(tmp_path / "second", "10", 1_500_000_000)
    _schedstat(tmp_path / "second", "12", 250_000_000)  # started in between
    (tmp_path / "second" / "13").mkdir()  # ended while being read: no schedstat
    (tmp_path / "second" / "14").mkdir()
    (tmp_path / "second" / "14" / "schedstat").write_text("garbage\n")  # not the kernel's format
    since, now = thread_core_waits(tmp_path / "first"), thread_core_waits(tmp_path / "second")
    assert since == {"10": 1_000_000_000, "11": 5_000_000_000}
    assert now == {"10": 1_500_000_000, "12": 250_000_000}
    assert core_wait_secs(since, now) == pytest.approx(0.75)
    assert thread_core_waits(tmp_path / "missing") is None
    assert core_wait_secs(None, now) is None and core_wait_secs(since, None) is None


def test_core_waits_see_another_process_holding_this_ones_core():
    """The kernel's own figure: this process and a busy child pinned to one core take turns, so
    this one, kept busy for a second, waits for a good part of it."""
    if thread_core_waits() is None:
        pytest.skip("this kernel gives no per-thread schedstat")
    core = min(os.sched_getaffinity(0))
    rival = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"]
    )
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.5)  # the rival is running by now
        since = thread_core_waits()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            pass
        waited = core_wait_secs(since, thread_core_waits())
    finally:
        os.sched_setaffinity(0, mask)
        rival.kill()
        rival.wait()
    assert waited > 0.2, waited


def test_learner_time_line_of_a_run_too_short_to_split():
    assert learner_time_line({"train_steps": 0.0, "waiting_for_batch": 0.0, "other": 0.0}, 0) == (
        "too few steps to split the learner's time"
    )
    one_step = {"train_steps": 1.0, "waiting_for_batch": 0.0, "other": 0.0}
    assert "too few" in learner_time_line(one_step, batches=0)


_ACTOR_EXIT = (
    "actor 0: learner finished after 40 unrolls (120 chunks sent, 9 of them to a queue that had "
    "filled while they travelled; 300 calls asking for room; 0.350 CPU seconds per unroll after "
    "the first; its time: 20% acting, 3% fetching weights, 3% sending, 74% waiting for room); "
    "exiting"
)


def test_actor_exit_split_reads_the_actors_last_line():
    split = actor_exit_split(f"actor 0 acting for learner localhost:1\n{_ACTOR_EXIT}\n")
    assert split == (
        "20% acting, 3% fetching weights, 3% sending, 74% waiting for room (40 unrolls, 120 "
        "chunks sent, 9 of them to a queue that had filled while they travelled; 300 calls "
        "asking for room; 0.350 CPU seconds per unroll after the first)"
    )
    assert actor_exit_split("actor 0 acting for learner localhost:1\n") is None


def test_cpu_line_sets_each_sides_cpu_per_batch_against_its_stages_alone():
    # A 16 x 20 batch in 1.739 s, filled by one 16-environment unroll.
    split = actor_exit_split(_ACTOR_EXIT)
    stages = {"train": 2.2, "play": 0.45}
    assert cpu_line(2.68, [split, split], 1.0, stages, 1.739, 2) == (
        "learner 2.68 (the train stage alone: 2.20), actors 0.35 (the env and inference stages "
        "alone: 0.45); the 2 cores 87% busy"
    )
    # Unroll batches of 32 take two unrolls; the actors' CPU is their mean per unroll.
    other = split.replace("0.350 CPU", "0.450 CPU")
    assert "actors 0.80 (" in cpu_line(2.68, [split, other], 2.0, stages, 1.739, 2)
    unknown = "the train stage alone 2.20, the env and inference stages alone 0.45"
    assert cpu_line(None, [split], 1.0, stages, 1.739, 2) == unknown
    assert cpu_line(2.68, [split, "(its log does not say)"], 1.0, stages, 1.739, 2) == unknown
