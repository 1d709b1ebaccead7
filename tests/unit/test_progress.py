"""The progress line and the episode-score statistics."""

from impala.progress import Progress


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
