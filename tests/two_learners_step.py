"""Two learners' train steps under Horovod, one learner's batch poisoned: run by mpirun.

    mpirun -np 2 python -m tests.two_learners_step OUT_DIR

Each rank builds the learner's network and `Trainer` as `impala/learner/start.py` does (Horovod's
tape, `allreduce.every_learner`, rank 0's weights and optimizer state broadcast), then takes
one `learn` call on a batch of its own in each scenario, and writes what it saw to
OUT_DIR/rank_<rank>.json: {scenario: {skipped_steps, unchanged, finite, sha256}}.

  issue:      rank 1's behaviour logits are +-1e30 (the issue's batch): its gradients are NaN
  loss_only:  rank 1's loss alone is not finite (its gradients are): only the vote sees it
  sound:      both batches are sound
  fp16:       both sound, the gradients sent with --gradient_compression=fp16
  minibatches: both sound, two shuffled minibatches a pass (each rank shuffles its own way)
  asynchronous: both sound, asynchronous gradients (each step applies the average of the step
               before's), the last step's applied by `flush`
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

import networks
from impala import trajectory
from impala.configs import LearnerConfig
from impala.learner import allreduce, optimise, saving
from impala.trajectory import Steps

# The flags' defaults (PPO's surrogate clipped around the behaviour policy, Adam), two steps a
# batch.
CONFIG = LearnerConfig(batch_reuse=2)
NUM_ACTIONS, OBSERVATION_SIZE = 3, 4


def _batch(seed: int, poisoned: bool) -> trajectory.Batch:
    rng = np.random.default_rng(seed)
    shape = (21, 8)
    action = rng.integers(0, NUM_ACTIONS, shape).astype(np.int32)
    logits = rng.normal(size=(*shape, NUM_ACTIONS)).astype(np.float32)
    if poisoned:
        logits = np.full(logits.shape, -1e30, np.float32)
        np.put_along_axis(logits, ((action + 1) % NUM_ACTIONS)[..., None], 1e30, axis=-1)
    return trajectory.Batch(
        agent_state=(),
        steps=Steps(
            prev_action=rng.integers(0, NUM_ACTIONS, shape).astype(np.int32),
            reward=rng.normal(size=shape).astype(np.float32),
            done=rng.uniform(size=shape) < 0.1,
            observation=rng.normal(size=(*shape, OBSERVATION_SIZE)).astype(np.float32),
            action=action,
            policy_logits=logits,
        ),
    )


def _loss_not_finite(*args, **kwargs):
    """The loss with a constant inf added: not finite, while its gradients are."""
    terms = _compute_loss(*args, **kwargs)
    return terms._replace(total=terms.total + tf.constant(np.inf))


_compute_loss = optimise.compute_loss


def _scenario(rank: int, name: str) -> dict:
    config = CONFIG
    if name == "minibatches":
        config = LearnerConfig(batch_reuse=2, num_batches_per_epoch=2)
    tf.random.set_seed(rank)  # different initial weights: the broadcast must make them equal
    agent = networks.make_agent("MLPAgent", NUM_ACTIONS)
    networks.build_variables(agent, (OBSERVATION_SIZE,), np.float32)
    optimise.compute_loss = _loss_not_finite if name == "loss_only" and rank == 1 else _compute_loss
    delayed = name == "asynchronous"
    trainer = optimise.Trainer(
        agent,
        config,
        wrap_tape=None if delayed else allreduce.tape_wrapper("fp16" if name == "fp16" else "none"),
        every_learner=allreduce.every_learner,
        seed=rank,
        delayed_reduce=allreduce.gradient_reducer() if delayed else None,
    )
    trainer.create_optimizer_slots()
    allreduce.broadcast_from_chief(list(agent.variables) + list(trainer.optimizer.variables))
    state = [*agent.variables, *trainer.optimizer.variables]
    before = [v.numpy().copy() for v in state]
    stats = trainer.learn(_batch(seed=10 * rank, poisoned=name == "issue" and rank == 1), 0)
    stats["skipped_steps"] += trainer.flush()
    after = [v.numpy() for v in state]
    return {
        "skipped_steps": stats["skipped_steps"],
        "unchanged": all(np.array_equal(a, b) for a, b in zip(after, before, strict=True)),
        "finite": all(bool(np.isfinite(a).all()) for a in after),
        "sha256": saving.weights_checksum(agent.variables),
    }


def main() -> None:
    out_dir = sys.argv[1]
    topology = allreduce.init(num_learners=2)
    names = ("issue", "loss_only", "sound", "fp16", "minibatches", "asynchronous")
    seen = {name: _scenario(topology.rank, name) for name in names}
    with open(os.path.join(out_dir, f"rank_{topology.rank}.json"), "w") as f:
        json.dump(seen, f)
    allreduce.wait_for_learners("written")


if __name__ == "__main__":
    main()
