"""The learner's optimisation step: the optimiser, its learning-rate schedule, gradient clipping,
and the skip of a step whose loss or gradients are not finite."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import sonnet as snt
import tensorflow as tf

import networks
from impala.configs import LearnerConfig
from impala.configs.declare import check_setting
from impala.learner.loss import compute_loss, unroll
from impala.trajectory import Batch


def _linear(start: float, end: float, frames: int | tf.Tensor, horizon: int) -> tf.Tensor:
    """`start` moving linearly to `end` over the first `horizon` frames, then `end`."""
    done = tf.clip_by_value(tf.cast(frames, tf.float64) / float(horizon), 0.0, 1.0)
    return tf.cast(start * (1.0 - done) + end * done, tf.float32)


def annealed_learning_rate(
    config: LearnerConfig, frames: int | tf.Tensor, learning_rate: float | None = None
) -> tf.Tensor:
    """The learning rate: `learning_rate` (default: the config's) falling linearly to 0 at
    `learning_rate_anneal_frames` frames, or at the frame budget if that is later (or the
    anneal's frames are 0), over the last `learning_rate_cooldown_frames` of them only if that is
    set (else over the share `learning_rate_cooldown_fraction` of them if that is), holding at
    `learning_rate` before; else over all of them. A run never trains on at a rate of 0."""
    base = config.learning_rate if learning_rate is None else learning_rate
    horizon, cooldown = config.learning_rate_horizon, config.learning_rate_cooldown
    if cooldown == 0 or cooldown >= horizon:
        return _linear(base, 0.0, frames, horizon)
    into_cooldown = tf.maximum(tf.cast(frames, tf.float64) - float(horizon - cooldown), 0.0)
    return _linear(base, 0.0, into_cooldown, cooldown)


def scheduled_entropy_cost(
    config: LearnerConfig, frames: int | tf.Tensor, entropy_cost: float | None = None
) -> tf.Tensor:
    """The entropy bonus's weight: `entropy_cost` (default: the config's) moving linearly to
    `entropy_cost_final` over `entropy_cost_anneal_frames` frames, then `entropy_cost_final`;
    `entropy_cost` throughout if that is 0."""
    base = config.entropy_cost if entropy_cost is None else entropy_cost
    if config.entropy_cost_anneal_frames == 0:
        return tf.constant(base, tf.float32)
    return _linear(base, config.entropy_cost_final, frames, config.entropy_cost_anneal_frames)


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


def nonnegative_slots(optimizer: snt.Optimizer) -> list[tf.Variable]:
    """The optimiser's variables that a finite step needs >= 0: Adam's second moments and step
    count, RMSProp's mean squares (a step takes their square root). A state copied from another
    process (population-based training) is checked against it."""
    if isinstance(optimizer, snt.optimizers.Adam):
        return [*optimizer.v, optimizer.step]
    if isinstance(optimizer, snt.optimizers.RMSProp):
        return list(optimizer.ms)
    return []


# Wraps the gradient tape; the distributed learner passes Horovod's DistributedGradientTape.
TapeWrapper = Callable[[tf.GradientTape], Any]
# Reduces a bool scalar of this learner's to whether it holds on every learner.
FlagReducer = Callable[[tf.Tensor], tf.Tensor]
# Averages a list of gradients over the learners (asynchronous gradients: Horovod's grouped
# all-reduce of the step before's).
GradientReducer = Callable[[list[tf.Tensor]], list[tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    """The settings a learner may change while a run goes (population-based training): the
    base values its learning-rate and entropy schedules start from."""

    learning_rate: float
    entropy_cost: float


class Trainer:
    """Owns the optimiser and performs IMPALA optimisation steps on one agent.

    The schedules start from `hyperparameters`, the config's until `set_hyperparameters`
    changes them; the step reads their values from variables, so that a change takes effect
    at the next step without tracing it again.

    A batch is trained on in `config.batch_reuse` passes (epochs); each pass splits its
    trajectories into `config.num_batches_per_epoch` minibatches, in a new random order every
    pass, and takes one optimisation step on each. One minibatch a pass is the whole batch, in
    its order: IMPALA's and this project's steps before minibatches.

    A step whose loss or gradients are not finite is skipped: neither the weights nor the
    optimiser's state change, and the step is counted (`skipped_steps`). Applied, it would make
    every weight NaN, since clipping by a non-finite global norm makes every gradient NaN. Only
    a batch beyond what float32 holds does it (see the bounds in `impala/trajectory.py`).

    Asynchronous gradients (`delayed_reduce`, --grad_workers_communication=asynchronous): a
    step computes this learner's own gradients and, at the same time, averages the gradients
    every learner computed at the step before (`delayed_reduce`) and applies that average; its
    own are kept for the next step's all-reduce. So no learner waits for the all-reduce of the
    gradients it has just computed: the network's time to carry them overlaps the next step's
    computation. Every learner applies the same average, so their weights stay identical; each
    step applies gradients one step old (computed at the weights before the last update).
    `flush` applies the gradients kept, at the end before the last checkpoint; a periodic
    checkpoint holds the weights without them, so a run resumed from one loses one step's.
    """

    def __init__(
        self,
        agent: networks.Agent,
        config: LearnerConfig,
        wrap_tape: TapeWrapper | None = None,
        every_learner: FlagReducer | None = None,
        seed: int = 0,
        delayed_reduce: GradientReducer | None = None,
    ):
        """Creates the optimiser.

        Args:
          agent: the network to train; its variables must already exist.
          config: loss and optimiser hyperparameters.
          wrap_tape: applied to the gradient tape before gradients are taken, e.g. to average
            gradients across learners.
          every_learner: whether a bool scalar of this learner's holds on every learner, so
            that all skip a step together when any one's loss is not finite; None: this
            learner alone.
          seed: seeds the order in which each pass takes a batch's trajectories.
          delayed_reduce: asynchronous gradients: averages gradients over the learners, each
            step's at the next step (then `wrap_tape` must leave the tape's gradients this
            learner's own). None: each step applies the gradients it computes.
        """
        self._agent = agent
        self._config = config
        self._wrap_tape = wrap_tape or (lambda tape: tape)
        self._every_learner = every_learner or (lambda flag: flag)
        self.hyperparameters = Hyperparameters(config.learning_rate, config.entropy_cost)
        # The schedules' values at the step under way, which the step reads.
        self.learning_rate = tf.Variable(config.learning_rate, trainable=False, dtype=tf.float32)
        self.optimizer = make_optimizer(config, self.learning_rate)
        self.entropy_cost = tf.Variable(config.entropy_cost, trainable=False, dtype=tf.float32)
        # Without autograph: the step's control flow is Python on the config, and converting
        # Horovod's gradient tape was half of a two-learner run's wait for its first step.
        self._delayed_reduce = delayed_reduce
        if delayed_reduce is not None:
            # The gradients computed at the step before, this learner's own, waiting for the
            # all-reduce of the next step; and what applying them needs to know.
            self._pending = [
                tf.Variable(tf.zeros_like(v), trainable=False) for v in agent.trainable_variables
            ]
            self._pending_held = tf.Variable(False, trainable=False)
            self._pending_finite = tf.Variable(True, trainable=False)
            self._pending_share = tf.Variable(1.0, trainable=False)
            self._flush = tf.function(self._apply_pending, autograph=False)
            # Traced now, not at the end: a stop must not wait seconds for a trace.
            self._flush.get_concrete_function()
        self._train_step = tf.function(self._step, autograph=False)
        self._target_logits = tf.function(self._policy_logits, autograph=False)
        self._order = np.random.default_rng(seed)

    def create_optimizer_slots(self) -> None:
        """Creates the optimiser's slot variables without changing any weight.

        Needed before the optimiser state can be broadcast or restored from a checkpoint.
        """
        zeros = [tf.zeros_like(v) for v in self._agent.trainable_variables]
        saved_lr = self.learning_rate.numpy()
        self.learning_rate.assign(0.0)
        self.optimizer.apply(zeros, self._agent.trainable_variables)
        self.learning_rate.assign(saved_lr)

    def set_hyperparameters(self, **changes: float) -> None:
        """Changes the base values the schedules start from (`Hyperparameters`' fields), from
        the next step on, without rebuilding the config or tracing the step again.

        Raises:
          ValueError: the one-line error `LearnerConfig` gives for a bad value, naming its flag.
          TypeError: a name that is not one of `Hyperparameters`' fields.
        """
        changed = dataclasses.replace(self.hyperparameters, **changes)
        for name, value in changes.items():
            check_setting(LearnerConfig, name, value)
        self.hyperparameters = changed

    def learn(self, batch: Batch, frames: int) -> dict[str, float]:
        """`config.batch_reuse` passes over `batch` of `config.num_batches_per_epoch` steps
        each, at `frames` frames into training.

        Every step after the first learns from actions its own earlier updates did not choose:
        V-trace's importance weights (pi / mu, clipped) correct for that.

        Returns:
          Scalar statistics of the last step: the loss terms, gradient norm and learning rate;
          and `skipped_steps`, how many of the steps were skipped (loss or gradients not
          finite).
        """
        config = self._config
        return self._optimise(batch, frames, config.batch_reuse, config.num_batches_per_epoch)

    def step(self, batch: Batch, frames: int) -> dict[str, float]:
        """One optimisation step on `batch`, at `frames` emulator frames into training.

        Returns:
          Scalar statistics of the step: the loss terms, gradient norm and learning rate;
          `skipped_steps` is 1 if it was skipped (loss or gradients not finite), else 0.
        """
        return self._optimise(batch, frames, 1, 1)

    def _optimise(
        self, batch: Batch, frames: int, epochs: int, minibatches: int
    ) -> dict[str, float]:
        base = self.hyperparameters
        self.learning_rate.assign(annealed_learning_rate(self._config, frames, base.learning_rate))
        self.entropy_cost.assign(scheduled_entropy_cost(self._config, frames, base.entropy_cost))
        batch = tf.nest.map_structure(tf.convert_to_tensor, batch)  # once, however many steps
        learner_centred = self._config.policy_clip_center == "learner"
        # The learner's policy as the batch arrived, before any of its steps.
        proximal_logits = None
        if learner_centred and minibatches > 1:
            proximal_logits = self._target_logits(batch)
        size = int(batch.steps.reward.shape[1])
        skipped = 0
        for _ in range(epochs):
            order = self._order.permutation(size) if minibatches > 1 else None
            for part in range(minibatches):
                indices = None
                if order is not None:
                    share = order[part * size // minibatches : (part + 1) * size // minibatches]
                    indices = tf.constant(share, tf.int32)
                stats, logits = self._train_step(batch, indices, proximal_logits)
                skipped += stats.pop("skipped")
                if learner_centred and proximal_logits is None:
                    # The whole batch's first step: its logits are the policy's before it.
                    proximal_logits = logits
        summary = {name: float(value) for name, value in stats.items()}
        summary["skipped_steps"] = int(skipped)
        return summary

    @property
    def delays_gradients(self) -> bool:
        """Whether a step applies the gradients of the step before (asynchronous gradients)."""
        return self._delayed_reduce is not None

    def flush(self) -> int:
        """Asynchronous gradients: applies the gradients kept from the last step (averaged over
        the learners), so that the weights hold every step taken: at the end, before the last
        checkpoint (periodic checkpoints do without: a resume from one loses that one step's
        gradients). Every learner must call it at the same point. Returns 1 if they were
        skipped (not finite), else 0."""
        if self._delayed_reduce is None:
            return 0
        return int(self._flush())

    def _apply_pending(self) -> tf.Tensor:
        """Averages the kept gradients over the learners and applies them; then holds none.
        Returns whether a held step was skipped."""
        _, skipped = self._apply_reduced(*self._reduce_kept())
        self._pending_held.assign(False)
        return skipped

    def _reduce_kept(self) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
        """The kept gradients averaged over the learners; whether any are held; whether they
        were finite on every learner; the share of its batch their step took."""
        reduced = self._delayed_reduce([tf.identity(kept) for kept in self._pending])
        finite_everywhere = self._every_learner(self._pending_finite.read_value())
        return (
            reduced,
            self._pending_held.read_value(),
            finite_everywhere,
            self._pending_share.read_value(),
        )

    def _apply_reduced(
        self, reduced: list[tf.Tensor], held: tf.Tensor, finite: tf.Tensor, share: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Applies `reduced` if held and finite (`_reduce_kept`); returns its global norm and
        whether a held step was skipped."""
        norm = tf.linalg.global_norm(reduced)
        apply = held & finite & tf.math.is_finite(norm)
        variables = self._agent.trainable_variables
        tf.cond(apply, lambda: self._apply(reduced, variables, norm, share), lambda: None)
        return norm, held & ~apply

    def _policy_logits(self, batch: Batch) -> tf.Tensor:
        """The learner's policy logits [T, B, NUM_ACTIONS] on `batch`'s steps, no gradient."""
        return tf.stop_gradient(unroll(self._agent, batch).policy_logits[:-1])

    def _step(
        self, batch: Batch, indices: tf.Tensor | None, proximal_logits: tf.Tensor | None
    ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """One optimisation step on the trajectories `indices` of `batch` (None: all)."""
        share = 1.0
        if indices is not None:
            share = indices.shape[0] / batch.steps.reward.shape[1]
            batch = trajectories(batch, indices)
            if proximal_logits is not None:
                proximal_logits = tf.gather(proximal_logits, indices, axis=1)
        if self._delayed_reduce is not None:
            return self._delayed_step(batch, share, proximal_logits)
        variables = self._agent.trainable_variables
        with tf.GradientTape() as tape:
            loss = compute_loss(
                self._agent, batch, self._config, proximal_logits, self.entropy_cost
            )
        gradients = self._wrap_tape(tape).gradient(loss.total, variables)
        gradient_norm = tf.linalg.global_norm(gradients)
        # The loss is this learner's own, so whether it is finite is reduced over the learners.
        # The gradients are already averaged over them: the same on every learner, with a
        # non-finite value from any learner's batch in every learner's norm. The norm is finite
        # only if every gradient and every square the optimiser's state takes of one is.
        apply = self._every_learner(tf.math.is_finite(loss.total)) & tf.math.is_finite(
            gradient_norm
        )
        tf.cond(
            apply, lambda: self._apply(gradients, variables, gradient_norm, share), lambda: None
        )
        return self._statistics(loss, gradient_norm, ~apply), loss.target_logits

    def _delayed_step(
        self, batch: Batch, share: float, proximal_logits: tf.Tensor | None
    ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """Asynchronous gradients: applies the average of the gradients every learner kept at
        the step before, and keeps this step's own for the next.

        The all-reduce, issued first, reads only the kept gradients, so nothing it does waits
        for this step's forward and backward passes: Horovod carries them in its own thread
        while those compute, at the weights before this step's update.
        """
        kept = self._reduce_kept()
        with tf.GradientTape() as tape:
            loss = compute_loss(
                self._agent, batch, self._config, proximal_logits, self.entropy_cost
            )
        gradients = tape.gradient(loss.total, self._agent.trainable_variables)  # its own
        norm, skipped = self._apply_reduced(*kept)
        for variable, gradient in zip(self._pending, gradients, strict=True):
            variable.assign(gradient)
        own_norm = tf.linalg.global_norm(gradients)
        self._pending_finite.assign(tf.math.is_finite(loss.total) & tf.math.is_finite(own_norm))
        self._pending_share.assign(share)
        self._pending_held.assign(True)
        # The norm of the gradients applied: the step before's average.
        return self._statistics(loss, norm, skipped), loss.target_logits

    def _statistics(self, loss, gradient_norm: tf.Tensor, skipped: tf.Tensor) -> dict:
        """A step's scalar statistics (`step`'s)."""
        return {
            "loss/total": loss.total,
            "loss/policy_gradient": loss.policy_gradient,
            "loss/baseline": loss.baseline,
            "loss/entropy": loss.entropy,
            "clipped_fraction": loss.clipped_fraction,
            "gradient_norm": gradient_norm,
            "learning_rate": tf.identity(self.learning_rate),
            "entropy_cost": tf.identity(self.entropy_cost),
            "skipped": tf.cast(skipped, tf.int32),
        }

    def _apply(self, gradients, variables, gradient_norm, share: float) -> None:
        """Clips `gradients` by their global norm (if the config says so) at the `share` of the
        batch their loss summed over, and applies them."""
        if self._config.gradients_clipping > 0:
            gradients, _ = tf.clip_by_global_norm(
                gradients, self._config.gradients_clipping * share, use_norm=gradient_norm
            )
        self.optimizer.apply(gradients, variables)


def trajectories(batch: Batch, indices: tf.Tensor) -> Batch:
    """The trajectories `indices` [K] of a [T + 1, B] batch: a [T + 1, K] batch."""
    return Batch(
        agent_state=tf.nest.map_structure(
            lambda state: tf.gather(state, indices, axis=0), batch.agent_state
        ),
        steps=tf.nest.map_structure(lambda x: tf.gather(x, indices, axis=1), batch.steps),
    )
