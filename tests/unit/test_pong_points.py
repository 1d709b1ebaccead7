"""benchmarks.pong_points: a Pong game's points told apart from the ball's positions."""

import ale_py
import gymnasium as gym
import numpy as np

from benchmarks import pong_points
from benchmarks.pong_points import Point
from impala.envs import atari

gym.register_envs(ale_py)


def _moving(start, stop, step):
    return list(range(start, stop, step))


def test_points_are_told_from_the_balls_path():
    # Point 1: the ball rests (x 0), appears at the centre and is served to the computer
    # going down; the computer returns it at x 69, the agent at 188 (a fast shot back), the
    # computer again at 68, and the ball passes the agent (x 206): lost after one touch.
    xs1 = [0] * 5 + _moving(125, 68, -4) + _moving(69, 188, 4) + [188] + _moving(176, 67, -12)
    xs1 += [*_moving(68, 200, 12), 206]
    ys1 = list(range(100, 100 + len(xs1)))
    # Point 2: from rest at 206, served to the agent going up, never touched: lost.
    xs2 = [206] * 4 + _moving(131, 206, 4) + [206]
    ys2 = list(range(200, 200 - len(xs2), -1))
    # Point 3: begins with the last move of the ball past the agent (no touch), rests, is
    # served to the computer going down, and passes it (x 51): won without a touch.
    xs3 = [200, 206, 206, *_moving(126, 51, -4), 51]
    ys3 = list(range(50, 50 + len(xs3)))
    xs, ys = xs1 + xs2 + xs3, ys1 + ys2 + ys3
    rewards = np.zeros(len(xs))
    rewards[[len(xs1) - 1, len(xs1) + len(xs2) - 1, len(xs) - 1]] = [-1, -1, 1]
    points = pong_points.split_points(np.array(xs), np.array(ys), rewards)
    assert points == [
        Point(won=False, touches=1, served_to_agent=False, served_down=True),
        Point(won=False, touches=0, served_to_agent=True, served_down=False),
        Point(won=True, touches=0, served_to_agent=False, served_down=True),
    ]


def test_a_game_that_ends_before_the_serve_has_no_serve():
    assert pong_points.point_of([206, 206, 206], [1, 2, 3], -1.0) == Point(False, 0, None, None)


def test_report_splits_games_by_their_first_frame_and_outcome_and_points_by_serve():
    serve_down = Point(won=True, touches=1, served_to_agent=True, served_down=True)
    lost_up = Point(won=False, touches=1, served_to_agent=False, served_down=False)
    missed = Point(won=False, touches=0, served_to_agent=True, served_down=True)
    won_game = [serve_down, lost_up] * 20 + [serve_down]  # 21 to 20
    lost_game = [missed] * 15 + [serve_down] + [lost_up] * 6  # 1 to 21
    lines = pong_points.report("ckpt-7", [won_game, lost_game], [13, 4])
    assert lines == [
        "ckpt-7: 2 games (sampled policy)",
        "  game   0:  +1 (from frame 13)  " + "Wl" * 20 + "W",
        "  game   1: -20 (from frame  4)  " + "l" * 15 + "W" + "l" * 6,
        "  games from an odd frame: 1 (mean +1.0, 1 won)",
        "  games from an even frame: 1 (mean -20.0, 0 won)",
        "  games by their first frame modulo 4: 0: 1 (mean -20.0, 0 won); 1: 1 (mean +1.0, 1 won)",
        "  games won (1):",
        "    points lost without touching the ball: 0 of 20",
        "    won, each game's first point: 100% of 1 (0 lost without touching the ball; "
        "served to the agent going down in 1)",
        "    won, served to the agent going down: 100% of 21",
        "    won, served to the agent going up: -",
        "    won, served to the computer going down: -",
        "    won, served to the computer going up: 0% of 20",
        "  games lost (1):",
        "    points lost without touching the ball: 15 of 21",
        "    won, each game's first point: 0% of 1 (1 lost without touching the ball; "
        "served to the agent going down in 1)",
        "    won, served to the agent going down: 6% of 16",
        "    won, served to the agent going up: -",
        "    won, served to the computer going down: -",
        "    won, served to the computer going up: 0% of 6",
    ]


def _shown_twice(observation, ale) -> bool:
    return pong_points.paddle_drawn_twice(observation)


def _each_step_while_moving(
    extra_start_frames: int, measure=_shown_twice, preprocessing=gym.wrappers.AtariPreprocessing
) -> list:
    """`measure(observation, ale)` after each step while the agent moves its paddle up, then
    down, in a real Pong game started with `extra_start_frames` no-op frames, preprocessed as
    the evaluation environments do (frame skip 4, the last two frames max-pooled or, with
    `atari._LastFrame`, the last alone, 84x84); by default whether the observation shows the
    paddle twice."""
    env = gym.make(
        "PongNoFrameskip-v4", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale"
    )
    env = preprocessing(env, noop_max=0, frame_skip=4, screen_size=84)
    try:
        env.reset(seed=0)
        for _ in range(extra_start_frames):
            env.unwrapped.ale.act(0)  # one emulator frame: shifts the game's parity
        meanings = env.unwrapped.get_action_meanings()
        up, down = meanings.index("RIGHT"), meanings.index("LEFT")  # Pong's RIGHT moves up
        # 3 steps take the paddle from the middle to the top wall, 4 back down.
        actions = [up] * 3 + [down] * 4
        return [measure(env.step(action)[0], env.unwrapped.ale) for action in actions]
    finally:
        env.close()


def test_a_moving_paddle_shows_twice_in_games_of_one_parity_only():
    shown = {extra: _each_step_while_moving(extra) for extra in (0, 1)}
    # Pong redraws the paddle on every other frame: with the max of a step's last two frames,
    # one parity sees each redraw between them (the paddle twice) and the other never does.
    assert sorted(map(any, shown.values())) == [False, True], shown
    assert max(sum(s) for s in shown.values()) >= 6, shown


def test_the_last_frame_alone_shows_a_moving_paddle_once_in_games_of_either_parity():
    shown = {
        extra: _each_step_while_moving(extra, preprocessing=atari._LastFrame) for extra in (0, 1)
    }
    assert not any(map(any, shown.values())), shown


def test_report_adds_what_the_network_saw_in_each_parity():
    game = [Point(won=False, touches=0, served_to_agent=True, served_down=True)] * 21
    sights = [
        pong_points.Sight(steps=100, paddle_twice=0, opening_value=-0.5),
        pong_points.Sight(steps=300, paddle_twice=150, opening_value=-0.25),
        pong_points.Sight(steps=100, paddle_twice=50, opening_value=-0.75),
    ]
    lines = pong_points.report("ckpt-7", [game] * 3, [13, 4, 8], sights)
    assert lines[4:6] == [
        "  games from an odd frame: 1 (mean -21.0, 0 won); paddle shown at two heights in "
        "0.0% of steps; value over the first 50 steps -0.500",
        "  games from an even frame: 2 (mean -21.0, 0 won); paddle shown at two heights in "
        "50.0% of steps; value over the first 50 steps -0.500",
    ]


def test_the_computers_paddle_keeps_a_four_frame_cycle_that_a_game_meets_at_one_phase():
    # Why the report also splits games by their first frame modulo 4: the frame skip of 4
    # keeps that phase all game long, and the computer's paddle (RAM byte 50, its height)
    # moves more often on one of the two even phases of its cycle than on the other.
    env = gym.make("PongNoFrameskip-v4", frameskip=1, repeat_action_probability=0.0)
    try:
        for seed in (0, 1):
            env.reset(seed=seed)
            ale = env.unwrapped.ale
            actions = np.random.default_rng(seed).integers(env.action_space.n, size=3000)
            moves = np.zeros(4, int)
            height = ale.getRAM()[50]
            for action in actions:
                ale.act(int(action))
                if ale.getRAM()[50] != height:
                    moves[ale.getEpisodeFrameNumber() % 4] += 1
                height = ale.getRAM()[50]
            even = sorted(moves[[0, 2]])
            assert even[1] > 1.5 * even[0] > 0, moves
    finally:
        env.close()


HELD_HEIGHT, DRAWN_HEIGHT = 60, 51  # RAM bytes: the agent's paddle as the game holds and draws it


def _paddle_rows(ale) -> tuple[int, int] | None:
    """The first and last screen rows of the agent's paddle, or None while it is not drawn."""
    lit = np.flatnonzero(ale.getScreenGrayscale()[34:194, 142] >= pong_points.PADDLE_GREY)
    return (int(lit[0]), int(lit[-1])) if lit.size else None


def test_the_game_reads_the_controller_on_odd_frames_and_draws_the_move_on_the_next():
    # Why a game's start parity changes how the paddle answers a step's action: each frame
    # the controller is read moves the height the game holds (byte 60), and the screen shows
    # that height (byte 51) only from the next frame, whatever frames the game was reset on.
    env = gym.make("PongNoFrameskip-v4", frameskip=1, repeat_action_probability=0.0)
    try:
        env.reset(seed=0)
        ale = env.unwrapped.ale
        # `ale.act` takes the emulator's own actions, not indices into the minimal set.
        actions, down = ale.getMinimalActionSet(), ale_py.Action.LEFT
        rng = np.random.default_rng(0)
        reads, draws = set(), set()
        for _ in range(4):
            for _ in range(int(rng.integers(100, 400))):
                ale.act(actions[rng.integers(len(actions))])
            ale.reset_game()
            for _ in range(int(rng.integers(120, 160))):
                ale.act(0)  # the paddle comes to rest
            for frame in range(12):
                ram, rows = ale.getRAM(), _paddle_rows(ale)
                held, drawn = ram[HELD_HEIGHT], ram[DRAWN_HEIGHT]
                ale.act(down if frame < 6 else 0)
                ram, number = ale.getRAM(), ale.getEpisodeFrameNumber()
                if ram[HELD_HEIGHT] != held:
                    reads.add(number % 2)
                if ram[DRAWN_HEIGHT] != drawn:
                    draws.add(number % 2)
                    assert ram[DRAWN_HEIGHT] == held, (number, held, ram[DRAWN_HEIGHT])
                assert (_paddle_rows(ale) != rows) == (ram[DRAWN_HEIGHT] != drawn), number
        assert (reads, draws) == ({1}, {0})
    finally:
        env.close()


def test_a_step_shows_where_its_action_left_the_paddle_only_in_games_from_an_even_frame():
    # So with the frame skip of 4, a game begun on an even frame reads the controller on each
    # step's first and third frames and shows both moves; one begun on an odd frame reads it on
    # the second and fourth, and its observation shows the paddle one read behind.
    def behind(observation, ale) -> tuple[int, bool]:
        ram = ale.getRAM()  # a step's 4 frames keep the start's parity
        return ale.getEpisodeFrameNumber() % 2, bool(ram[HELD_HEIGHT] != ram[DRAWN_HEIGHT])

    lags = {}
    for extra in (0, 1):
        steps = _each_step_while_moving(extra, behind)
        assert len({parity for parity, _ in steps}) == 1, steps
        lags[steps[0][0]] = sum(lag for _, lag in steps)
    assert lags == {0: 0, 1: 7}, lags
