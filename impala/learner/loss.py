"""The IMPALA loss on a batch of unrolls: policy gradient + baseline + entropy terms.

Shapes follow `impala.trajectory.Batch`: a batch's steps are `[T + 1, B, ...]`, where B counts
environment trajectories. The loss terms are sums over time and batch, as in the IMPALA paper's
code, so the paper's learning rates apply unchanged. With `policy_clip` the policy term is PPO's
clipped surrogate on V-trace's targets instead (`compute_clipped_policy_loss`), centred on the
behaviour policy or, with `policy_clip_center` "learner", on the learner's policy when the batch
arrived.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

import networks
import vtrace
from impala.configs import LearnerConfig
from impala.trajectory import Batch


def clip_rewards(rewards: tf.Tensor, reward_clipping: str) -> tf.Tensor:
    """Clips [T, B] rewards: `abs_one` to [-1, 1]; `soft_asymmetric` squashes, negatives by 0.3."""
    if reward_clipping == "abs_one":
        return tf.clip_by_value(rewards, -1.0, 1.0)
    if reward_clipping == "soft_asymmetric":
        squeezed = tf.tanh(rewards / 5.0)
        # Negative rewards are scaled down relative to positive ones.
        return tf.where(rewards < 0, 0.3 * squeezed, squeezed) * 5.0
    if reward_clipping == "none":
        return rewards
    raise ValueError(f"unknown reward_clipping {reward_clipping!r}")


def compute_baseline_loss(advantages: tf.Tensor) -> tf.Tensor:
    """Half the summed squared error of the baseline; advantages [T, B] = vs - V."""
    return 0.5 * tf.reduce_sum(tf.square(advantages))


def compute_entropy_loss(logits: tf.Tensor) -> tf.Tensor:
    """Negative summed policy entropy of [T, B, NUM_ACTIONS] logits (minimising it explores)."""
    policy = tf.nn.softmax(logits)
    log_policy = tf.nn.log_softmax(logits)
    return tf.reduce_sum(policy * log_policy)


def compute_policy_gradient_loss(
    logits: tf.Tensor, actions: tf.Tensor, advantages: tf.Tensor
) -> tf.Tensor:
    """Summed -log pi(a|x) * advantage over [T, B]; advantages carry no gradient."""
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=actions, logits=logits)
    return tf.reduce_sum(cross_entropy * tf.stop_gradient(advantages))


def compute_clipped_policy_loss(
    log_rhos: tf.Tensor, advantages: tf.Tensor, clip: float, weights: tf.Tensor | float = 1.0
) -> tf.Tensor:
    """PPO's clipped surrogate, negated, weighted and summed over [T, B].

    The ratio exp(log_rhos) is pi over the policy the clip is centred on (the behaviour policy,
    or the learner's when the batch arrived); where it has left [1 - clip, 1 + clip] in the
    advantage's favour, the term is flat and gives no gradient. `weights` [T, B] (constants)
    importance-weight each step's term.
    """
    ratio = tf.exp(log_rhos)
    advantages = tf.stop_gradient(advantages)
    surrogate = tf.minimum(
        ratio * advantages, tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * advantages
    )
    return -tf.reduce_sum(tf.stop_gradient(weights) * surrogate)


def clipped_fraction(log_rhos: tf.Tensor, policy_clip: float) -> tf.Tensor:
    """The fraction of [T, B] steps whose ratio pi / mu lies beyond a clip's bound.

    With `policy_clip` 0, V-trace's: ratios above 1 (rho-bar and c-bar); otherwise PPO's clip
    fraction: ratios outside [1 - policy_clip, 1 + policy_clip] (the surrogate is flat on those
    whose advantage pushes further out). Near 1, the learner trains on data its policy has moved
    far from (policy lag, or too many steps per batch).
    """
    ratio = tf.exp(tf.stop_gradient(log_rhos))
    clipped = tf.abs(ratio - 1.0) > policy_clip if policy_clip > 0 else ratio > 1.0
    return tf.reduce_mean(tf.cast(clipped, tf.float32))


class LossTerms(NamedTuple):
    total: tf.Tensor
    policy_gradient: tf.Tensor
    baseline: tf.Tensor
    entropy: tf.Tensor
    clipped_fraction: tf.Tensor  # a statistic, not a term of the loss
    # The learner's policy on the batch [T, B, NUM_ACTIONS], without gradient: where a
    # learner-centred clip is centred on the later steps of a batch.
    target_logits: tf.Tensor


def unroll(agent: networks.Agent, batch: Batch) -> networks.AgentOutput:
    """The agent's outputs on a [T + 1, B] batch's steps, from the batch's core state."""
    steps = batch.steps
    inputs = networks.make_input(steps.prev_action, steps.reward, steps.done, steps.observation)
    outputs, _ = agent.unroll(inputs, batch.agent_state)
    return outputs


def compute_loss(
    agent: networks.Agent,
    batch: Batch,
    config: LearnerConfig,
    proximal_logits: tf.Tensor | None = None,
    entropy_cost: tf.Tensor | float | None = None,
) -> LossTerms:
    """The IMPALA loss of a [T + 1, B] batch: policy gradient + baseline + entropy terms.

    Args:
      proximal_logits: with `config.policy_clip_center` "learner", the learner's logits [T, B,
        NUM_ACTIONS] when the batch arrived (`LossTerms.target_logits` of its first step); None
        on that first step, where they are the learner's current ones.
      entropy_cost: the entropy bonus's weight at this step (`optimise.scheduled_entropy_cost`);
        None: `config.entropy_cost`.
    """
    steps = batch.steps
    outputs = unroll(agent, batch)
    # Step T is only there to bootstrap from: it is trained on as step 0 of the next unroll.
    bootstrap_value = outputs.baseline[-1]
    target_logits = outputs.policy_logits[:-1]
    values = outputs.baseline[:-1]
    actions = steps.action[:-1]
    rewards = clip_rewards(steps.reward[1:], config.reward_clipping)
    discounts = tf.cast(~steps.done[1:], tf.float32) * config.discounting

    vtrace_returns = vtrace.from_logits(
        behaviour_policy_logits=steps.policy_logits[:-1],
        target_policy_logits=target_logits,
        actions=actions,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        lambda_=config.vtrace_lambda,
    )
    if config.policy_clip > 0:
        # The surrogate's ratio does the importance weighting V-trace's advantages carry.
        vs_t_plus_1 = tf.concat([vtrace_returns.vs[1:], bootstrap_value[tf.newaxis]], axis=0)
        advantages = tf.stop_gradient(rewards + discounts * vs_t_plus_1 - values)
    else:
        advantages = vtrace_returns.pg_advantages
    if config.normalize_advantages:
        mean, variance = tf.nn.moments(advantages, axes=list(range(advantages.shape.rank)))
        advantages = (advantages - mean) / (tf.sqrt(variance) + 1e-8)
    clip_log_ratios = vtrace_returns.log_rhos  # log pi / mu
    if config.policy_clip > 0:
        weights = 1.0
        if config.policy_clip_center == "learner":
            if proximal_logits is None:
                proximal_logits = tf.stop_gradient(target_logits)
            log_proximal = vtrace.log_probs_from_logits_and_actions(proximal_logits, actions)
            # log pi / pi_prox: the clip bounds how far this batch moves the policy; the
            # behaviour's lag, pi_prox / mu, is corrected by a weight capped at V-trace's
            # rho-bar of 1.
            clip_log_ratios = vtrace_returns.target_action_log_probs - log_proximal
            weights = tf.minimum(
                1.0, tf.exp(log_proximal - vtrace_returns.behaviour_action_log_probs)
            )
        policy_gradient = compute_clipped_policy_loss(
            clip_log_ratios, advantages, config.policy_clip, weights
        )
    else:
        policy_gradient = compute_policy_gradient_loss(target_logits, actions, advantages)
    baseline = config.baseline_cost * compute_baseline_loss(vtrace_returns.vs - values)
    if entropy_cost is None:
        entropy_cost = config.entropy_cost
    entropy = entropy_cost * compute_entropy_loss(target_logits)
    return LossTerms(
        total=policy_gradient + baseline + entropy,
        policy_gradient=policy_gradient,
        baseline=baseline,
        entropy=entropy,
        clipped_fraction=clipped_fraction(clip_log_ratios, config.policy_clip),
        target_logits=tf.stop_gradient(target_logits),
    )
