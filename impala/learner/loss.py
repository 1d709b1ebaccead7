"""The IMPALA loss on a batch of unrolls: policy gradient + baseline + entropy terms.

Shapes follow `impala.trajectory.Batch`: a batch's steps are `[T + 1, B, ...]`, where B counts
environment trajectories. The loss terms are sums over time and batch, as in the IMPALA paper's
code, so the paper's learning rates apply unchanged.
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


class LossTerms(NamedTuple):
    total: tf.Tensor
    policy_gradient: tf.Tensor
    baseline: tf.Tensor
    entropy: tf.Tensor


def compute_loss(agent: networks.Agent, batch: Batch, config: LearnerConfig) -> LossTerms:
    """The IMPALA loss of a [T + 1, B] batch: policy gradient + baseline + entropy terms."""
    steps = batch.steps
    inputs = networks.make_input(steps.prev_action, steps.reward, steps.done, steps.observation)
    outputs, _ = agent.unroll(inputs, batch.agent_state)
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
    advantages = vtrace_returns.pg_advantages
    if config.normalize_advantages:
        mean, variance = tf.nn.moments(advantages, axes=list(range(advantages.shape.rank)))
        advantages = (advantages - mean) / (tf.sqrt(variance) + 1e-8)
    policy_gradient = compute_policy_gradient_loss(target_logits, actions, advantages)
    baseline = config.baseline_cost * compute_baseline_loss(vtrace_returns.vs - values)
    entropy = config.entropy_cost * compute_entropy_loss(target_logits)
    return LossTerms(
        total=policy_gradient + baseline + entropy,
        policy_gradient=policy_gradient,
        baseline=baseline,
        entropy=entropy,
    )
