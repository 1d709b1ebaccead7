"""The progress line and the episode-score statistics."""

from impala.progress import Progress, learner_time_line


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


def test_learner_time_line_splits_the_steady_time_and_gives_the_train_time_per_batch():
    split = {"train_steps": 6.0, "waiting_for_batch": 3.0, "other": 1.0}
    assert learner_time_line(split, batches=10) == (
        "60% in train steps (0.600 s per batch), 30% waiting for a batch, 10% other"
    )


def test_learner_time_line_of_a_run_too_short_to_split():
    assert learner_time_line({"train_steps": 0.0, "waiting_for_batch": 0.0, "other": 0.0}, 0) == (
        "too few steps to split the learner's time"
    )
    one_step = {"train_steps": 1.0, "waiting_for_batch": 0.0, "other": 0.0}
    assert "too few" in learner_time_line(one_step, batches=0)
