"""`impala/Catch-v0`: a small game drawn in the Atari observation shape, for learning tests.

A ball falls from the top of a 10 x 10 board, one row per step, in a random column; the agent
moves a paddle along the bottom row (0: left, 1: stay, 2: right). When the ball reaches the
bottom row the episode ends with +1 if the paddle is under it and -1 if not. The right action
depends on where the ball is in the picture, and the reward comes 9 steps after the first
decision, so a learner must read pixels and assign credit through time, which CartPole does not
ask. A random policy scores about -0.75; a perfect one scores 1.

Observations are what `AtariVectorEnv` gives: uint8 [84, 84, 4], the last 4 frames with the
newest last, all zero but the newest at the start of an episode. Each board cell is an 8 x 8
pixel square (value 255 for the ball and the paddle).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

CATCH_LEVEL = "impala/Catch-v0"

# Flags that learn Catch through the distributed path in about 40k frames (18 catches in 20 games):
# small batches and Adam, and the entropy bonus they were measured with (0.01, also Pong's
# default), four steps per batch and the learning rate annealed to 0 over the whole short budget
# (the paper's schedule), which they were measured with, every trajectory fresh (the replay
# learning test adds its own mix). The learning test and
# `make bench-learning ARGS=--config=catch` use them.
QUICK_LEARNING_FLAGS = (
    f"--level_name={CATCH_LEVEL}",
    "--agent_name=ShallowConvNetAgent",
    "--optimizer=adam",
    "--epsilon=1e-8",
    "--decay=0.999",
    "--learning_rate=1e-3",
    "--batch_size=8",
    "--unroll_length=10",
    "--num_envs_per_actor=8",
    "--entropy_cost=0.01",
    "--batch_reuse=4",
    "--replay_parameters=",
    "--learning_rate_anneal_frames=0",
    "--learning_rate_cooldown_fraction=0",
)

_ROWS = 10
_COLUMNS = 10
_CELL_PIXELS = 8
_SIZE = 84  # pixels; the board (80 x 80) sits in its top-left corner
_STACK = 4
_LEFT, _STAY, _RIGHT = 0, 1, 2


class CatchEnv(gym.Env):
    """Catch the falling ball: observation uint8 [84, 84, 4], 3 actions, 9 steps an episode."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's convention.

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (_SIZE, _SIZE, _STACK), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._frames = np.zeros((_SIZE, _SIZE, _STACK), np.uint8)
        self._ball_row = 0
        self._ball_column = 0
        self._paddle = _COLUMNS // 2

    @property
    def ball(self) -> tuple[int, int]:
        """(row, column) of the ball."""
        return self._ball_row, self._ball_column

    @property
    def paddle(self) -> int:
        """Column of the paddle (it sits on the bottom row)."""
        return self._paddle

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._ball_row = 0
        self._ball_column = int(self.np_random.integers(_COLUMNS))
        self._paddle = _COLUMNS // 2
        self._frames[:] = 0
        return self._push_frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        move = {_LEFT: -1, _STAY: 0, _RIGHT: 1}[int(action)]
        self._paddle = int(np.clip(self._paddle + move, 0, _COLUMNS - 1))
        self._ball_row += 1
        terminated = self._ball_row == _ROWS - 1
        reward = 0.0
        if terminated:
            reward = 1.0 if self._paddle == self._ball_column else -1.0
        return self._push_frame(), reward, terminated, False, {}

    def _push_frame(self) -> np.ndarray:
        self._frames[..., :-1] = self._frames[..., 1:]
        frame = self._frames[..., -1]
        frame[:] = 0
        _fill_cell(frame, self._ball_row, self._ball_column)
        _fill_cell(frame, _ROWS - 1, self._paddle)
        return self._frames.copy()


def _fill_cell(frame: np.ndarray, row: int, column: int) -> None:
    top, left = row * _CELL_PIXELS, column * _CELL_PIXELS
    frame[top : top + _CELL_PIXELS, left : left + _CELL_PIXELS] = 255


def best_action(observation: np.ndarray) -> int:
    """The action that moves the paddle toward the ball, read from the newest frame."""
    frame = observation[..., -1]
    cells = frame[::_CELL_PIXELS, ::_CELL_PIXELS][:_ROWS, :_COLUMNS] > 0
    paddle = int(np.flatnonzero(cells[_ROWS - 1])[0])
    _, ball_columns = np.nonzero(cells[: _ROWS - 1])
    if len(ball_columns) == 0:  # the ball is on the paddle's row: nothing left to decide
        return _STAY
    ball = int(ball_columns[0])
    return _STAY if ball == paddle else (_RIGHT if ball > paddle else _LEFT)


if CATCH_LEVEL not in gym.registry:  # Re-imports must not re-register (it warns).
    gym.register(id=CATCH_LEVEL, entry_point=CatchEnv)
