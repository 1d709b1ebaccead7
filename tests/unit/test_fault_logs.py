"""benchmarks.fault_logs: the fault-injection figures read from a learners' log."""

import math
import time

from benchmarks import fault_logs

LOG = """\
10:00:00 frames 1.5k/20k [#---] 7.5% | 300 frames/s | return n/a
10:00:05 frames 3k/20k [#---] 15.0% | 300 frames/s | return -1.0 (2 ep)
10:00:06 checkpoint runs/x/checkpoints/ckpt-3 at 3200 frames
10:00:10 frames 4.5k/20k [#---] 22.5% | 300 frames/s | return -1.0 (2 ep)
10:00:20 resumed from runs/x/checkpoints/ckpt-3: 3200 frames done
10:00:24 frames 4k/20k [#---] 20.0% | 200 frames/s | return n/a
10:01:00 frames 1.2M/20M [#---] 6.0% | 200 frames/s | return n/a
10:01:30 done: 20000 frames
"""


def test_progress_lines_are_read_with_their_suffixes():
    assert fault_logs.progress_frames(LOG) == [1500, 3000, 4500, 4000, 1_200_000]
    assert fault_logs.frames_logged("10:00:06 checkpoint c at 3200 frames\n") == 3200
    assert fault_logs.frames_logged("") == 0
    assert fault_logs.DONE.findall(LOG) == ["10:01:30"]
    assert fault_logs.RESUMED.findall(LOG) == [("runs/x/checkpoints/ckpt-3", "3200")]


def test_the_rate_before_a_kill_is_taken_from_the_progress_lines_clock_times():
    assert fault_logs.rate_before_kill(LOG, [1500, 3000, 4500]) == 3000 / 10
    assert math.isnan(fault_logs.rate_before_kill(LOG, [1500]))


def test_seconds_lost_and_recovery_are_counted_from_the_kill(monkeypatch):
    # The kill's monotonic time, as its time of day: here the time of day itself.
    monkeypatch.setattr(fault_logs, "clock", int)
    killed = fault_logs.seconds_of_day("10:00:12")
    assert killed == 36_012
    # From the checkpoint resumed from (10:00:06) to the kill; none saved at 999 frames.
    assert fault_logs.secs_lost(LOG, 3200, killed) == 6
    assert fault_logs.secs_lost(LOG, 999, killed) is None
    # To the first progress line after the resume (10:00:24).
    assert fault_logs.learner_recovery(LOG, killed) == 12


def test_a_monotonic_time_reads_as_the_clock_now():
    now = fault_logs.seconds_of_day(time.strftime("%H:%M:%S"))
    assert fault_logs.clock(time.monotonic()) - now in (0, 1, -86_399)
