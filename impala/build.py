"""Building a run's environments and agent from its settings: one way, for every role.

The actor, the learner, the single-process trainer, --mode=test and the benchmarks all build
them here, so that they see the same game the same way and the same network.
"""

from __future__ import annotations

import networks
from impala import configs, envs


def environment(
    level_name: str,
    num_envs: int,
    seed: int = 0,
    num_action_repeats: int = 1,
    repeat_action_probability: float = 0.0,
    frame_skip: int = 0,
    frame_pooling: str = "max",
) -> envs.VectorEnvironment:
    """`num_envs` environments of `level_name` as training sees them; ValueError names a bad
    flag. Environment i is seeded `seed + i`. `repeat_action_probability` turns on Atari's
    sticky actions; `frame_skip` sets Atari's (0: 4), `frame_pooling` the frame its steps show."""
    return envs.make_environment(
        envs.EnvConfig(
            level_name=level_name,
            num_envs=num_envs,
            seed=seed,
            num_action_repeats=num_action_repeats,
            repeat_action_probability=repeat_action_probability,
            frame_skip=frame_skip,
            frame_pooling=frame_pooling,
        )
    )


def game_environment(game: configs.GameConfig, num_envs: int, seed: int) -> envs.VectorEnvironment:
    """`num_envs` environments of the run's `game` as training sees them, environment i seeded
    `seed + i`; ValueError names a bad flag."""
    return envs.make_environment(envs.EnvConfig.for_game(game, num_envs, seed))


def agent(
    agent_name: str, env: envs.VectorEnvironment, compute_dtype: str = "float32"
) -> networks.Agent:
    """The network `agent_name` for `env`'s actions and observations, its variables created,
    computing in `compute_dtype` (`--compute_dtype`)."""
    return agent_for(
        agent_name, env.num_actions, env.observation_shape, env.observation_dtype, compute_dtype
    )


def agent_for(
    agent_name: str,
    num_actions: int,
    observation_shape: tuple[int, ...],
    observation_dtype,
    compute_dtype: str = "float32",
) -> networks.Agent:
    """The network `agent_name` for these actions and observations (a checkpoint's, say), its
    variables created."""
    built = networks.make_agent(agent_name, num_actions, compute_dtype)
    networks.build_variables(built, tuple(observation_shape), observation_dtype)
    return built


def environment_and_agent(
    game: configs.GameConfig,
    agent_name: str,
    num_envs: int,
    seed: int,
    compute_dtype: str = "float32",
) -> tuple[envs.VectorEnvironment, networks.Agent]:
    """`game_environment` and `agent`; the environments are closed again if the agent cannot
    be built."""
    env = game_environment(game, num_envs, seed)
    try:
        return env, agent(agent_name, env, compute_dtype)
    except BaseException:
        env.close()
        raise
