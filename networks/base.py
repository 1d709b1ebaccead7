"""Agent interface shared by actors and learners.

Every agent maps an `AgentInput` (plus a recurrent state) to an `AgentOutput`. Shapes use
`B` for the batch size and `T` for the unroll length:

* `Agent.__call__` processes one time step: inputs are [B, ...].
* `Agent.unroll` processes a sequence: inputs are [T, B, ...], outputs are [T, B, ...].

Sonnet creates variables lazily on the first call, so an agent has no variables until it has
been called once. Call `build_variables` (or the agent itself on `dummy_inputs`) eagerly before
creating a `tf.train.Checkpoint`, broadcasting weights or building an optimizer.
"""

import abc
from typing import Any, NamedTuple

import numpy as np
import sonnet as snt
import tensorflow as tf

# A (possibly empty) nest of tensors, e.g. `()` or `snt.LSTMState`.
AgentState = Any


class AgentInput(NamedTuple):
    """What the agent sees at one time step ([B, ...]) or over an unroll ([T, B, ...]).

    Attributes:
        prev_action: int32 [B] or [T, B]. Action taken on the transition into `observation`.
        reward: float32 [B] or [T, B]. Raw (unclipped) reward received on that transition.
        done: bool [B] or [T, B]. True where `observation` is the first of a new episode;
            recurrent state is reset to the initial state before this step is processed.
        observation: [B, ...] or [T, B, ...]. uint8 [.., 84, 84, 4] HWC frames for conv
            agents, float32 [.., D] vectors for `MLPAgent`.
    """

    prev_action: tf.Tensor
    reward: tf.Tensor
    done: tf.Tensor
    observation: tf.Tensor


def make_input(prev_action, reward, done, observation) -> AgentInput:
    """The agent's input for one step ([B]) or an unroll ([T, B]), from numpy arrays or tensors,
    in the dtypes every agent expects (observations keep theirs: uint8 frames stay compact)."""
    return AgentInput(
        prev_action=tf.cast(prev_action, tf.int32),
        reward=tf.cast(reward, tf.float32),
        done=tf.cast(done, tf.bool),
        observation=tf.convert_to_tensor(observation),
    )


class AgentOutput(NamedTuple):
    """Network outputs; the actor samples actions from `policy_logits` itself.

    Attributes:
        policy_logits: float32 [B, num_actions] or [T, B, num_actions].
        baseline: float32 [B] or [T, B]. State-value estimate.
    """

    policy_logits: tf.Tensor
    baseline: tf.Tensor


class Agent(snt.Module, abc.ABC):
    """Base class of all agents: one `initial_state`, one step `__call__`, one `unroll`."""

    def __init__(self, num_actions: int, name: str | None = None):
        """Initialises the agent.

        Args:
            num_actions: Size of the discrete action space.
            name: Sonnet module name; defaults to the snake-cased class name.
        """
        super().__init__(name=name)
        self._num_actions = num_actions

    @property
    def num_actions(self) -> int:
        return self._num_actions

    @property
    def is_recurrent(self) -> bool:
        """Whether the agent carries state between steps (False: state is always `()`)."""
        return False

    def initial_state(self, batch_size: int) -> AgentState:
        """Returns the state for the first step of `batch_size` episodes (`()` if stateless)."""
        del batch_size  # Stateless agents have nothing to size.
        return ()

    @abc.abstractmethod
    def __call__(self, inputs: AgentInput, state: AgentState) -> tuple[AgentOutput, AgentState]:
        """Processes one time step.

        Args:
            inputs: `AgentInput` with [B, ...] tensors.
            state: Nest from `initial_state(B)` or a previous call.

        Returns:
            (`AgentOutput` with [B, ...] tensors, new state).
        """

    @abc.abstractmethod
    def unroll(self, inputs: AgentInput, state: AgentState) -> tuple[AgentOutput, AgentState]:
        """Processes a sequence; equal to calling `__call__` once per time step.

        Args:
            inputs: `AgentInput` with [T, B, ...] tensors. T should be static for speed.
            state: Nest from `initial_state(B)`: the state before the first step.

        Returns:
            (`AgentOutput` with [T, B, ...] tensors, state after the last step).
        """


def dummy_inputs(
    observation_shape: tuple[int, ...],
    observation_dtype: tf.DType | np.dtype | str,
    batch_size: int = 1,
    time: int | None = None,
) -> AgentInput:
    """Builds all-zero inputs, e.g. to create an agent's variables.

    Args:
        observation_shape: Shape of one observation without batch/time dims, e.g. (84, 84, 4).
        observation_dtype: Observation dtype, e.g. tf.uint8 or np.float32.
        batch_size: B.
        time: T; if given, tensors are [T, B, ...] (for `unroll`), else [B, ...].

    Returns:
        `AgentInput` of zeros with `done` all False.
    """
    leading = (batch_size,) if time is None else (time, batch_size)
    return AgentInput(
        prev_action=tf.zeros(leading, tf.int32),
        reward=tf.zeros(leading, tf.float32),
        done=tf.zeros(leading, tf.bool),
        observation=tf.zeros(leading + tuple(observation_shape), tf.as_dtype(observation_dtype)),
    )


def build_variables(
    agent: Agent,
    observation_shape: tuple[int, ...],
    observation_dtype: tf.DType | np.dtype | str,
) -> None:
    """Creates all of `agent`'s variables by calling it once, eagerly, on a dummy batch.

    Call this before checkpointing, broadcasting or optimising `agent.trainable_variables`.
    Calling it again is harmless: no new variables are created.
    """
    inputs = dummy_inputs(observation_shape, observation_dtype, batch_size=1)
    agent(inputs, agent.initial_state(1))
