"""Evaluation (`experiment.py --mode=test`): the evaluation environment plays exactly the
training environment's games, checkpoints are found and checked, every game is played whole
with the checkpoint's policy, and each becomes an MP4 of the real game."""

import dataclasses
import os

import cv2
import numpy as np
import pytest
import tensorflow as tf

import networks
from impala import build, evaluation
from impala.configs import GameConfig
from impala.envs import (
    COUNTER_LEVEL,
    EnvConfig,
    StepOutput,
    make_environment,
    make_evaluation_environment,
)
from impala.evaluation import EvalConfig
from impala.learner import checkpoints
from tests.videos import check_video

BREAKOUT = "BreakoutNoFrameskip-v4"
_GAME_SETTINGS = {field.name for field in dataclasses.fields(GameConfig)}


def _eval_config(checkpoint: str, **options) -> EvalConfig:
    """--mode=test's config with these options, its game settings given as on the command
    line."""
    game = {name: value for name, value in options.items() if name in _GAME_SETTINGS}
    others = {name: value for name, value in options.items() if name not in _GAME_SETTINGS}
    return EvalConfig(checkpoint=checkpoint, game=GameConfig(**game), given=tuple(game), **others)


def _random_play(env, num_steps: int, seed: int = 0) -> list[StepOutput]:
    rng = np.random.default_rng(seed)
    outputs = [env.reset()]
    for _ in range(num_steps):
        outputs.append(env.step(rng.integers(0, env.num_actions, env.num_envs)))
    return outputs


# --------------------------------------------------------------------------- #
# The evaluation environment.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "level_name, options, num_steps",
    [
        # These random actions lose 4 lives (each a `done`: episodic life), score 1 point and
        # lose the game at step 157; the next game starts with FIRE as the first did.
        (BREAKOUT, {"num_envs": 1}, 170),
        # Frame limit 90 with 8 frames a step: every game is cut in the middle of a step.
        (BREAKOUT, {"num_envs": 1, "num_action_repeats": 2, "max_episode_frames": 90}, 30),
        ("ALE/MsPacman-v5", {"num_envs": 2}, 50),  # No FIRE in its action set.
        # 16 games stepped by 2 C++ threads, each given its own action: each action reaches
        # its own game, whatever order the threads finish in.
        ("PongNoFrameskip-v4", {"num_envs": 16, "num_threads": 2}, 100),
        # An odd frame skip: the max-pooled frames alternate in parity from step to step.
        ("PongNoFrameskip-v4", {"num_envs": 2, "frame_skip": 3}, 100),
        # Each step's last frame, not the maximum of its last two.
        ("PongNoFrameskip-v4", {"num_envs": 2, "frame_pooling": "last"}, 100),
        (BREAKOUT, {"num_envs": 1, "frame_skip": 3, "frame_pooling": "last"}, 100),
        (BREAKOUT, {"num_envs": 1, "frame_skip": 5}, 100),
    ],
)
def test_evaluation_environment_plays_the_training_games_exactly(level_name, options, num_steps):
    """AtariVectorEnv (C++) against Gymnasium's ALE env under AtariPreprocessing: with the
    same seed and actions and no no-ops, every observation (all 84x84x4 pixels), reward, done
    and finished game is identical, across life losses, game overs and resets."""
    config = EnvConfig(level_name, seed=3, noop_max=0, **options)
    with make_environment(config) as training, make_evaluation_environment(config) as evaluating:
        assert evaluating.observation_shape == training.observation_shape
        assert evaluating.num_actions == training.num_actions
        assert evaluating.frames_per_step == training.frames_per_step
        expected = _random_play(training, num_steps, seed=1)
        played = _random_play(evaluating, num_steps, seed=1)
        for step, (want, got) in enumerate(zip(expected, played, strict=True)):
            for field in StepOutput._fields:
                np.testing.assert_array_equal(
                    getattr(got, field), getattr(want, field), err_msg=f"{field}, step {step}"
                )
        games = training.pop_episode_stats()
        assert evaluating.pop_episode_stats() == games
    dones = sum(int(output.done.sum()) for output in expected[1:])
    if "max_episode_frames" in options:
        assert len(games) == 2 and all(game.episode_frames == 90 for game in games)
    elif level_name == BREAKOUT and "frame_skip" in options:
        assert dones >= 1  # Across a lost life at least.
    elif level_name == BREAKOUT:
        assert (len(games), dones, games[0].episode_return) == (1, 5, 1.0)


def test_screens_show_each_game_from_its_first_to_its_last_frame():
    config = EnvConfig(BREAKOUT, seed=1, noop_max=0, episodic_life=False)
    with make_evaluation_environment(config, render=True) as env:
        assert env.screen_fps == 15.0  # 60 frames/s, 4 frames a step.
        first = env.reset()
        start = env.render()
        assert start.shape == (1, 210, 160, 3) and start.dtype == np.uint8
        np.testing.assert_array_equal(env.render(final=True), start)  # Nothing ended yet.
        # The agent sees the screen greyed and shrunk (the ALE's greys, as in training).
        grey = cv2.resize(cv2.cvtColor(start[0], cv2.COLOR_RGB2GRAY), (84, 84), cv2.INTER_AREA)
        assert np.abs(grey.astype(int) - first.observation[0, ..., -1]).mean() < 2
        rng = np.random.default_rng(0)
        while not env.step(rng.integers(0, env.num_actions, 1)).done[0]:
            pass
        # The game over: its last screen, while the env already shows the next game's first.
        last, now = env.render(final=True), env.render()
        np.testing.assert_array_equal(now, start)  # Without no-ops every game starts alike.
        assert not np.array_equal(last, now)


def test_screens_only_where_asked_and_possible():
    config = EnvConfig("CartPole-v1")
    with make_environment(config) as env, pytest.raises(ValueError, match="without screens"):
        env.reset()
        env.render()
    with make_evaluation_environment(config) as env, pytest.raises(ValueError, match="render="):
        env.reset()
        env.render()
    with pytest.raises(ValueError, match=f"'{COUNTER_LEVEL}' cannot show its screen"):
        make_evaluation_environment(EnvConfig(COUNTER_LEVEL), render=True)


def test_console_memory_is_each_evaluation_games_own():
    """`ram()` shows each console's memory as the game keeps it: the agent's paddle (RAM 51,
    its height, smaller up the screen) where each game's actions took it, and the first
    point in the scores (RAM 13 and 14: the computer's and the agent's)."""
    config = EnvConfig("PongNoFrameskip-v4", num_envs=2, seed=5, noop_max=0)
    with make_evaluation_environment(config) as env:
        env.reset()
        start = env.ram()
        assert start.shape == (2, 128) and start.dtype == np.uint8
        np.testing.assert_array_equal(start[0], start[1])  # No no-ops: the same start.
        np.testing.assert_array_equal(env.episode_frames(), [1, 1])  # FIRE's frame
        for _ in range(10):  # Game 0 moves its paddle up (RIGHT, action 2); game 1 stays.
            step = env.step(np.array([2, 0]))
        paddles = env.ram()[:, 51].astype(int)
        assert paddles[0] < paddles[1]
        while not step.reward.any():
            step = env.step(np.zeros(2, np.int64))
        np.testing.assert_array_equal(step.reward, [-1, -1])
        np.testing.assert_array_equal(env.ram()[:, 13:15], [[1, 0], [1, 0]])
        assert (env.episode_frames() % 4 == 1).all()  # 4 frames a step after FIRE's


def test_games_start_after_a_random_number_of_frames():
    config = EnvConfig("PongNoFrameskip-v4", num_envs=12, seed=2, noop_max=30)
    with make_evaluation_environment(config) as env:
        env.reset()
        start = env.episode_frames()
        assert start.dtype == np.int64 and ((start >= 1) & (start <= 29)).all()
        assert len(set(start % 2)) == 2  # odd and even starts
        env.step(np.zeros(12, np.int64))
        np.testing.assert_array_equal(env.episode_frames(), start + 4)


class _Noops:
    """Presses nothing: the games are what is tested, not a policy."""

    def reset(self, batch_size: int, first_index: int) -> None:
        self._batch_size = batch_size

    def __call__(self, step):
        return np.zeros(self._batch_size, np.int64), None


def test_atari_games_say_the_frame_they_began_on_and_the_summary_splits_by_parity():
    """Each game's start is the no-op and FIRE frames its console ran before the first action
    (the same seed's console says so after a reset); the summary gives each parity's games."""
    config = EnvConfig("PongNoFrameskip-v4", num_envs=6, seed=4, noop_max=30, max_episode_frames=8)
    lines = []
    with make_evaluation_environment(config) as env:
        games = evaluation.play(env, _Noops(), first_index=1, video_dir=None, report=lines.append)
    with make_evaluation_environment(config) as env:
        env.reset()
        expected = env.episode_frames().tolist()
    assert [game.start_frames for game in games] == expected
    assert {start % 2 for start in expected} == {0, 1}  # seed 4 begins games of both
    for game in games:
        assert lines[game.index - 1].endswith(f"steps), begun on frame {game.start_frames}")
    # Scores set by hand: the odd games won, the even ones lost.
    games = [
        dataclasses.replace(game, score=20.0 if game.start_frames % 2 else -20.0) for game in games
    ]
    odd = sum(game.start_frames % 2 for game in games)
    result = evaluation.EvalResult(checkpoint="c", policy="sample", games=tuple(games))
    assert result.by_parity == {"odd": (odd, 20.0), "even": (6 - odd, -20.0)}
    assert result.summary().endswith(
        f"; begun on an odd frame: {odd} game{'s' * (odd != 1)}, mean 20.0; on an even one: "
        f"{6 - odd}, mean -20.0"
    )
    # Games without starts (not Atari's) have no split, and their lines say nothing of it.
    plain = [dataclasses.replace(game, start_frames=-1) for game in games]
    plain_result = evaluation.EvalResult(checkpoint="c", policy="sample", games=tuple(plain))
    assert plain_result.by_parity is None and "odd" not in plain_result.summary()


def test_console_memory_only_of_evaluation_atari_games():
    with make_environment(EnvConfig("PongNoFrameskip-v4", num_envs=1)) as env:
        env.reset()
        for read in (env.ram, env.episode_frames):
            with pytest.raises(ValueError, match="was built for training, its consoles unseen"):
                read()
    with make_evaluation_environment(EnvConfig("CartPole-v1")) as env:
        env.reset()
        for read in (env.ram, env.episode_frames):
            with pytest.raises(ValueError, match="'CartPole-v1' is not an Atari game"):
                read()


# --------------------------------------------------------------------------- #
# Checkpoints.
# --------------------------------------------------------------------------- #


def test_a_run_folder_its_checkpoints_folder_and_one_checkpoint(cartpole_run):
    run_dir, _ = cartpole_run
    latest = os.path.join(run_dir, "checkpoints", "ckpt-7")
    assert evaluation.resolve_checkpoint(run_dir) == latest
    assert evaluation.resolve_checkpoint(os.path.join(run_dir, "checkpoints")) == latest
    older = os.path.join(run_dir, "checkpoints", "ckpt-3")
    assert evaluation.resolve_checkpoint(older) == older
    assert evaluation.run_folder_of(older) == os.path.abspath(run_dir)


@pytest.mark.parametrize(
    "name, message",
    [
        ("nothing_here", "no such run folder, checkpoints folder or checkpoint"),
        ("empty", "no checkpoint in"),
        ("run/checkpoints/ckpt-5", "no such run folder"),
    ],
)
def test_missing_checkpoints_are_one_line_errors_naming_the_path(cartpole_run, name, message):
    run_dir, _ = cartpole_run
    os.makedirs(os.path.join(os.path.dirname(run_dir), "empty"))
    path = os.path.join(os.path.dirname(run_dir), name)
    with pytest.raises(ValueError, match=message) as error:
        evaluation.run(EvalConfig(checkpoint=path), report=lambda line: None)
    assert f"--checkpoint={path}:" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "option, expected",
    [
        ({"level_name": "Acrobot-v1"}, "--level_name=Acrobot-v1 differs from the checkpoint's "),
        ({"agent_name": "ResNetAgent"}, "--agent_name=ResNetAgent differs from the checkpoint's "),
        ({"frame_skip": 3}, "--frame_skip=3 differs from the checkpoint's "),
    ],
)
def test_another_game_or_network_than_the_checkpoints_is_refused_naming_both(
    cartpole_run, option, expected
):
    run_dir, _ = cartpole_run
    with pytest.raises(ValueError) as error:
        evaluation.run(_eval_config(run_dir, **option), report=lambda line: None)
    saved = {
        "level_name": "CartPole-v1",
        "agent_name": "MLPAgent",
        "frame_skip": "none (not an Atari id)",
    }[next(iter(option))]
    assert str(error.value).startswith(f"{expected}{saved} (")


@pytest.mark.parametrize(
    "identity, accepted, refused",
    [
        # Kept before frames per step were: trained with the default skip.
        ({"num_action_repeats": 1}, 4, 3),
        ({"num_action_repeats": 2, "frames_per_step": 6}, 3, 4),
    ],
)
def test_an_atari_checkpoints_frame_skip_is_the_one_accepted(identity, accepted, refused):
    identity = {"level_name": BREAKOUT, **identity}
    evaluation.check_identity(identity, _eval_config("c", frame_skip=accepted), "c")
    evaluation.check_identity(identity, EvalConfig(checkpoint="c"), "c")  # 0: the checkpoint's
    with pytest.raises(
        ValueError,
        match=rf"^--frame_skip={refused} differs from the checkpoint's {accepted} \(c\); leave",
    ):
        evaluation.check_identity(identity, _eval_config("c", frame_skip=refused), "c")


@pytest.mark.parametrize(
    "identity, frames_per_step",
    [
        ({"level_name": BREAKOUT, "num_action_repeats": 2, "frames_per_step": 6}, 6),
        ({"level_name": BREAKOUT, "num_action_repeats": 1, "frames_per_step": 4}, 4),
        ({"level_name": BREAKOUT, "num_action_repeats": 1}, 4),  # kept before frames per step
        ({"level_name": "CartPole-v1", "num_action_repeats": 2, "frames_per_step": 2}, 2),
    ],
)
def test_games_are_played_with_the_checkpoints_frame_skip(identity, frames_per_step):
    config = evaluation.environment_config(identity, 1, 0)
    with make_evaluation_environment(config) as env:
        assert env.frames_per_step == frames_per_step


@pytest.mark.parametrize(
    "identity, frame_pooling",
    [
        ({"frame_pooling": "last"}, "last"),
        ({"frame_pooling": "max"}, "max"),
        ({}, "max"),  # kept before the pooling was: the maximum of a step's last two frames
    ],
)
def test_games_are_played_with_the_checkpoints_frame_pooling(identity, frame_pooling):
    identity = {"level_name": BREAKOUT, "num_action_repeats": 1, "frames_per_step": 4, **identity}
    config = evaluation.environment_config(identity, 1, 0)
    assert config.frame_pooling == frame_pooling
    with make_evaluation_environment(config) as env:
        assert env.frame_pooling == frame_pooling
    evaluation.check_identity(identity, EvalConfig(checkpoint="c"), "c")  # None: the checkpoint's
    same = _eval_config("c", frame_pooling=frame_pooling)
    evaluation.check_identity(identity, same, "c")
    other = "max" if frame_pooling == "last" else "last"
    with pytest.raises(
        ValueError,
        match=rf"^--frame_pooling={other} differs from the checkpoint's {frame_pooling} \(c\);",
    ):
        evaluation.check_identity(identity, _eval_config("c", frame_pooling=other), "c")


def test_restores_every_weight_of_the_checkpoint_it_names(cartpole_run):
    run_dir, weights = cartpole_run
    older = os.path.join(run_dir, "checkpoints", "ckpt-3")
    agent = evaluation.restore_agent(older, checkpoints.read_identity(older))
    for restored, saved in zip(agent.variables, weights[0], strict=True):
        np.testing.assert_array_equal(restored.numpy(), saved)


def test_a_checkpoint_without_the_networks_weights_is_refused(tmp_path):
    identity = {"agent_name": "MLPAgent", "num_actions": 2, "observation_shape": [4]}
    identity["observation_dtype"] = "float32"
    path = tf.train.Checkpoint(frames=tf.Variable(1)).write(str(tmp_path / "ckpt-1"))
    with pytest.raises(ValueError, match="does not hold all weights of a MLPAgent"):
        evaluation.restore_agent(path, identity)
    with pytest.raises(ValueError, match="not a checkpoint of this project's learner"):
        evaluation.read_identity(path)


def test_a_checkpoint_whose_weights_are_not_finite_is_refused(tmp_path):
    # A learner saves none (it refuses to), but a checkpoint may be anyone's file: games
    # played by NaN weights would report a policy that is not there.
    identity = {"agent_name": "MLPAgent", "num_actions": 2, "observation_shape": [4]}
    identity["observation_dtype"] = "float32"
    agent = build.agent_for("MLPAgent", 2, [4], "float32")
    agent.variables[1].assign(tf.fill(agent.variables[1].shape, np.nan))
    path = tf.train.Checkpoint(agent=agent).write(str(tmp_path / "ckpt-1"))
    with pytest.raises(ValueError) as refused:
        evaluation.restore_agent(path, identity)
    message = str(refused.value)
    assert message.startswith(f"{path}: 1 of its {len(agent.variables)} weights, such as ")
    assert "are not finite; name an earlier checkpoint of " in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "option, flag",
    [
        ({"checkpoint": ""}, "--checkpoint"),
        ({"num_episodes": 0}, "--test_num_episodes"),
        ({"num_episodes": 2.0}, "--test_num_episodes"),
        ({"policy": "best"}, "--test_policy"),
        ({"seed": -1}, "--seed"),
        ({"level_name": ""}, "--level_name"),
    ],
)
def test_bad_options_name_the_flag(option, flag):
    with pytest.raises(ValueError, match=f"^{flag}"):
        _eval_config(**{"checkpoint": "runs/x", **option})


# --------------------------------------------------------------------------- #
# Playing.
# --------------------------------------------------------------------------- #


def test_each_game_is_played_whole_with_its_own_seed_however_many_at_once(
    cartpole_run, monkeypatch
):
    run_dir, _ = cartpole_run
    config = _eval_config(run_dir, num_episodes=3, policy="greedy", seed=5)
    lines = []
    together = evaluation.run(config, report=lines.append)
    monkeypatch.setattr(evaluation, "MAX_PARALLEL_GAMES", 2)
    in_rounds = evaluation.run(config, report=lambda line: None)  # 2 games, then 1.
    assert in_rounds.games == together.games
    assert [game.index for game in together.games] == [1, 2, 3]
    # CartPole: one frame per step, a reward of 1 per step.
    assert all(game.frames == game.steps == game.score for game in together.games)
    one = evaluation.run(
        _eval_config(run_dir, num_episodes=1, policy="greedy", seed=6), lambda line: None
    )
    # Game 2 is seeded 5 + 1.
    assert (one.games[0].score, one.games[0].steps) == (
        together.games[1].score,
        together.games[1].steps,
    )

    checkpoint = os.path.join(run_dir, "checkpoints", "ckpt-7")
    assert lines[0] == f"checkpoint {checkpoint}: CartPole-v1 with MLPAgent, 700 frames, " + (
        "weight version 7"
    )
    for game in together.games:
        line = (
            f"game {game.index}: score {game.score:.0f}, {game.frames:,} frames "
            f"({game.steps:,} steps)"
        )
        assert line in lines
    scores = np.array(together.scores)
    assert lines[-1] == (
        f"score over 3 games (greedy policy): mean {scores.mean():.1f}, std {scores.std():.1f}, "
        f"min {scores.min():.0f}, max {scores.max():.0f}"
    )


def test_sampled_games_are_seeded_game_by_game(cartpole_run):
    run_dir, _ = cartpole_run
    config = _eval_config(run_dir, num_episodes=3, policy="sample", seed=1)
    first, again = (evaluation.run(config, report=lambda line: None) for _ in range(2))
    assert first.games == again.games
    # Game k plays the same however many games are played with it.
    fewer = evaluation.run(dataclasses.replace(config, num_episodes=2), lambda line: None)
    assert fewer.games == first.games[:2]


def test_sampling_follows_the_softmax():
    rng = np.random.default_rng(0)
    logits = np.tile(np.array([[0.0, np.log(3.0), -1e9]], np.float32), (20_000, 1))
    counts = np.bincount(evaluation.sample_actions(logits, [rng] * len(logits)), minlength=3)
    assert counts[2] == 0
    assert abs(counts[1] / counts.sum() - 0.75) < 0.015


def test_a_recurrent_agent_carries_its_state_and_resets_it_where_a_game_starts():
    """Step by step, the policy computes what the learner's unroll over the same steps does."""
    agent = networks.make_agent("ResNetLSTMAgent", 4)
    networks.build_variables(agent, (84, 84, 4), tf.uint8)
    rng = np.random.default_rng(0)
    done = np.array([[1, 1], [0, 0], [0, 1], [0, 0], [1, 0], [0, 0]], bool)  # [T, B]
    observation = rng.integers(0, 255, (6, 2, 84, 84, 4), dtype=np.uint8)
    reward = rng.normal(size=(6, 2)).astype(np.float32)
    policy = evaluation.Policy(agent, greedy=True, seed=0)
    policy.reset(2, first_index=1)
    actions, logits = [], []
    for t in range(6):
        action, step_logits = policy(StepOutput(reward[t], done[t], observation[t]))
        actions.append(action)
        logits.append(step_logits)
    prev_action = np.concatenate([np.zeros((1, 2), np.int32), np.array(actions[:-1], np.int32)])
    unrolled, _ = agent.unroll(
        networks.AgentInput(prev_action, reward, done, observation), agent.initial_state(2)
    )
    np.testing.assert_allclose(np.array(logits), unrolled.policy_logits.numpy(), atol=1e-5)
    np.testing.assert_array_equal(np.array(actions), np.array(logits).argmax(axis=2))


def test_cartpole_games_are_recorded_at_their_real_speed(cartpole_run, tmp_path):
    run_dir, _ = cartpole_run
    video_dir = str(tmp_path / "cartpole_videos")
    config = EvalConfig(checkpoint=run_dir, num_episodes=2, record_video=True, video_dir=video_dir)
    result = evaluation.run(config, report=lambda line: None)
    assert result.videos == tuple(os.path.join(video_dir, f"game_{k}.mp4") for k in (1, 2))
    for game in result.games:
        check_video(game.video, game.steps, fps=50, size=(600, 400))


class _WatchedPolicy(evaluation.Policy):
    """A fresh network's sampled policy for Breakout that notes the `done`s it is given and
    can stop the evaluation (as Ctrl-C does) at a given step."""

    def __init__(self, video_dir: str | None = None, interrupt_at: int | None = None):
        super().__init__(networks.make_agent("ShallowConvNetAgent", 4), greedy=False, seed=0)
        networks.build_variables(self._agent, (84, 84, 4), tf.uint8)
        self._video_dir = video_dir
        self._interrupt_at = interrupt_at
        self.dones = []

    def __call__(self, step: StepOutput):
        self.dones.append(bool(step.done[0]))
        if len(self.dones) == self._interrupt_at:
            # Until the game is over its video has a temporary name only.
            assert os.listdir(self._video_dir) == ["game_1.incomplete.mp4"]
            raise KeyboardInterrupt
        return super().__call__(step)


def test_a_game_lasts_all_lives_and_the_agent_sees_each_life_lost():
    policy = _WatchedPolicy()
    config = evaluation.environment_config({"level_name": BREAKOUT, "num_action_repeats": 1}, 1, 0)
    with make_evaluation_environment(config) as env:
        (game,) = evaluation.play(env, policy, first_index=1, video_dir=None, report=print)
    # The game's start, then 4 lost lives, as in training; the 5th loss ends the game.
    assert sum(policy.dones) == 5 and policy.dones[0]
    assert len(policy.dones) == game.steps


def test_an_interrupted_game_leaves_no_video(tmp_path):
    policy = _WatchedPolicy(str(tmp_path), interrupt_at=20)
    with (
        make_evaluation_environment(EnvConfig(BREAKOUT), render=True) as env,
        pytest.raises(KeyboardInterrupt),
    ):
        evaluation.play(env, policy, first_index=1, video_dir=str(tmp_path), report=print)
    assert len(policy.dones) == 20 and os.listdir(tmp_path) == []
