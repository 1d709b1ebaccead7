"""`VectorEnvironment`: the one interface an actor steps, whatever backend serves its level.

All backends follow the IMPALA / scalable_agent convention: `StepOutput.done[i]` means
an episode ended on this step and `StepOutput.observation[i]` is already the
first observation of the next one (same-step auto-reset). With
`episodic_life`, losing an Atari life also ends a *training* episode, but the
scores reported by `pop_episode_stats` are always whole games, as in papers.
"""

from __future__ import annotations

import numpy as np

from impala.envs.config import Backend, EnvConfig, EpisodeStats, StepOutput, _Transition
from impala.envs.serial import _SerialBackend


class VectorEnvironment:
    """`num_envs` environments stepped together, with same-step auto-reset.

    The attributes `num_envs`, `num_actions`, `observation_shape`,
    `observation_dtype` and `frames_per_step` describe what the actor produces;
    an actor sends them to the learner so both sides can check they agree.

    Use as a context manager, or call `close()`, to free threads and emulators.
    """

    def __init__(self, backend: Backend, config: EnvConfig) -> None:
        self._backend = backend
        self._config = config
        self.num_envs: int = config.num_envs
        self.num_actions: int = backend.num_actions
        self.observation_shape: tuple[int, ...] = tuple(backend.observation_shape)
        self.observation_dtype: np.dtype = np.dtype(backend.observation_dtype)
        self.frames_per_step: int = backend.frames_per_step
        self._seeded = False
        self._started = False
        self._closed = False
        self._finished: list[EpisodeStats] = []
        self._returns = np.zeros(self.num_envs, np.float64)
        self._steps = np.zeros(self.num_envs, np.int64)
        self._frames = np.zeros(self.num_envs, np.int64)
        self._start_frames: np.ndarray | None = None  # set by reset(), before any step

    @property
    def config(self) -> EnvConfig:
        """The configuration this vector was built from."""
        return self._config

    @property
    def frame_pooling(self) -> str:
        """The frame an Atari step shows ("max" for every other family, which has no choice)."""
        return self._config.frame_pooling

    def reset(self) -> StepOutput:
        """Starts a new episode in every environment, dropping unfinished ones.

        The first call seeds environment i with `config.seed + i`; later calls
        continue the environments' random streams instead of replaying them.

        Returns:
            reward float32 [N] zeros, done bool [N] all True, observation [N, ...].
        """
        self._check_open()
        observation = self._backend.reset(None if self._seeded else self._config.seed)
        self._seeded = self._started = True
        self._returns[:] = 0.0
        self._steps[:] = 0
        self._frames[:] = 0
        self._start_frames = self._game_starts()
        return StepOutput(
            reward=np.zeros(self.num_envs, np.float32),
            done=np.ones(self.num_envs, bool),
            observation=observation,
        )

    def step(self, actions: np.ndarray) -> StepOutput:
        """Applies one action per environment.

        Args:
            actions: Integers in [0, num_actions), shape [N].

        Returns:
            The reward, done and next observation per environment (see StepOutput).
        """
        self._check_open()
        if not self._started:
            raise RuntimeError("VectorEnvironment.step() called before reset()")
        transition = self._backend.step(self._checked_actions(actions))
        self._record(transition)
        done = transition.episode_end
        if self._config.episodic_life:
            done = done | transition.life_lost
        return StepOutput(reward=transition.reward, done=done, observation=transition.observation)

    def render(self, final: bool = False) -> np.ndarray:
        """The screen of every environment, as a person would see it.

        Only for vectors from `make_evaluation_environment(config, render=True)`.

        Args:
            final: For the environments whose episode ended on the last `step()` (and
                that already started the next one, as their observation shows): the
                last screen of the episode that ended instead of the first of the next.

        Returns:
            uint8 [N, height, width, 3] RGB, e.g. [N, 210, 160, 3] for Atari.

        Raises:
            ValueError: The vector was built without screens, or its id cannot show one.
        """
        self._check_open()
        if not isinstance(self._backend, _SerialBackend):
            raise ValueError(
                f"{self._config.level_name!r} was built for training, without screens: use "
                f"make_evaluation_environment(config, render=True)"
            )
        return self._backend.render(final)

    def ram(self) -> np.ndarray:
        """Each Atari console's memory now, uint8 [N, 128], as the games' own code keeps them.

        Only for vectors from `make_evaluation_environment(config)` of an Atari id (the
        training backend steps its consoles in C++ threads and does not show them).

        Raises:
            ValueError: The vector was built for training, or its id is not an Atari game.
        """
        return self._console_backend().ram()

    def episode_frames(self) -> np.ndarray:
        """Emulator frames each Atari console has run in its current game, int64 [N].

        Right after a game starts, the no-op and FIRE frames it started with. With an even
        frame skip their parity holds for the whole game; games that act on two-frame cycles
        (Pong moves the paddle so) respond to the same action differently in odd and even ones.
        Only for vectors from `make_evaluation_environment(config)` of an Atari id.

        Raises:
            ValueError: As `ram()`.
        """
        return self._console_backend().episode_frames()

    def _console_backend(self) -> _SerialBackend:
        self._check_open()
        if not isinstance(self._backend, _SerialBackend):
            raise ValueError(
                f"{self._config.level_name!r} was built for training, its consoles unseen: use "
                f"make_evaluation_environment(config)"
            )
        return self._backend

    @property
    def screen_fps(self) -> float | None:
        """`render()` screens per second of real time when shown once per agent step.

        Atari: the console's 60 frames/s over `frames_per_step` (15 for frame skip 4).
        Other ids: their `render_fps` over `frames_per_step`. None where unknown.
        """
        return getattr(self._backend, "screen_fps", None)

    def pop_episode_stats(self) -> list[EpisodeStats]:
        """Whole episodes (games) finished since the last call, oldest first."""
        finished, self._finished = self._finished, []
        return finished

    def close(self) -> None:
        """Frees the environments; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self) -> VectorEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("VectorEnvironment used after close()")

    def _checked_actions(self, actions: np.ndarray) -> np.ndarray:
        """Validates actions (the Atari C++ side hangs on bad ones); int64 [N]."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(
                f"actions must be integers of shape ({self.num_envs},), "
                f"got {actions.dtype} {actions.shape}"
            )
        if actions.size and (actions.min() < 0 or actions.max() >= self.num_actions):
            raise ValueError(
                f"actions must be in [0, {self.num_actions}) for {self._config.level_name!r}, "
                f"got {actions.tolist()}"
            )
        return actions.astype(np.int64)

    def _record(self, transition: _Transition) -> None:
        """Adds the step to the running games; closes the games that ended."""
        self._returns += transition.reward
        self._steps += 1
        self._frames += transition.frames
        starts = self._start_frames  # the finished games'; the backend holds the new ones'
        for index in np.flatnonzero(transition.episode_end):
            self._finished.append(
                EpisodeStats(
                    env_index=int(index),
                    episode_return=float(self._returns[index]),
                    episode_steps=int(self._steps[index]),
                    episode_frames=int(self._frames[index]),
                    start_frames=-1 if starts is None else int(starts[index]),
                )
            )
        self._returns[transition.episode_end] = 0.0
        self._steps[transition.episode_end] = 0
        self._frames[transition.episode_end] = 0
        if transition.episode_end.any():
            self._start_frames = self._game_starts()

    def _game_starts(self) -> np.ndarray | None:
        """The frames each running game began with (`EpisodeStats.start_frames`), or None
        for a family that has no such start."""
        start_frames = getattr(self._backend, "start_frames", None)
        return None if start_frames is None else start_frames()
