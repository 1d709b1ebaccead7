"""Replay mixing in the learner (impala/learner/replay.py): the standard replay's ring buffer
and sampling, and batches mixed in the shares --replay_parameters gives."""

import numpy as np
import pytest
import tensorflow as tf

import vtrace
from impala.configs import replay as replay_config
from impala.learner import replay, start
from impala.trajectory import Steps
from impala.transport import QueuedTrajectories

T, NUM_ACTIONS = 4, 3


def _fresh(first: int, count: int) -> QueuedTrajectories:
    """`count` trajectories numbered `first`, ...: each one's number is in its actor task, in
    every observation and in its core state, as the learner dequeues them (time-major)."""
    ids = np.arange(first, first + count)
    rng = np.random.default_rng(first)
    shape = (T + 1, count)
    steps = Steps(
        prev_action=np.zeros(shape, np.int32),
        reward=rng.normal(size=shape).astype(np.float32),
        done=np.zeros(shape, bool),
        observation=np.broadcast_to(ids[None, :, None, None], (*shape, 2, 2)).astype(np.uint8),
        action=rng.integers(0, NUM_ACTIONS, shape).astype(np.int32),
        policy_logits=rng.normal(size=(*shape, NUM_ACTIONS)).astype(np.float32),
    )
    return tf.nest.map_structure(
        tf.convert_to_tensor,
        QueuedTrajectories(
            actor_task=ids.astype(np.int32),
            weight_version=ids.astype(np.int64),
            agent_state=[np.repeat(ids[:, None], 5, axis=1).astype(np.float32)],
            steps=steps,
        ),
    )


def _ids(queued: QueuedTrajectories) -> list[int]:
    ids = np.asarray(queued.actor_task)
    observation = np.asarray(queued.steps.observation)
    # Every part of each trajectory is the same trajectory's.
    np.testing.assert_array_equal(
        observation[:, :, 0, 0], np.broadcast_to(ids, observation.shape[:2])
    )
    np.testing.assert_array_equal(np.asarray(queued.agent_state[0])[:, 0], ids)
    np.testing.assert_array_equal(np.asarray(queued.weight_version), ids)
    return ids.tolist()


def test_a_standard_replay_keeps_the_newest_and_samples_each_once_a_call():
    store = replay.StandardReplay(capacity=5, seed=1)
    store.add(_fresh(0, 3))
    assert store.size == 3
    assert sorted(_ids(store.sample(3))) == [0, 1, 2]
    store.add(_fresh(3, 4))  # 7 added: 0 and 1 replaced
    assert store.size == 5
    seen = set()
    for _ in range(30):
        ids = _ids(store.sample(2))
        assert len(set(ids)) == 2
        seen.update(ids)
    assert seen == {2, 3, 4, 5, 6}
    counts = store.times_sampled()
    # 60 draws, and trajectory 2's from the first call (the others drawn then are replaced).
    assert counts.sum() == 61 and (counts > 0).all()
    store.add(_fresh(7, 1))  # replaces 2, whose count starts again
    assert 2 not in _ids(store.sample(5))
    with pytest.raises(ValueError, match="cannot sample 6 of 5 stored trajectories"):
        store.sample(6)


def test_a_replayed_trajectory_is_the_one_stored_field_for_field():
    store = replay.StandardReplay(capacity=4)
    fresh = _fresh(10, 4)
    store.add(fresh)
    sampled = store.sample(4)
    order = np.argsort(np.asarray(sampled.actor_task))
    for mine, theirs in zip(sampled.steps, fresh.steps, strict=True):
        np.testing.assert_array_equal(np.asarray(mine)[:, order], np.asarray(theirs))
    specs = [tf.TensorSpec(row.shape[1:], row.dtype) for row in replay._rows(fresh)]
    assert replay.StandardReplay.bytes_at_capacity(1000, specs) == 1000 * (
        4 + 8 + 5 * 4 + (T + 1) * (4 + 4 + 1 + 4 + 4 + 4 * NUM_ACTIONS)
    )


def test_replays_that_do_not_fit_in_free_memory_are_refused_for_all_learners_of_the_host():
    gib = 2**30
    assert start.replay_memory_error(gib, 1, 2 * gib) == ""
    assert start.replay_memory_error(gib, 2, 2 * gib) == ""
    assert start.replay_memory_error(gib, 1, None) == ""  # no /proc/meminfo: nothing to check
    alone = start.replay_memory_error(3 * gib, 1, 2 * gib)
    assert alone.startswith("--replay_parameters: the replays would hold 3.0 GiB at capacity, ")
    assert "the 2.0 GiB this machine has free" in alone and "fewer learners" not in alone
    # Each learner fits alone; the three on this host do not.
    three = start.replay_memory_error(gib, 3, 2 * gib)
    assert "would hold 3.0 GiB (1.0 GiB in each of the 3 learners on this host)" in three
    assert "run fewer learners on this host" in three and "\n" not in three


def test_a_first_start_counts_the_runs_learners_on_the_host_and_a_restart_its_own_policys(
    monkeypatch,
):
    """Two policies, one learner each, both on this machine under two spellings: a first start
    counts both (neither holds its replays yet); a policy that started before counts its own,
    as the other policy's replays are no longer free memory."""
    import socket

    from impala.configs import LearnerJobConfig
    from impala.learner.allreduce import Topology

    def getaddrinfo(host, port, type=0):  # this machine's names, whatever its resolver says
        return [(socket.AF_INET, type, 6, "", ("127.0.0.1", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    run = ("localhost:8001", "127.0.0.1:9001")
    policy_1 = LearnerJobConfig(
        secret_file="s", learner_hosts=("127.0.0.1:9001",), run_learner_hosts=run
    )
    alone = Topology(rank=0, size=1, local_rank=0, local_size=1)
    assert start.learners_to_count(policy_1, alone, started_before=False) == 2
    assert start.learners_to_count(policy_1, alone, started_before=True) == 1
    two_here = Topology(rank=0, size=2, local_rank=0, local_size=2)
    assert start.learners_to_count(policy_1, two_here, started_before=True) == 2
    # Names that differ only in case are one host, without asking a resolver.
    upper = LearnerJobConfig(
        secret_file="s", learner_hosts=("N1:9001",), run_learner_hosts=("n1:8001", "N1:9001")
    )
    assert upper.learners_on_host(0) == 2
    # A name and its address, once resolved; another host's address is not counted.
    other = LearnerJobConfig(
        secret_file="s",
        learner_hosts=("n1:9001",),
        run_learner_hosts=("n1:8001", "10.0.0.5:8002", "10.0.0.6:8003", "n1:9001"),
    )
    assert other.learners_on_host(0) == 2
    resolved = {"n1": {"10.0.0.5"}, "10.0.0.5": {"10.0.0.5"}, "10.0.0.6": {"10.0.0.6"}}
    assert other.learners_on_host(0, resolved) == 3


def test_batches_follow_the_ratios_once_the_replay_holds_its_share():
    replays = replay_config.parse(
        '[{"type": "queue", "capacity": 1, "sample_ratio": 0.25},'
        ' {"type": "standard", "capacity": 100, "sample_ratio": 0.75}]'
    )
    mixer = replay.Mixer(replays, batch_size=8, seed=3)
    assert mixer.fresh_share == 2
    # The replay is empty: the first batch is all fresh, and then stored.
    assert mixer.fresh_needed() == 8
    first = mixer.mix(_fresh(0, 8))
    assert _ids(first) == list(range(8)) and mixer.replayed_last == 0
    # From now on 2 fresh and 6 replayed, the replayed ones from what was stored before.
    next_id = 8
    for _ in range(5):
        assert mixer.fresh_needed() == 2
        batch = mixer.mix(_fresh(next_id, 2))
        ids = _ids(batch)
        assert len(ids) == 8 and ids[:2] == [next_id, next_id + 1]
        assert all(i < next_id for i in ids[2:]) and len(set(ids[2:])) == 6
        assert mixer.replayed_last == 6
        assert isinstance(batch.steps.observation, tf.Tensor)
        next_id += 2
    ((_, _, store),) = mixer.replays
    assert store.size == next_id


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[{"type": "standard", "capacity": 9, "sample_ratio": 1}]',
            "needs exactly one queue replay, where the actors' trajectories come in; this list "
            "has 0",
        ),
        (
            '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
            ' {"type": "queue", "capacity": 1, "sample_ratio": 0.5}]',
            "this list has 2",
        ),
    ],
)
def test_a_mix_the_learner_cannot_make_is_refused_in_one_line(text, message):
    with pytest.raises(ValueError, match=message):
        replay.Mixer(replay_config.parse(text), batch_size=8)


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_a_replayed_trajectory_is_corrected_with_its_own_behaviour_policy():
    """V-trace's importance weights of a replayed trajectory are pi / mu with mu the policy
    that acted when it came fresh (its stored logits), pi the learner's policy now: computed
    here from the trajectory as it first came, not from the batch."""
    replays = replay_config.parse(
        '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
        ' {"type": "standard", "capacity": 8, "sample_ratio": 0.5}]'
    )
    mixer = replay.Mixer(replays, batch_size=4, seed=0)
    first = _fresh(0, 4)
    mixer.mix(first)
    batch = mixer.mix(_fresh(4, 2))
    ids = _ids(batch)
    assert ids[:2] == [4, 5] and all(i < 4 for i in ids[2:])
    # The learner's policy now: any logits other than the behaviour's.
    rng = np.random.default_rng(7)
    target = rng.normal(size=(T, 4, NUM_ACTIONS)).astype(np.float32)
    steps = batch.steps
    returns = vtrace.from_logits(
        behaviour_policy_logits=steps.policy_logits[:-1],
        target_policy_logits=target,
        actions=steps.action[:-1],
        discounts=tf.fill([T, 4], 0.99),
        rewards=steps.reward[1:],
        values=tf.zeros([T, 4]),
        bootstrap_value=tf.zeros([4]),
    )
    for column in (2, 3):
        trajectory = ids[column]
        mu = np.asarray(first.steps.policy_logits)[:-1, trajectory]
        actions = np.asarray(first.steps.action)[:-1, trajectory]
        expected = (
            np.take_along_axis(_log_softmax(target[:, column]), actions[:, None], 1)
            - np.take_along_axis(_log_softmax(mu), actions[:, None], 1)
        )[:, 0]
        np.testing.assert_allclose(returns.log_rhos[:, column], expected, rtol=1e-5, atol=1e-5)


ELITE_MIX = (
    '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
    ' {"type": "custom", "capacity": 16, "sample_ratio": 0.5, "dist_function": "ln_norm",'
    ' "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 3,'
    ' "alfa_annealing_factor": 1.0, "elite_sampling_strategy": "STRATEGY"}]'
)


def _moved_by_id(queued):
    """A stand-in for the learner's network (the network is not what is tested): its logits
    are the behaviour's moved by the trajectory's number / 10 on every action, so trajectory
    i is at ln_norm distance sqrt(3) x i / 10 from its behaviour policy."""
    ids = np.asarray(queued.actor_task).astype(np.float32)
    return np.asarray(queued.steps.policy_logits) + ids[None, :, None] / 10


def test_distances_by_hand():
    behaviour = np.zeros((2, 1, 3))
    current = np.array([[[3.0, 4.0, 0.0]], [[1.0, 0.0, 0.0]]])
    np.testing.assert_allclose(replay.distances(behaviour, current, "ln_norm"), [(5 + 1) / 2])
    np.testing.assert_allclose(replay.distances(behaviour, current, "ln_norm", p=1), [(7 + 1) / 2])
    same_direction = np.array([[[1.0, 2.0, 3.0]]])
    np.testing.assert_allclose(
        replay.distances(same_direction, 2 * same_direction, "cos_dist"), [0.0], atol=1e-12
    )
    opposite = replay.distances(same_direction, -same_direction, "cos_dist")
    np.testing.assert_allclose(opposite, [2.0])
    # KL of two softmax policies; 0 for logits that differ by a constant (the same policy).
    assert replay.distances(same_direction, same_direction + 5, "kl_div")[0] == pytest.approx(0)
    p, q = np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.25, 0.5])
    kl = replay.distances(np.log(p)[None, None], np.log(q)[None, None], "kl_div")
    np.testing.assert_allclose(kl, [np.sum(p * np.log(p / q))])


def test_the_four_strategies_by_hand():
    distance = np.array([0.5, 0.1, 0.9, 0.3, 0.7, 0.2])
    never = np.zeros(6)
    assert sorted(replay.select(distance, never, 2, "strategy1", 1.0)) == [1, 5]
    # Sorted: 1, 5, 3, 0, 4, 2; in 2 groups of 3, the closest of each: 1 and 0.
    assert sorted(replay.select(distance, never, 2, "strategy2", 1.0)) == [0, 1]
    # The two closest were sampled often: preferring the least sampled picks 3 and 0.
    sampled = np.array([0, 6, 0, 0, 0, 6])
    assert sorted(replay.select(distance, sampled, 2, "strategy3", 1.0)) == [0, 3]
    assert sorted(replay.select(distance, sampled, 2, "strategy3", 0.0)) == [1, 5]
    assert len(replay.select(distance, sampled, 3, "strategy4", 1.0)) == 3


@pytest.mark.parametrize("background", [False, True])
def test_elite_replay_takes_the_trajectories_whose_policy_moved_least(background):
    replays = replay_config.parse(ELITE_MIX.replace("STRATEGY", "strategy1"))
    mixer = replay.Mixer(replays, batch_size=4, seed=2, encode=_moved_by_id, background=background)
    mixer.mix(_fresh(0, 4))
    mixer.mix(_fresh(4, 2))
    mixer.mix(_fresh(6, 2))  # stored: 0 to 7
    ((_, _, elite),) = mixer.replays
    for batch_number in range(4):
        next_id = 8 + 2 * batch_number
        batch = mixer.mix(_fresh(next_id, 2))
        replayed = _ids(batch)[2:]
        # 6 candidates (3 x 2) drawn from what was stored before this batch; the two closest
        # to their behaviour policy are the two lowest numbers among them.
        assert len(replayed) == 2 and all(i < next_id for i in replayed)
        np.testing.assert_allclose(
            sorted(mixer.distances_last[0]), sorted(np.sqrt(3) * np.array(replayed) / 10), rtol=1e-5
        )
    mixer.close()
    assert elite.times_sampled().sum() >= 8


def test_an_elite_replay_needs_the_network_and_a_failure_in_the_background_surfaces():
    replays = replay_config.parse(ELITE_MIX.replace("STRATEGY", "strategy2"))
    with pytest.raises(ValueError, match="an elite replay needs the learner's network"):
        replay.Mixer(replays, batch_size=4)

    def broken(queued):
        raise RuntimeError("the network failed")

    mixer = replay.Mixer(replays, batch_size=4, encode=broken)
    mixer.mix(_fresh(0, 4))  # the replay now holds its share: the background samples, fails
    with pytest.raises(RuntimeError, match="the network failed"):
        mixer.mix(_fresh(4, 2))
