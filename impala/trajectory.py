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
# refused as "value out of bounds"). Sound actors stay far inside them: a bound a sound network
# could reach would have every actor's data refused and stall the run. What no bound can make
# finite, the learner's train step skips (`optimise.Trainer`): nothing non-finite is applied.
#
# Behaviour logits: the loss reads them only as log mu(a) = l_a - logsumexp(l) >= -2 x bound -
# log(actions), finite for any finite logits, and V-trace uses pi / mu only clipped at 1. PPO's
# surrogate centred on the behaviour policy (the default --policy_clip) differentiates
# pi / mu = exp(log pi - log mu) itself: with logits of +-1e30 it is exp(2e30) = inf, the loss
# inf and its gradient NaN (0 x inf where the clip is flat), and clip_by_global_norm then makes
# every gradient NaN. That ratio stays finite only for logits within +-42 (exp overflows float32
# past 88.7), and the gradient's norm (which overflows past 1.8e19) only within about +-20 on
# Pong's batch of 16 x 20. A sharp sound policy's logits may lie beyond these, but the actions
# it samples are its likely ones, so pi / mu stays moderate: only a batch claiming actions its
# behaviour policy all but never takes overflows, and such batches are left to the skip. At 1e3
# the logits may spread ten times as far as where float32's softmax already rounds a
# probability to 0 (a spread of 104): no network needs more.
MAX_ABS_POLICY_LOGIT = 1e3
# Raw rewards, before --reward_clipping: with "none", V-trace's targets sum up to unroll-length
# of them, and the baseline loss squares those; at 1e6 the sum of squares over a batch and its
# gradient stay below float32's range by more than 1e8 (measured on Pong's network and batch).
# Atari's single rewards are orders of magnitude smaller.
MAX_ABS_REWARD = 1e6
# Core state: an LSTM's hidden state is within [-1, 1] and its cell grows by at most 1 a step,
# so a sound actor's stays below the steps of its longest game (Atari's: 27,000). At 1e6 the
# gates' inputs and their gradients stay finite.
MAX_ABS_CORE_STATE = 1e6
# A game's return, which the learner averages for its reports: Atari's human world records are
# below 1e8; a mean of returns within 1e9 is finite, and no one game can make it 1e28.
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
        previous unroll's last one, so in asynchronous collection it may come from the version
        before (synchronous collection decides it again with this version); V-trace corrects
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
