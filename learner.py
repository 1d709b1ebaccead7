"""The learner's maths: the IMPALA loss on a batch of unrolls and one optimisation step.

Shapes follow `actor.Unroll`, batched: a batch's steps are `[T + 1, B, ...]`, where B counts
environment trajectories. The loss terms are sums over time and batch, as in the IMPALA paper's
code, so the paper's learning rates apply unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import sonnet as snt
import tensorflow as tf

import networks
import vtrace
from actor import Steps, Unroll

REWARD_CLIPPING_CHOICES = ("abs_one", "soft_asymmetric", "none")
OPTIMIZER_CHOICES = ("rmsprop", "adam")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of the IMPALA loss and its optimiser; defaults are the paper's Atari ones."""

    batch_size: int = 32
    unroll_length: int = 20
    discounting: float = 0.99
    vtrace_lambda: float = 1.0  # V-trace's trace decay (the paper's remark 2)
    normalize_advantages: bool = False  # policy-gradient advantages to mean 0, std 1 per batch
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    reward_clipping: str = "abs_one"
    gradients_clipping: float = 40.0  # global norm; negative (or 0) turns clipping off
    learning_rate: float = 0.0006
    optimizer: str = "rmsprop"
    decay: float = 0.99
    momentum: float = 0.0
    epsilon: float = 0.01
    total_environment_frames: int = 200_000_000  # the learning rate anneals to 0 over this
    batch_reuse: int = 1  # optimisation steps on each batch (V-trace corrects the later ones)

    def __post_init__(self):
        _require(self.batch_size >= 1, "batch_size", self.batch_size, "must be at least 1")
        _require(self.unroll_length >= 1, "unroll_length", self.unroll_length, "must be at least 1")
        _require(
            0.0 <= self.discounting <= 1.0, "discounting", self.discounting, "must be in [0, 1]"
        )
        _require(
            0.0 <= self.vtrace_lambda <= 1.0,
            "vtrace_lambda",
            self.vtrace_lambda,
            "must be in [0, 1]",
        )
        _require(self.baseline_cost >= 0, "baseline_cost", self.baseline_cost, "must be >= 0")
        _require(self.entropy_cost >= 0, "entropy_cost", self.entropy_cost, "must be >= 0")
        _require(
            self.reward_clipping in REWARD_CLIPPING_CHOICES,
            "reward_clipping",
            self.reward_clipping,
            f"must be one of {', '.join(REWARD_CLIPPING_CHOICES)}",
        )
        _require(self.batch_reuse >= 1, "batch_reuse", self.batch_reuse, "must be at least 1")
        _require(self.learning_rate > 0, "learning_rate", self.learning_rate, "must be > 0")
        _require(
            self.optimizer in OPTIMIZER_CHOICES,
            "optimizer",
            self.optimizer,
            f"must be one of {', '.join(OPTIMIZER_CHOICES)}",
        )
        _require(0.0 <= self.decay < 1.0, "decay", self.decay, "must be in [0, 1)")
        _require(0.0 <= self.momentum < 1.0, "momentum", self.momentum, "must be in [0, 1)")
        _require(
            self.optimizer == "rmsprop" or self.momentum == 0.0,
            "momentum",
            self.momentum,
            "is RMSProp's; --optimizer=adam has its own (beta1 0.9): leave --momentum at 0",
        )
        _require(self.epsilon > 0, "epsilon", self.epsilon, "must be > 0")
        _require(
            self.total_environment_frames >= 1,
            "total_environment_frames",
            self.total_environment_frames,
            "must be at least 1",
        )


def _require(ok: bool, flag: str, value: Any, what: str) -> None:
    if not ok:
        raise ValueError(f"--{flag}={value}: {what}")


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
        agent_state=tf.nest.map_structure(
            lambda *states: np.concatenate(states, axis=0), *(u.agent_state for u in unrolls)
        ),
        steps=tf.nest.map_structure(
            lambda *fields: np.concatenate(fields, axis=1), *(u.steps for u in unrolls)
        ),
    )


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
    inputs = networks.AgentInput(
        prev_action=steps.prev_action,
        reward=steps.reward,
        done=steps.done,
        observation=steps.observation,
    )
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


def annealed_learning_rate(config: LearnerConfig, frames: int | tf.Tensor) -> tf.Tensor:
    """The learning rate decays linearly from `learning_rate` to 0 at the frame budget."""
    progress = tf.cast(frames, tf.float64) / float(config.total_environment_frames)
    remaining = tf.clip_by_value(1.0 - progress, 0.0, 1.0)
    return tf.cast(config.learning_rate * remaining, tf.float32)


def make_optimizer(config: LearnerConfig, learning_rate: tf.Variable) -> snt.Optimizer:
    """The optimiser `config.optimizer` names, reading its step size from `learning_rate`."""
    if config.optimizer == "adam":
        # Adam's epsilon sits outside the square root; `decay` is its second-moment decay.
        return snt.optimizers.Adam(
            learning_rate=learning_rate, beta2=config.decay, epsilon=config.epsilon
        )
    # Sonnet's RMSProp has TensorFlow 1's semantics (epsilon inside the square root), which
    # is what the IMPALA paper's hyperparameters were tuned with.
    return snt.optimizers.RMSProp(
        learning_rate=learning_rate,
        decay=config.decay,
        momentum=config.momentum,
        epsilon=config.epsilon,
    )


# Wraps the gradient tape; the distributed learner passes Horovod's DistributedGradientTape.
TapeWrapper = Callable[[tf.GradientTape], Any]


class Learner:
    """Owns the optimiser and performs IMPALA optimisation steps on one agent."""

    def __init__(
        self,
        agent: networks.Agent,
        config: LearnerConfig,
        wrap_tape: TapeWrapper | None = None,
    ):
        """Creates the optimiser.

        Args:
          agent: the network to train; its variables must already exist.
          config: loss and optimiser hyperparameters.
          wrap_tape: applied to the gradient tape before gradients are taken, e.g. to average
            gradients across learners.
        """
        self._agent = agent
        self._config = config
        self._wrap_tape = wrap_tape or (lambda tape: tape)
        self.learning_rate = tf.Variable(config.learning_rate, trainable=False, dtype=tf.float32)
        self.optimizer = make_optimizer(config, self.learning_rate)
        self._train_step = tf.function(self._step)

    def create_optimizer_slots(self) -> None:
        """Creates the optimiser's slot variables without changing any weight.

        Needed before the optimiser state can be broadcast or restored from a checkpoint.
        """
        zeros = [tf.zeros_like(v) for v in self._agent.trainable_variables]
        saved_lr = self.learning_rate.numpy()
        self.learning_rate.assign(0.0)
        self.optimizer.apply(zeros, self._agent.trainable_variables)
        self.learning_rate.assign(saved_lr)

    def learn(self, batch: Batch, frames: int) -> dict[str, float]:
        """`config.batch_reuse` optimisation steps on `batch`, at `frames` frames into training.

        Every step after the first learns from actions its own earlier updates did not choose:
        V-trace's importance weights (pi / mu, clipped) correct for that.

        Returns:
          Scalar statistics of the last step: the loss terms, gradient norm and learning rate.
        """
        return self._optimise(batch, frames, self._config.batch_reuse)

    def step(self, batch: Batch, frames: int) -> dict[str, float]:
        """One optimisation step on `batch`, at `frames` emulator frames into training.

        Returns:
          Scalar statistics of the step: the loss terms, gradient norm and learning rate.
        """
        return self._optimise(batch, frames, 1)

    def _optimise(self, batch: Batch, frames: int, num_steps: int) -> dict[str, float]:
        self.learning_rate.assign(annealed_learning_rate(self._config, frames))
        batch = tf.nest.map_structure(tf.convert_to_tensor, batch)  # once, however many steps
        for _ in range(num_steps):
            stats = self._train_step(batch)
        return {name: float(value) for name, value in stats.items()}

    def _step(self, batch: Batch) -> dict[str, tf.Tensor]:
        variables = self._agent.trainable_variables
        with tf.GradientTape() as tape:
            loss = compute_loss(self._agent, batch, self._config)
        gradients = self._wrap_tape(tape).gradient(loss.total, variables)
        gradient_norm = tf.linalg.global_norm(gradients)
        if self._config.gradients_clipping > 0:
            gradients, _ = tf.clip_by_global_norm(
                gradients, self._config.gradients_clipping, use_norm=gradient_norm
            )
        self.optimizer.apply(gradients, variables)
        return {
            "loss/total": loss.total,
            "loss/policy_gradient": loss.policy_gradient,
            "loss/baseline": loss.baseline,
            "loss/entropy": loss.entropy,
            "gradient_norm": gradient_norm,
            "learning_rate": tf.identity(self.learning_rate),
        }
