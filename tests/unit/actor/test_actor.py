"""The actor's unrolls: overlap by one step, episode resets, carried core state, weight versions."""

import dataclasses
import itertools
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import networks
from impala import envs, run_secret, run_tls
from impala.actor import loop as actor_loop
from impala.actor.actor import Actor
from impala.configs import GameConfig

VECTOR_SHAPE = (16,)


def _counter_env(num_envs, episode_length, observation_shape=VECTOR_SHAPE):
    config = envs.EnvConfig(
        level_name=envs.COUNTER_LEVEL,
        num_envs=num_envs,
        env_kwargs={"episode_length": episode_length, "observation_shape": observation_shape},
    )
    return envs.make_environment(config)


def _decode(observation):
    return envs.decode_counter(observation, observation_rank=observation.ndim - 2)


def _episode_step(observation):
    return envs.decode_episode_step(observation, observation_rank=observation.ndim - 2)


def test_unrolls_overlap_by_one_step_and_count_up():
    tf.random.set_seed(0)
    with _counter_env(num_envs=3, episode_length=7) as env:
        agent = networks.make_agent("MLPAgent", env.num_actions)
        actor = Actor(env, agent, unroll_length=5, seed=0)
        unrolls = [actor.unroll() for _ in range(4)]

    for unroll in unrolls:
        assert unroll.steps.observation.shape == (6, 3, *VECTOR_SHAPE)
        assert unroll.steps.policy_logits.shape == (6, 3, env.num_actions)
        counters = _decode(unroll.steps.observation)
        np.testing.assert_array_equal(np.diff(counters, axis=0), 1)
        # `done` marks exactly the first observation of each new episode.
        np.testing.assert_array_equal(
            unroll.steps.done[1:], _episode_step(unroll.steps.observation)[1:] == 0
        )
        np.testing.assert_array_equal(unroll.steps.prev_action[1:], unroll.steps.action[:-1])
    for before, after in itertools.pairwise(unrolls):
        for field in ("observation", "reward", "done", "action", "policy_logits", "prev_action"):
            np.testing.assert_array_equal(
                getattr(before.steps, field)[-1], getattr(after.steps, field)[0]
            )

    first = unrolls[0]
    np.testing.assert_array_equal(_decode(first.steps.observation)[0], [0, 0, 0])
    assert first.steps.done[0].all()
    # An episode of 7 steps ends between steps 6 and 7 of the stream: done at counter 7, 14.
    counters = np.concatenate([u.steps.observation for u in unrolls])
    assert (_episode_step(counters)[_decode(counters) % 7 == 0] == 0).all()


@pytest.mark.parametrize(
    "agent_name,observation_shape",
    [("MLPAgent", VECTOR_SHAPE), ("ResNetLSTMAgent", envs.ATARI_OBSERVATION_SHAPE)],
)
def test_learner_reproduces_behaviour_logits_from_the_recorded_state(agent_name, observation_shape):
    # The learner re-runs the network over each unroll starting from `agent_state`; with the
    # same weights it must get exactly the logits that chose the actions, resets included.
    tf.random.set_seed(1)
    with _counter_env(num_envs=2, episode_length=4, observation_shape=observation_shape) as env:
        agent = networks.make_agent(agent_name, env.num_actions)
        actor = Actor(env, agent, unroll_length=3, seed=1)
        unrolls = [actor.unroll() for _ in range(3)]

    states = [unroll.agent_state for unroll in unrolls]
    if agent.is_recurrent:
        # Carried across unrolls: not the initial state after the first one.
        assert not np.allclose(tf.nest.flatten(states[2])[0], 0)
    for unroll in unrolls:
        inputs = networks.AgentInput(
            prev_action=unroll.steps.prev_action,
            reward=unroll.steps.reward,
            done=unroll.steps.done,
            observation=unroll.steps.observation,
        )
        outputs, _ = agent.unroll(inputs, unroll.agent_state)
        np.testing.assert_allclose(outputs.policy_logits, unroll.steps.policy_logits, atol=1e-5)


def test_set_weights_changes_the_policy_and_tags_unrolls():
    tf.random.set_seed(2)
    with _counter_env(num_envs=2, episode_length=5) as env:
        agent = networks.make_agent("MLPAgent", env.num_actions)
        actor = Actor(env, agent, unroll_length=2, seed=2)
        before = actor.unroll()
        assert before.weight_version == -1
        weights = [np.full(v.shape, 0.01, v.dtype.as_numpy_dtype) for v in actor.variables]
        actor.set_weights(weights, version=7)
        after = actor.unroll()
    assert after.weight_version == 7
    for variable in actor.variables:
        np.testing.assert_allclose(variable.numpy(), 0.01)
    # Steps 1..T were chosen by the new weights: identical parameters give identical logits
    # for every action.
    assert not np.allclose(before.steps.policy_logits[1:], after.steps.policy_logits[1:])


@pytest.mark.parametrize(
    "agent_name,observation_shape",
    [("MLPAgent", VECTOR_SHAPE), ("ResNetLSTMAgent", envs.ATARI_OBSERVATION_SHAPE)],
)
def test_the_next_unrolls_first_step_decided_again_is_the_new_weights_on_every_step(
    agent_name, observation_shape
):
    """Synchronous collection's lag 0: after new weights, the overlap step is decided again, so
    the next unroll is the new weights' on all T + 1 steps (the learner reproduces every logit
    from its recorded state), and it still begins where the sent one ended."""
    tf.random.set_seed(4)
    followings, initial = [], []
    for decide_again in (True, False):  # the second, a twin that keeps the old decision
        with _counter_env(2, episode_length=4, observation_shape=observation_shape) as env:
            agent = networks.make_agent(agent_name, env.num_actions)
            if not decide_again:
                networks.build_variables(agent, env.observation_shape, env.observation_dtype)
                for variable, value in zip(agent.variables, initial, strict=True):
                    variable.assign(value)
            actor = Actor(env, agent, unroll_length=3, seed=4)
            sent = actor.unroll()
            initial = [v.numpy() for v in actor.variables]
            weights = [v + 0.05 * np.sign(v + 0.5) for v in initial]
            actor.set_weights(weights, version=1)
            assert actor.first_step_version == -1
            if decide_again:
                actor.decide_first_step_again()
                assert actor.first_step_version == 1
            followings.append(actor.unroll())
    following, twins = followings
    # The state the learner starts the next unroll from is the one before the step decided again
    # (not one step further on), whether or not it was decided again.
    for state, twin in zip(
        tf.nest.flatten(following.agent_state), tf.nest.flatten(twins.agent_state), strict=True
    ):
        np.testing.assert_array_equal(state, twin)

    for field in ("observation", "reward", "done", "prev_action"):
        np.testing.assert_array_equal(
            getattr(sent.steps, field)[-1], getattr(following.steps, field)[0]
        )
    inputs = networks.AgentInput(
        following.steps.prev_action,
        following.steps.reward,
        following.steps.done,
        following.steps.observation,
    )
    outputs, _ = agent.unroll(inputs, following.agent_state)
    np.testing.assert_allclose(outputs.policy_logits, following.steps.policy_logits, atol=1e-5)
    # The first step's logits are the new weights', not those the sent unroll chose it with.
    assert not np.allclose(following.steps.policy_logits[0], sent.steps.policy_logits[-1])
    np.testing.assert_array_equal(following.steps.prev_action[1], following.steps.action[0])


def test_sampling_is_seeded():
    def run(seed):
        tf.random.set_seed(3)
        with _counter_env(num_envs=4, episode_length=50) as env:
            actor = Actor(env, networks.make_agent("MLPAgent", env.num_actions), 8, seed=seed)
            return actor.unroll().steps.action

    np.testing.assert_array_equal(run(5), run(5))
    assert not np.array_equal(run(5), run(6))


def test_every_environment_of_every_actor_and_run_seed_gets_its_own_seed():
    num_envs = 16
    env_seeds, sampling_seeds = set(), set()
    for seed in range(4):
        for task in range(8):
            env_seed, sampling_seed = actor_loop.derived_seeds(seed, task, num_envs)
            assert env_seed >= 0 and env_seed + num_envs - 1 < 2**31
            env_seeds.update(range(env_seed, env_seed + num_envs))
            sampling_seeds.add(sampling_seed)
    assert len(env_seeds) == 4 * 8 * num_envs  # no environment stream is shared
    assert len(sampling_seeds) == 4 * 8
    assert actor_loop.derived_seeds(3, 5, num_envs) == actor_loop.derived_seeds(3, 5, num_envs)


class _FakeTime:
    """`time` for the actor loop, on a clock that only `sleep` moves; `at(t, action)` runs
    `action` once the clock reaches t."""

    def __init__(self):
        self.now = 0.0
        self.actions = []

    def monotonic(self):
        return self.now

    def sleep(self, secs):
        self.now += secs
        for due, action in list(self.actions):
            if self.now >= due:
                self.actions.remove((due, action))
                action()

    def at(self, due, action):
        self.actions.append((due, action))


_GAME_SETTINGS = {field.name for field in dataclasses.fields(GameConfig)}


def _actor_job(**settings) -> actor_loop.ActorJobConfig:
    """An actor's job config for the counter game with these job and game settings."""
    game = {name: value for name, value in settings.items() if name in _GAME_SETTINGS}
    job = {name: value for name, value in settings.items() if name not in _GAME_SETTINGS}
    return actor_loop.ActorJobConfig(
        game=GameConfig(**{"level_name": envs.COUNTER_LEVEL, **game}),
        agent_name="MLPAgent",
        unroll_length=20,
        **job,
    )


def test_an_actor_waiting_for_the_run_secret_says_so_once_then_every_30_s(tmp_path, monkeypatch):
    clock = _FakeTime()
    monkeypatch.setattr(actor_loop, "time", clock)
    path = str(tmp_path / "secret")
    clock.at(65.0, lambda: run_secret.create(path))  # the learner writes it after 65 s
    config = _actor_job(task=2, learner_hosts=("localhost:1",), secret_file=path)
    reports = []
    assert actor_loop._read_secret(config, reports.append) == run_secret.load(path)
    assert reports == [f"actor 2: waiting for the run secret at {path}"] * 3  # at 0, 30, 60 s


def test_an_actor_waits_for_the_tls_bundle_beside_its_secret_but_not_for_a_bad_one(
    tmp_path, monkeypatch
):
    clock = _FakeTime()
    monkeypatch.setattr(actor_loop, "time", clock)
    path = str(tmp_path / run_tls.FILE_NAME)
    clock.at(35.0, lambda: run_tls.create(path))  # the learner writes it after 35 s
    config = _actor_job(
        task=2,
        learner_hosts=("localhost:1",),
        secret_file=str(tmp_path / "secret"),
        transport_tls=True,
    )
    reports = []
    assert actor_loop._read_tls(config, reports.append) == run_tls.load(path)
    assert reports == [f"actor 2: waiting for the run's TLS bundle at {path}"] * 2  # at 0, 30 s
    os.chmod(path, 0o644)
    started = clock.now
    with pytest.raises(run_tls.TlsError, match="open to other users"):
        actor_loop._read_tls(config, reports.append)
    assert clock.now == started


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_envs", 0, "--num_envs_per_actor=0: must be at least 1"),
        ("threads", 0, "--actor_threads=0: must be from 1 to 256"),
        ("threads", 10**9, "--actor_threads=1000000000: must be from 1 to 256"),
        ("connect_timeout_secs", 0.0, "--connect_timeout_secs=0.0: must be a finite number > 0"),
        ("num_action_repeats", 0, "--num_action_repeats=0: must be at least 1"),
        ("seed", -1, "--seed=-1: must be >= 0"),
        ("repeat_action_probability", 1.5, "--repeat_action_probability=1.5: must be a number"),
        ("frame_skip", 1, "--frame_skip=1: must be 0 (the default: 4, DeepMind's) or an"),
        ("frame_pooling", "mean", "--frame_pooling='mean': must be one of max, last (max: the"),
    ],
)
def test_an_actor_refuses_its_job_flags_in_the_launchers_line(field, value, message):
    # The actor's own check, for an actor started by hand: the launchers give the same line.
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        _actor_job(secret_file="secret", **{field: value})


def test_the_actors_time_split_takes_the_wait_for_room_out_of_sending():
    counts = actor_loop._Counts(
        acting_secs=4.0, weights_secs=1.0, sending_secs=5.0, room_wait_secs=3.0
    )
    assert counts.time_split() == (
        "40% acting, 10% fetching weights, 20% sending, 30% waiting for room"
    )
    assert actor_loop._Counts().time_split() == "no time acting"
