"""What actors send and learners train on: time steps, unrolls and batches of unrolls.

Time step `t` of an unroll reads: the environment handed out `observation[t]`, having paid
`reward[t]` for the transition into it (`done[t]` means the previous episode ended and this is
the first observation of a new one); the agent, given `prev_action[t]` and its core state, chose
`action[t]` with logits `policy_logits[t]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf

# Bounds on what an actor sends, enforced by the learner's transport (a chunk beyond them is
# refused as "value out of bounds"); sound actors stay far inside them.
# Behaviour logits: V-trace takes exp(target - behaviour log-probabilities); a gap of 1e3 already
# means a deterministic policy, and within it every sum the loss makes stays finite in float32.
MAX_ABS_POLICY_LOGIT = 1e3
# Raw rewards before clipping: Atari's largest single rewards are in the thousands.
MAX_ABS_REWARD = 1e6
# Core state (LSTM cells grow at most by one per step).
MAX_ABS_CORE_STATE = 1e6
# A game's return: Atari's highest scores are below 1e7.
MAX_ABS_EPISODE_RETURN = 1e9


class Steps(NamedTuple):
    """Per-time-step fields of trajectories, time-major.

    Each field is [T + 1, B, ...] in an unroll or a batch (as below) and [B, ...] for one step,
    a numpy array or, on the learner, a tensor.

    Attributes:
      prev_action: [T + 1, B] int32 action taken before each observation.
      reward: [T + 1, B] float32 raw reward of the transition into each observation.
      done: [T + 1, B] bool, True where the observation starts a new episode.
      observation: [T + 1, B, ...] observations.
      action: [T + 1, B] int32 actions chosen by the behaviour policy.
      policy_logits: [T + 1, B, NUM_ACTIONS] float32 behaviour-policy logits.
    """

    prev_action: np.ndarray | tf.Tensor
    reward: np.ndarray | tf.Tensor
    done: np.ndarray | tf.Tensor
    observation: np.ndarray | tf.Tensor
    action: np.ndarray | tf.Tensor
    policy_logits: np.ndarray | tf.Tensor


class Unroll(NamedTuple):
    """A trajectory segment from one actor, time-major.

    Attributes:
      agent_state: the agent's core state before step 0, a nest of [B, ...] arrays (`()` for
        feed-forward agents).
      steps: the T + 1 time steps, [T + 1, B, ...] numpy arrays.
      weight_version: the learner's weight version that chose actions 1..T. Action 0 is the
        previous unroll's last action, so it may come from the version before; V-trace corrects
        for it either way, since `steps.policy_logits` are those that really chose each action.
    """

    agent_state: Any
    steps: Steps
    weight_version: int


class Batch(NamedTuple):
    """What the train step consumes: `actor.Unroll`s batched along the batch axis.

    Attributes:
      agent_state: core state before step 0, nest of [B, ...].
      steps: the time steps, [T + 1, B, ...]: raw rewards, behaviour-policy logits.
    """

    agent_state: Any
    steps: Steps


def stack_unrolls(unrolls: Sequence[Unroll]) -> Batch:
    """Concatenates `actor.Unroll`s along the batch axis into one `Batch` of numpy arrays."""
    return Batch(
        # States are batch-major, [B, ...]; steps are time-major, [T + 1, B, ...].
        agent_state=_map_nest(
            lambda *states: np.concatenate(states, axis=0), *(u.agent_state for u in unrolls)
        ),
        steps=Steps(
            *(
                np.concatenate(fields, axis=1)
                for fields in zip(*(u.steps for u in unrolls), strict=True)
            )
        ),
    )


def _map_nest(function, *nests):
    """`tf.nest.map_structure` for the nests agent states are: arrays, tuples and namedtuples."""
    first = nests[0]
    if isinstance(first, tuple):
        mapped = [_map_nest(function, *parts) for parts in zip(*nests, strict=True)]
        return type(first)(*mapped) if hasattr(first, "_fields") else tuple(mapped)
    return function(*nests)
