"""Concrete agents and the name -> class registry used by `--agent_name`."""

import abc
from collections.abc import Callable
from typing import Any

import sonnet as snt
import tensorflow as tf

from networks.base import Agent, AgentInput, AgentOutput, AgentState
from networks.torsos import (
    COMPUTE_DTYPES,
    DQNTorso,
    MLPTorso,
    PolicyBaselineHead,
    ResNetTorso,
    ShallowTorso,
)


def _to_tensors(nest: Any) -> Any:
    # Inputs and states may arrive as numpy arrays (from another process); Sonnet helpers such
    # as snt.merge_leading_dims silently pass non-tensors through unchanged.
    return tf.nest.map_structure(tf.convert_to_tensor, nest)


def _batch_apply(fn: Callable[[Any], Any], x: Any, num_dims: int) -> Any:
    """Applies `fn` (which expects [N, ...]) to `x`, a tensor or a nest of tensors, each
    [D1, ..., Dnum_dims, ...], keeping those dims."""
    outputs = fn(tf.nest.map_structure(lambda t: snt.merge_leading_dims(t, num_dims), x))
    leading = tf.nest.flatten(x)[0]
    return tf.nest.map_structure(lambda y: snt.split_leading_dim(y, leading, num_dims), outputs)


class FeedForwardAgent(Agent):
    """Stateless agent: torso on the observation, then policy/baseline heads.

    Ignores `reward` and `done`, and `prev_action` unless a subclass's `_outputs` uses it; its
    state is always `()`.
    """

    def __init__(self, num_actions: int, compute_dtype: str = "float32", name: str | None = None):
        super().__init__(num_actions, name=name)
        self._compute_dtype = compute_dtype
        self._torso = self._make_torso()
        self._head = PolicyBaselineHead(num_actions)

    @abc.abstractmethod
    def _make_torso(self) -> snt.Module:
        """Returns a module mapping observations [N, ...] to features [N, H], computing in
        `self._compute_dtype` if it can (`LOW_PRECISION_AGENTS`)."""

    def _outputs(self, inputs: AgentInput) -> AgentOutput:
        """Maps inputs with one leading dim [N, ...] to outputs [N, ...]."""
        return self._head(self._torso(inputs.observation))

    def __call__(self, inputs: AgentInput, state: AgentState) -> tuple[AgentOutput, AgentState]:
        return self._outputs(_to_tensors(inputs)), state

    def unroll(self, inputs: AgentInput, state: AgentState) -> tuple[AgentOutput, AgentState]:
        # No time dependence, so one big [T * B] batch is both correct and fastest.
        return _batch_apply(self._outputs, _to_tensors(inputs), 2), state


class SimpleConvNetAgent(FeedForwardAgent):
    """Nature-DQN conv torso (fc 512) with policy and baseline heads; uint8 frames in."""

    def _make_torso(self) -> snt.Module:
        return DQNTorso(self._compute_dtype)


class ShallowConvNetAgent(FeedForwardAgent):
    """IMPALA shallow conv torso (fc 256) with policy and baseline heads; uint8 frames in."""

    def _make_torso(self) -> snt.Module:
        return ShallowTorso(self._compute_dtype)


class ShallowConvNetLastActionAgent(ShallowConvNetAgent):
    """The shallow agent with the one-hot previous action joined to its conv features.

    Still stateless, but the fully connected layer sees which action led to the newest frame,
    so it can tell from how the picture moved what a still frame does not show (in Pong, the
    paddle answers the same action differently in games that began on odd and on even frames).
    """

    def _outputs(self, inputs: AgentInput) -> AgentOutput:
        # A game's first step shows no action (the last one belonged to the game before, or,
        # in a fresh environment, to none), so that training and evaluation see the same input.
        prev_action = tf.one_hot(inputs.prev_action, self.num_actions, dtype=tf.float32)
        prev_action *= 1.0 - tf.cast(inputs.done, tf.float32)[:, None]
        return self._head(self._torso(inputs.observation, prev_action))


class ResNetAgent(FeedForwardAgent):
    """IMPALA deep ResNet torso (fc 256) with policy and baseline heads; uint8 frames in."""

    def _make_torso(self) -> snt.Module:
        return ResNetTorso()


class MLPAgent(FeedForwardAgent):
    """2x64 tanh MLP with policy and baseline heads; float vector observations [B, D] in."""

    def _make_torso(self) -> snt.Module:
        return MLPTorso(hidden_sizes=(64, 64))


def _reset_where(done: tf.Tensor, state: AgentState, initial_state: AgentState) -> AgentState:
    """Replaces `state` by `initial_state` in the batch rows where `done` [B] is True."""

    def reset(current: tf.Tensor, initial: tf.Tensor) -> tf.Tensor:
        mask = tf.reshape(done, [-1] + [1] * (current.shape.rank - 1))
        return tf.where(mask, initial, current)

    return tf.nest.map_structure(reset, state, initial_state)


class ResettingCore(snt.RNNCore):
    """Wraps an RNN core so that its state is reset at episode boundaries.

    Takes `(core_input [B, F], done [B])` per step; rows with `done` start from the wrapped
    core's initial state, so one unroll can span several episodes.
    """

    def __init__(self, core: snt.RNNCore, name: str | None = None):
        super().__init__(name=name)
        self._core = core

    def initial_state(self, batch_size: int | tf.Tensor) -> AgentState:
        return self._core.initial_state(batch_size)

    def __call__(
        self, inputs: tuple[tf.Tensor, tf.Tensor], prev_state: AgentState
    ) -> tuple[tf.Tensor, AgentState]:
        """Maps `(core_input [B, F], done [B])` and the previous state to ([B, H], new state)."""
        core_input, done = inputs
        initial_state = self._core.initial_state(tf.shape(done)[0])
        return self._core(core_input, _reset_where(done, prev_state, initial_state))


class LSTMAgent(Agent):
    """A torso, then an LSTM(256) fed with the torso output, one-hot previous action and
    clipped reward, then policy and baseline heads. State: `snt.LSTMState`.
    """

    def __init__(self, num_actions: int, compute_dtype: str = "float32", name: str | None = None):
        super().__init__(num_actions, name=name)
        self._compute_dtype = compute_dtype
        self._torso = self._make_torso()
        self._core = ResettingCore(snt.LSTM(256))
        self._head = PolicyBaselineHead(num_actions)

    @abc.abstractmethod
    def _make_torso(self) -> snt.Module:
        """Returns a module mapping observations [N, ...] to features [N, H]."""

    @property
    def is_recurrent(self) -> bool:
        return True

    def initial_state(self, batch_size: int) -> snt.LSTMState:
        """Returns zero LSTM state: hidden and cell, each float32 [batch_size, 256]."""
        return self._core.initial_state(batch_size)

    def _core_input(self, inputs: AgentInput, num_dims: int) -> tf.Tensor:
        """Maps inputs with `num_dims` leading dims ([B] or [T, B]) to [..., 256 + A + 1]."""
        features = _batch_apply(self._torso, inputs.observation, num_dims)
        prev_action = tf.one_hot(inputs.prev_action, self.num_actions, dtype=tf.float32)
        # As in the paper: the LSTM sees the (clipped) reward and the action that led here.
        reward = tf.clip_by_value(tf.cast(inputs.reward, tf.float32), -1.0, 1.0)
        return tf.concat([features, prev_action, reward[..., None]], axis=-1)

    def __call__(
        self, inputs: AgentInput, state: snt.LSTMState
    ) -> tuple[AgentOutput, snt.LSTMState]:
        inputs, state = _to_tensors(inputs), _to_tensors(state)
        core_output, state = self._core((self._core_input(inputs, 1), inputs.done), state)
        return self._head(core_output), state

    def unroll(self, inputs: AgentInput, state: snt.LSTMState) -> tuple[AgentOutput, snt.LSTMState]:
        # The torso and heads are time-independent, so they run on one [T * B] batch; only
        # the LSTM steps through time.
        inputs, state = _to_tensors(inputs), _to_tensors(state)
        core_input = self._core_input(inputs, 2)
        # A Python loop (static T) lets XLA/grappler see the whole unroll; a while loop is
        # only needed when T is unknown at trace time.
        unroll_fn = snt.static_unroll if core_input.shape[0] is not None else snt.dynamic_unroll
        core_output, state = unroll_fn(self._core, (core_input, inputs.done), state)
        return _batch_apply(self._head, core_output, 2), state


class ResNetLSTMAgent(LSTMAgent):
    """IMPALA deep ResNet torso, then the LSTM core and heads (the paper's deep agent)."""

    def _make_torso(self) -> snt.Module:
        return ResNetTorso()


class ShallowLSTMAgent(LSTMAgent):
    """IMPALA shallow conv torso, then the LSTM core and heads (the paper's shallow agent)."""

    def _make_torso(self) -> snt.Module:
        return ShallowTorso(self._compute_dtype)


AGENTS: dict[str, type[Agent]] = {
    cls.__name__: cls
    for cls in (
        SimpleConvNetAgent,
        ShallowConvNetAgent,
        ShallowConvNetLastActionAgent,
        ResNetAgent,
        ResNetLSTMAgent,
        ShallowLSTMAgent,
        MLPAgent,
    )
}


# The agents whose torso computes in bfloat16 if asked (`--compute_dtype`): the conv stacks.
LOW_PRECISION_AGENTS = (
    "SimpleConvNetAgent",
    "ShallowConvNetAgent",
    "ShallowConvNetLastActionAgent",
    "ShallowLSTMAgent",
)


def make_agent(agent_name: str, num_actions: int, compute_dtype: str = "float32") -> Agent:
    """Builds the agent registered as `agent_name` (case-insensitive) in `AGENTS`, its torso
    computing in `compute_dtype` (float32 weights either way).

    Raises:
        ValueError: If `agent_name` is not a key of `AGENTS` (ignoring case), or the agent
          cannot compute in `compute_dtype`.
    """
    by_lower_name = {name.lower(): cls for name, cls in AGENTS.items()}
    cls = by_lower_name.get(agent_name.lower())
    if cls is None:
        raise ValueError(
            f"Unknown --agent_name={agent_name!r}; valid choices: {', '.join(AGENTS)}."
        )
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"--compute_dtype={compute_dtype}: must be float32 or bfloat16")
    if compute_dtype != "float32":
        if cls.__name__ not in LOW_PRECISION_AGENTS:
            raise ValueError(
                f"--compute_dtype={compute_dtype}: {cls.__name__} computes in float32 only; "
                f"{', '.join(LOW_PRECISION_AGENTS)} can"
            )
        return cls(num_actions, compute_dtype)
    return cls(num_actions)
