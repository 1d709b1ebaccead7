"""Tests for impala/envs: Atari and Gymnasium vectors, the counter env, errors."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from impala.envs import (
    COUNTER_LEVEL,
    CounterEnv,
    EnvConfig,
    EpisodeStats,
    StepOutput,
    VectorEnvironment,
    decode_counter,
    decode_episode_step,
    make_environment,
    make_evaluation_environment,
)

PONG = "PongNoFrameskip-v4"
BREAKOUT = "BreakoutNoFrameskip-v4"


def _random_actions(env: VectorEnvironment, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, env.num_actions, size=env.num_envs)


def _run_until_games_end(
    env: VectorEnvironment, seed: int, max_steps: int = 3000
) -> tuple[list[StepOutput], list[EpisodeStats]]:
    """Random play until every env finished a whole game; returns outputs and stats."""
    rng = np.random.default_rng(seed)
    outputs = [env.reset()]
    stats: list[EpisodeStats] = []
    for _ in range(max_steps):
        outputs.append(env.step(_random_actions(env, rng)))
        stats += env.pop_episode_stats()
        if {s.env_index for s in stats} == set(range(env.num_envs)):
            return outputs, stats
    raise AssertionError(f"no whole game finished in every env within {max_steps} steps")


# --------------------------------------------------------------------------- #
# Atari.
# --------------------------------------------------------------------------- #


def test_atari_pong_shapes_and_metadata():
    with make_environment(EnvConfig(PONG, num_envs=2, seed=1)) as env:
        assert (env.num_envs, env.num_actions, env.frames_per_step) == (2, 6, 4)
        assert env.observation_shape == (84, 84, 4)
        assert env.observation_dtype == np.uint8
        first = env.reset()
        assert first.observation.shape == (2, 84, 84, 4)
        assert first.observation.dtype == np.uint8
        assert first.observation.flags.c_contiguous
        assert first.done.tolist() == [True, True]  # scalable_agent's initial output.
        assert first.reward.dtype == np.float32 and not first.reward.any()
        # HWC with frames on the last axis, oldest first: a new game's stack is
        # zero-padded, and each step shifts it by one frame.
        assert not first.observation[..., :3].any()
        assert first.observation[..., 3].any(axis=(1, 2)).all()
        out = env.step(np.array([0, 1]))
        assert out.observation.shape == (2, 84, 84, 4)
        assert out.reward.dtype == np.float32 and out.done.dtype == bool
        assert not out.done.any()
        np.testing.assert_array_equal(out.observation[..., 2], first.observation[..., 3])
        assert not out.observation[..., :2].any()


def test_atari_v5_id_uses_the_atari_path_with_action_repeats():
    with make_environment(EnvConfig("ALE/Breakout-v5", num_action_repeats=2)) as env:
        assert env.frames_per_step == 8
        assert env.num_actions == 4
        assert env.observation_shape == (84, 84, 4)


def test_atari_truncation_counts_frames():
    config = EnvConfig(PONG, num_action_repeats=2, max_episode_frames=40)
    with make_environment(config) as env:
        env.reset()
        dones = [bool(env.step(np.array([0])).done[0]) for _ in range(5)]
        assert dones == [False] * 4 + [True]
        (game,) = env.pop_episode_stats()
        # Its start frames, the no-ops and FIRE before the first action, are not counted.
        assert game == EpisodeStats(
            env_index=0,
            episode_return=0.0,
            episode_steps=5,
            episode_frames=40,
            start_frames=game.start_frames,
        )
        assert 1 <= game.start_frames <= 29


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
@pytest.mark.parametrize("frame_skip, num_action_repeats", [(3, 1), (5, 2)])
def test_atari_frame_skip_sets_the_emulator_frames_of_a_step(make, frame_skip, num_action_repeats):
    """ALE's own frame count: each step runs frame_skip x repeats frames, so a frame limit of
    one step less than 5 steps' frames ends the game in the fifth step."""
    frames_per_step = frame_skip * num_action_repeats
    config = EnvConfig(
        PONG,
        frame_skip=frame_skip,
        num_action_repeats=num_action_repeats,
        noop_max=0,
        max_episode_frames=5 * frames_per_step - 1,
    )
    with make(config) as env:
        assert env.frames_per_step == frames_per_step
        env.reset()
        dones = [bool(env.step(np.array([0])).done[0]) for _ in range(5)]
        assert dones == [False] * 4 + [True]
        (game,) = env.pop_episode_stats()
        assert (game.episode_steps, game.episode_frames) == (5, 5 * frames_per_step - 1)


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
@pytest.mark.parametrize("noop_max", [0, 30])
def test_atari_games_report_the_frames_they_began_with(make, noop_max):
    """Each finished game's `start_frames` is the no-op and FIRE frames it began with: Pong's
    one FIRE frame without no-ops, and with up to 30 the draw of d in [0, 30) (at least the
    FIRE frame), so games of both parities. On the evaluation side the console's own frame
    count right after a game starts says the same for the game that then runs."""
    config = EnvConfig(PONG, num_envs=4, seed=3, noop_max=noop_max, max_episode_frames=8)
    starts, seen_by_console = [], {index: [] for index in range(4)}
    with make(config) as env:
        env.reset()
        if make is make_evaluation_environment:
            for index, frames in enumerate(env.episode_frames()):
                seen_by_console[index].append(int(frames))
        for _ in range(60):
            done = env.step(np.zeros(4, np.int64)).done
            games = env.pop_episode_stats()
            starts += [game.start_frames for game in games]
            if make is make_evaluation_environment:
                for game in games:
                    assert game.start_frames == seen_by_console[game.env_index][-1]
                for index in np.flatnonzero(done):
                    seen_by_console[index].append(int(env.episode_frames()[index]))
    assert len(starts) == 120  # every env: a game of two steps, 30 times
    if noop_max == 0:
        assert set(starts) == {1}
    else:
        assert min(starts) >= 1 and max(starts) <= noop_max - 1
        assert len(set(starts)) >= 15
        assert {start % 2 for start in starts} == {0, 1}


def test_other_families_report_no_start_frames():
    with make_environment(EnvConfig("CartPole-v1", num_envs=2, seed=0)) as env:
        env.reset()
        games = []
        while len(games) < 2:
            games += env.pop_episode_stats()
            env.step(np.zeros(2, np.int64))
    assert {game.start_frames for game in games} == {-1}


def test_an_odd_frame_skip_plays_another_game_than_four():
    """Observations of the same seeds and actions differ: the skip reaches the emulator."""

    def play(frame_skip: int) -> np.ndarray:
        with make_environment(EnvConfig(PONG, seed=5, frame_skip=frame_skip)) as env:
            observations = [env.reset().observation]
            for step in range(60):
                observations.append(env.step(np.array([2 + step % 2])).observation)
        return np.stack(observations)

    default = play(0)
    np.testing.assert_array_equal(default, play(4))  # 0 is DeepMind's 4.
    assert not np.array_equal(default, play(3))


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
def test_a_frame_skip_is_refused_outside_atari(make):
    with pytest.raises(ValueError, match=r"^--frame_skip=3: .*not an Atari id") as error:
        make(EnvConfig("CartPole-v1", frame_skip=3))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
def test_frame_pooling_is_refused_outside_atari(make):
    with pytest.raises(ValueError, match=r"^--frame_pooling=last: .*not an Atari id") as error:
        make(EnvConfig("CartPole-v1", frame_pooling="last"))
    assert "\n" not in str(error.value)


def _pong_screens(actions: list[int], frames_per_step: int = 4) -> list[tuple]:
    """The last two greyscale screens of each step of a Pong game played frame by frame in
    the emulator (FIRE on the first frame, as the environments start a game; no no-ops)."""
    env = gym.make(PONG, frameskip=1, repeat_action_probability=0.0, obs_type="grayscale").unwrapped
    try:
        env.reset(seed=5)
        fire = env.get_action_meanings().index("FIRE")
        env.step(fire)
        screens = [(env.ale.getScreenGrayscale(), env.ale.getScreenGrayscale())]
        for action in actions:
            kept = []
            for _ in range(frames_per_step):
                env.step(action)
                kept = [*kept[-1:], env.ale.getScreenGrayscale()]
            screens.append(tuple(kept))
        return screens
    finally:
        env.close()


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
def test_frame_pooling_shows_a_steps_last_frame_or_the_maximum_of_its_last_two(make):
    """Each step's newest frame against the emulator's own screens, 84x84 by INTER_AREA:
    "last" is the step's last screen, "max" the maximum of its last two (which differ where
    the ball or a paddle moved between them)."""
    import cv2

    actions = [2 + step % 2 for step in range(40)]  # RIGHT and LEFT, Pong's up and down
    screens = _pong_screens(actions)

    def shrink(screen: np.ndarray) -> np.ndarray:
        return cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)

    expected = {
        "last": [shrink(last) for _, last in screens],
        "max": [shrink(np.maximum(before, last)) for before, last in screens],
    }
    assert sum(not np.array_equal(m, x) for m, x in zip(*expected.values(), strict=True)) >= 20
    for frame_pooling, frames in expected.items():
        config = EnvConfig(PONG, seed=5, noop_max=0, frame_pooling=frame_pooling)
        with make(config) as env:
            newest = [env.reset().observation[0, ..., -1]]
            newest += [env.step(np.array([a])).observation[0, ..., -1] for a in actions]
        for step, (got, want) in enumerate(zip(newest, frames, strict=True)):
            np.testing.assert_array_equal(got, want, err_msg=f"{frame_pooling}, step {step}")


def test_breakout_life_loss_ends_training_episode_but_not_the_game():
    """Same seed and actions with and without episodic_life: same games, more dones."""
    runs = {}
    for episodic_life in (True, False):
        config = EnvConfig(BREAKOUT, num_envs=2, seed=7, episodic_life=episodic_life)
        with make_environment(config) as env:
            runs[episodic_life] = _run_until_games_end(env, seed=0)
    (life_outputs, life_stats), (game_outputs, game_stats) = runs[True], runs[False]

    # Episodic life changes only `done`: the emulators ran identically.
    assert len(life_outputs) == len(game_outputs)
    for life, game in zip(life_outputs, game_outputs, strict=True):
        np.testing.assert_array_equal(life.observation, game.observation)
        np.testing.assert_array_equal(life.reward, game.reward)
    assert life_stats == game_stats

    life_dones = np.array([o.done for o in life_outputs[1:]])  # [T, N]
    game_dones = np.array([o.done for o in game_outputs[1:]])
    rewards = np.array([o.reward for o in game_outputs[1:]])
    assert game_dones.sum() == len(game_stats)  # Without episodic life: one done per game.
    for index in range(2):
        first_game = next(s for s in game_stats if s.env_index == index)
        game_over = np.flatnonzero(game_dones[:, index])[0]
        assert first_game.episode_steps == game_over + 1
        # The score spans all lives.
        assert first_game.episode_return == rewards[: game_over + 1, index].sum()
        # Breakout has 5 lives: 4 lost lives, then the game over, each a `done`.
        assert life_dones[: game_over + 1, index].sum() == 5
    for stats in game_stats:
        # Every step runs 4 frames except a last one cut short by the game over.
        assert 4 * (stats.episode_steps - 1) < stats.episode_frames <= 4 * stats.episode_steps


def test_atari_seed_derivation():
    """Env i of a vector seeded s plays like env 0 of a vector seeded s + i."""
    actions = np.random.default_rng(0).integers(0, 4, size=30)
    trajectories = {}
    for seed, num_envs in ((3, 2), (4, 1)):
        with make_environment(EnvConfig(BREAKOUT, num_envs=num_envs, seed=seed)) as env:
            observations = [env.reset().observation[-1]]
            for action in actions:
                observations.append(env.step(np.full(num_envs, action)).observation[-1])
            trajectories[seed] = np.stack(observations)
    np.testing.assert_array_equal(trajectories[3], trajectories[4])


def test_atari_rejects_bad_actions_instead_of_hanging():
    # ale_py's C++ threads deadlock on an out-of-range action.
    with make_environment(EnvConfig(PONG, num_envs=2)) as env:
        env.reset()
        with pytest.raises(ValueError, match=r"\[0, 6\)"):
            env.step(np.array([0, 6]))
        with pytest.raises(ValueError, match="shape"):
            env.step(np.array([0]))
        env.step(np.array([5, 0]))  # Still usable.


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
def test_atari_sticky_actions_reach_the_emulator(make):
    """The same seeds and actions play other games once the emulator may keep old actions."""

    def play(repeat_action_probability: float) -> np.ndarray:
        config = EnvConfig(
            PONG, num_envs=2, seed=5, repeat_action_probability=repeat_action_probability
        )
        with make(config) as env:
            observations = [env.reset().observation]
            for step in range(120):  # up and down in turn: every step changes the action
                observations.append(env.step(np.full(2, 2 + step % 2)).observation)
        return np.stack(observations)

    plain = play(0.0)
    np.testing.assert_array_equal(plain, play(0.0))
    assert not np.array_equal(plain, play(0.5))


@pytest.mark.parametrize("make", [make_environment, make_evaluation_environment])
def test_sticky_actions_are_refused_outside_atari(make):
    with pytest.raises(ValueError, match=r"^--repeat_action_probability=0\.25: .*Atari") as error:
        make(EnvConfig("CartPole-v1", repeat_action_probability=0.25))
    assert "\n" not in str(error.value)


def test_sticky_actions_take_any_real_number_in_range():
    assert EnvConfig(PONG, repeat_action_probability=np.float32(0.25)).repeat_action_probability
    with pytest.raises(ValueError, match=r"^--repeat_action_probability='0\.25': must be"):
        EnvConfig(PONG, repeat_action_probability="0.25")


def test_atari_rejects_env_kwargs():
    with pytest.raises(ValueError, match="--env_kwargs"):
        make_environment(EnvConfig(PONG, env_kwargs={"mode": 1}))


# --------------------------------------------------------------------------- #
# Gymnasium (non-Atari).
# --------------------------------------------------------------------------- #


def test_cartpole_shapes_and_stats():
    with make_environment(EnvConfig("CartPole-v1", num_envs=3)) as env:
        assert (env.num_actions, env.observation_shape, env.frames_per_step) == (2, (4,), 1)
        assert env.observation_dtype == np.float32
        first = env.reset()
        assert first.observation.shape == (3, 4) and first.observation.dtype == np.float32
        assert first.done.all()
        rng = np.random.default_rng(0)
        steps = np.zeros(3, int)
        dones = 0
        stats: list[EpisodeStats] = []
        for _ in range(200):
            out = env.step(_random_actions(env, rng))
            assert out.observation.shape == (3, 4) and out.observation.dtype == np.float32
            assert out.reward.dtype == np.float32 and out.done.dtype == bool
            steps += 1
            finished = env.pop_episode_stats()
            assert [s.env_index for s in finished] == np.flatnonzero(out.done).tolist()
            assert [s.episode_steps for s in finished] == steps[out.done].tolist()
            stats += finished
            steps[out.done] = 0
            dones += out.done.sum()
        assert len(stats) == dones > 0
        for s in stats:
            # CartPole pays 1 per step, so the return is the episode length.
            assert s.episode_return == s.episode_steps == s.episode_frames


def test_cartpole_action_repeats():
    with make_environment(EnvConfig("CartPole-v1", num_action_repeats=2)) as env:
        assert env.frames_per_step == 2
        env.reset()
        stats: list[EpisodeStats] = []
        while not stats:
            env.step(np.array([0]))
            stats = env.pop_episode_stats()
        (s,) = stats
        assert s.episode_return == s.episode_frames  # Repeats sum rewards.
        assert 2 * s.episode_steps - 1 <= s.episode_frames <= 2 * s.episode_steps


def test_cartpole_seeding():
    def trajectory(seed: int, num_envs: int) -> np.ndarray:
        actions = np.tile([0, 1, 1, 0, 1], 8)
        with make_environment(EnvConfig("CartPole-v1", num_envs=num_envs, seed=seed)) as env:
            observations = [env.reset().observation]
            observations += [env.step(np.full(num_envs, a)).observation for a in actions]
        return np.stack(observations, axis=1)  # [N, T, 4]

    first, again = trajectory(5, 2), trajectory(5, 2)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first[0, 0], first[1, 0])  # Env indices get their own seeds.
    np.testing.assert_array_equal(first[1], trajectory(6, 1)[0])  # Env i uses seed + i.
    assert not np.array_equal(first[0, 0], trajectory(6, 1)[0, 0])


def test_second_reset_continues_random_streams():
    with make_environment(EnvConfig("CartPole-v1", seed=1)) as env:
        first = env.reset().observation
        second = env.reset().observation
    assert not np.array_equal(first, second)


# --------------------------------------------------------------------------- #
# The counter env.
# --------------------------------------------------------------------------- #


def test_counter_decode_round_trip_beyond_255():
    env = CounterEnv(episode_length=1000)
    observation, _ = env.reset()
    assert observation.shape == (84, 84, 4) and observation.dtype == np.uint8
    assert (decode_counter(observation), decode_episode_step(observation)) == (0, 0)
    for _ in range(300):
        observation, *_ = env.step(0)
    assert (decode_counter(observation), decode_episode_step(observation)) == (300, 300)
    assert isinstance(decode_counter(observation), int)
    batch = np.stack([np.stack([observation] * 3)] * 2)  # [T=2, N=3, 84, 84, 4]
    np.testing.assert_array_equal(decode_counter(batch), np.full((2, 3), 300))


def test_counter_custom_shape_and_rank():
    env = CounterEnv(observation_shape=(3, 3), num_actions=2, episode_length=2)
    assert env.action_space.n == 2
    env.reset()
    observation, *_ = env.step(1)
    assert observation.shape == (3, 3)
    assert decode_counter(observation, observation_rank=2) == 1
    np.testing.assert_array_equal(decode_counter(observation[None], observation_rank=2), [1])
    with pytest.raises(ValueError, match="observation_shape"):
        CounterEnv(observation_shape=(2, 2))


def test_counter_same_step_autoreset():
    config = EnvConfig(COUNTER_LEVEL, num_envs=3, env_kwargs={"episode_length": 4})
    with make_environment(config) as env:
        assert (env.num_actions, env.observation_shape, env.frames_per_step) == (4, (84, 84, 4), 1)
        first = env.reset()
        assert decode_counter(first.observation).tolist() == [0, 0, 0]
        for t in range(1, 13):
            out = env.step(np.zeros(3, int))
            # The global count rises by exactly one per agent step, across resets...
            assert decode_counter(out.observation).tolist() == [t] * 3
            # ...and on `done` the observation is already the new episode's first.
            assert out.done.tolist() == [t % 4 == 0] * 3
            assert decode_episode_step(out.observation).tolist() == [t % 4] * 3
            assert out.reward.tolist() == [float(t % 4 == 3)] * 3  # reward_period=3.
        stats = env.pop_episode_stats()
        assert len(stats) == 9 and env.pop_episode_stats() == []
        assert [s.env_index for s in stats] == [0, 1, 2] * 3
        assert set(stats) == {EpisodeStats(i, 1.0, 4, 4) for i in range(3)}


def test_counter_action_repeats_stop_at_episode_end():
    config = EnvConfig(
        COUNTER_LEVEL, num_action_repeats=3, env_kwargs={"episode_length": 4, "reward_period": 1}
    )
    with make_environment(config) as env:
        assert env.frames_per_step == 3
        env.reset()
        out = env.step(np.array([0]))
        assert (decode_counter(out.observation[0]), out.reward[0], out.done[0]) == (3, 3.0, False)
        out = env.step(np.array([0]))  # Only 1 frame left in the episode.
        assert (decode_counter(out.observation[0]), out.reward[0], out.done[0]) == (4, 1.0, True)
        assert decode_episode_step(out.observation[0]) == 0
        assert env.pop_episode_stats() == [EpisodeStats(0, 4.0, 2, 4)]


def test_counter_truncation_and_rewarded_action():
    config = EnvConfig(
        COUNTER_LEVEL,
        max_episode_frames=3,
        env_kwargs={"episode_length": 10, "rewarded_action": 2, "num_actions": 3},
    )
    with make_environment(config) as env:
        assert env.num_actions == 3
        env.reset()
        outs = [env.step(np.array([a])) for a in (2, 0, 2)]
        assert [o.reward[0] for o in outs] == [1.0, 0.0, 1.0]
        assert [o.done[0] for o in outs] == [False, False, True]  # Truncated by frames.
        assert env.pop_episode_stats() == [EpisodeStats(0, 2.0, 3, 3)]


def test_counter_is_registered():
    assert COUNTER_LEVEL in gym.registry


# --------------------------------------------------------------------------- #
# Errors and lifecycle.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("level_name", "expected"),
    [
        ("PongNoFrameskp-v4", "did you mean 'PongNoFrameskip-v4'"),
        ("NoSuchLevel-v0", "not a registered Gymnasium id"),
    ],
)
def test_unknown_level(level_name, expected):
    with pytest.raises(ValueError, match="--level_name") as error:
        make_environment(EnvConfig(level_name))
    message = str(error.value)
    assert level_name in message and expected in message and "\n" not in message


def test_an_id_whose_extra_packages_are_missing_is_a_one_line_error():
    # LunarLander needs Box2D, which the pinned stack does not install.
    with pytest.raises(ValueError, match="'LunarLander-v3' needs more packages: Box2D") as error:
        make_environment(EnvConfig("LunarLander-v3"))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("level_name", ["Pendulum-v1", "MountainCarContinuous-v0"])
def test_continuous_action_space_is_rejected(level_name):
    with pytest.raises(ValueError, match="Discrete") as error:
        make_environment(EnvConfig(level_name))
    message = str(error.value)
    assert level_name in message and "Box" in message and "\n" not in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("level_name", ""),
        ("num_envs", 0),
        ("num_envs", 1.5),
        ("num_envs", True),
        ("seed", -1),
        ("seed", 2**31),
        ("num_action_repeats", 0),
        ("episodic_life", 1),
        ("noop_max", -1),
        ("max_episode_frames", 0),
        ("num_threads", -1),
        ("env_kwargs", {1: 2}),
        ("repeat_action_probability", -0.1),
        ("repeat_action_probability", 1.0),
        ("repeat_action_probability", float("nan")),
        ("repeat_action_probability", float("inf")),
        ("repeat_action_probability", True),
        ("repeat_action_probability", "0.25"),
        ("frame_skip", 1),
        ("frame_skip", -4),
        ("frame_skip", True),
        ("frame_skip", 3.0),
        ("frame_skip", "3"),
        ("frame_skip", 2**31),
        ("frame_pooling", "mean"),
        ("frame_pooling", None),
        ("frame_pooling", ["max"]),
    ],
)
def test_bad_options_name_the_field(field, value):
    kwargs = {"level_name": "CartPole-v1", field: value}
    with pytest.raises(ValueError, match=f"--{field}") as error:
        EnvConfig(**kwargs)
    assert "\n" not in str(error.value)


def test_config_is_frozen_and_copies_env_kwargs():
    env_kwargs = {"episode_length": 3}
    config = EnvConfig(COUNTER_LEVEL, env_kwargs=env_kwargs)
    env_kwargs["episode_length"] = 99
    assert config.env_kwargs == {"episode_length": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_envs = 2  # type: ignore[misc]


def test_bad_actions_and_lifecycle():
    env = make_environment(EnvConfig(COUNTER_LEVEL, num_envs=2))
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(2, int))
    env.reset()
    with pytest.raises(ValueError, match="integers"):
        env.step(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        env.step(np.array([-1, 0]))
    env.close()
    env.close()  # Idempotent.
    with pytest.raises(RuntimeError, match="after close"):
        env.reset()


# --------------------------------------------------------------------------- #
# impala/Catch-v0, the learning-test game.
# --------------------------------------------------------------------------- #


def test_catch_draws_the_ball_falling_in_an_atari_shaped_frame_stack():
    from impala.envs import catch

    env = catch.CatchEnv()
    observation, _ = env.reset(seed=5)
    assert observation.shape == (84, 84, 4) and observation.dtype == np.uint8
    # A new episode's stack is empty but for its newest frame, as AtariVectorEnv gives it.
    assert not observation[..., :3].any()
    row, column = env.ball
    assert observation[row * 8, column * 8, 3] == 255
    assert observation[9 * 8, env.paddle * 8, 3] == 255
    stacks = [observation]
    for _ in range(3):
        observation, reward, terminated, _, _ = env.step(1)
        stacks.append(observation)
        assert reward == 0.0 and not terminated
    # Oldest frame first: frame k of the last stack is the newest frame of stack k.
    for k in range(4):
        np.testing.assert_array_equal(observation[..., k], stacks[k][..., 3])
    # The ball fell one row (8 pixels) per step, in its own column.
    assert env.ball == (row + 3, column)


@pytest.mark.parametrize("seed", range(3))
def test_catch_pays_only_at_the_bottom_and_only_a_paddle_under_the_ball(seed):
    from impala.envs import catch

    with make_environment(EnvConfig(catch.CATCH_LEVEL, num_envs=8, seed=seed)) as env:
        assert (env.num_actions, env.observation_shape) == (3, (84, 84, 4))
        output = env.reset()
        rng = np.random.default_rng(seed)
        for policy in ("random", "best"):
            for _ in range(9 * 30):
                if policy == "best":
                    actions = np.array([catch.best_action(o) for o in output.observation])
                else:
                    actions = rng.integers(0, 3, 8)
                output = env.step(actions)
                assert set(np.unique(output.reward)) <= {-1.0, 0.0, 1.0}
                # A reward comes exactly when an episode ends.
                np.testing.assert_array_equal(output.reward != 0, output.done)
            games = env.pop_episode_stats()
            assert all(game.episode_steps == 9 for game in games)
            mean = np.mean([game.episode_return for game in games])
            if policy == "best":
                assert mean == 1.0
            else:
                assert -0.95 < mean < -0.5  # a random paddle is rarely under the ball
