"""benchmarks.ceiling (make bench's ceiling): it counts a replay mix's fresh share of each
batch."""

import pytest

from benchmarks.ceiling import Stages, fresh_fraction, per_batch
from benchmarks.stages import Stage

MIX = (
    '[{"type": "queue", "capacity": 1, "sample_ratio": 0.25},'
    ' {"type": "standard", "capacity": 100, "sample_ratio": 0.75}]'
)


def _stages(env: float, inference: float, train: float) -> Stages:
    return Stages(*(Stage(rate, 0.0) for rate in (env, inference, train)))


def test_the_ceiling_without_replay_is_the_three_stages_one_after_another():
    stages = _stages(4000.0, 4000.0, 1000.0)
    assert stages.ceiling_fresh() == pytest.approx(1 / (1 / 4000 + 1 / 4000 + 1 / 1000))


def test_a_replay_mix_trains_each_new_frame_as_often_as_the_batch_is_larger():
    stages = _stages(4000.0, 4000.0, 1000.0)
    # A quarter of each batch is new: the train stage consumes new frames at 250/s.
    assert stages.ceiling_fresh(0.25) == pytest.approx(1 / (1 / 4000 + 1 / 4000 + 1 / 250))


def test_the_fresh_fraction_is_the_queue_s_share_of_the_batch():
    assert fresh_fraction("", 16) == 1.0
    assert fresh_fraction(MIX, 16) == 4 / 16
    # 0.25 x 10 = 2.5 trajectories: the queue's remainder ties the replay's and wins it.
    assert fresh_fraction(MIX, 10) == 3 / 10


def test_a_batch_of_a_mix_costs_the_actors_its_fresh_trajectories_only():
    # Batches of 16 x 20 steps, half fresh, at 400 fresh agent steps/s end to end; actors of 16
    # environments. The learner trains on all 320 steps; the actors played 160 of them, half
    # an unroll; the 160 fresh steps took 0.4 s.
    batch = per_batch(20, 16, 0.5, 16, 400.0, train_cpu_per_step=0.002, play_cpu_per_step=0.001)
    assert batch.stage_cpu == pytest.approx({"train": 0.64, "play": 0.16})
    assert batch.unrolls == 0.5 and batch.seconds == pytest.approx(0.4)
    # Without replay: the whole batch is fresh.
    whole = per_batch(20, 16, 1.0, 16, 400.0, train_cpu_per_step=0.002, play_cpu_per_step=0.001)
    assert whole.stage_cpu["play"] == pytest.approx(0.32) and whole.seconds == pytest.approx(0.8)
