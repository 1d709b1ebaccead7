"""What a learner does around each optimisation step: wait for its batch, agree with the other
learners on whether to stop, and gather the games every learner's actors finished."""

from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

import networks
from impala import transport
from impala.learner import allreduce
from impala.learner.state import Counters, Learning
from impala.trajectory import (
    MAX_ABS_CORE_STATE,
    MAX_ABS_EPISODE_RETURN,
    MAX_ABS_POLICY_LOGIT,
    Batch,
)

# How often a learner waiting for its batch looks whether it was asked to stop.
STOP_CHECK_SECS = 0.05


def wait_for_batch(
    learning: Learning, stop: threading.Event
) -> transport.QueuedTrajectories | None:
    """Dequeues a batch, sleeping until its trajectories are in and looking every
    STOP_CHECK_SECS whether it was asked to stop (then: None). With replays, dequeues the fresh
    trajectories the batch needs and mixes in the replayed ones.

    A learner whose actors are gone says so once (not only the chief: a learner without data
    stalls every learner), keeps waiting for them, and says when data flows again.
    """
    service, topology, mixer = learning.service, learning.topology, learning.mixer
    batch_size = mixer.fresh_needed() if mixer else learning.config.learner.batch_size
    started = time.monotonic()
    warned = False
    received = service.trajectories_received
    while not service.wait_for_trajectories(batch_size, timeout_secs=STOP_CHECK_SECS):
        if stop.is_set() or service.finished:  # a closed service's wait ends at once
            return None
        if not warned and time.monotonic() >= started + learning.config.stall_warning_secs:
            warned = True
            logging.warning(
                "learner %d has waited %.0f s for a batch (%d/%d trajectories queued): are its "
                "actors (tasks %d mod %d) running?%s It keeps waiting for them",
                topology.rank,
                time.monotonic() - started,
                service.queue_size,
                batch_size,
                topology.rank,
                topology.size,
                " In synchronous collection they give --num_envs_per_actor trajectories each "
                "with one version, then wait for the next: a batch that needs more never fills."
                if learning.config.synchronous_collection
                else "",
            )
    if warned:
        logging.warning(
            "learner %d: its actors are back (%d trajectories after %.0f s)",
            topology.rank,
            service.trajectories_received - received,
            time.monotonic() - started,
        )
    queued = service.dequeue(batch_size)
    return mixer.mix(queued) if mixer else queued


def fresh_count(learning: Learning, queued: transport.QueuedTrajectories) -> int:
    """How many of a batch's trajectories came from actors for it (a mixed batch's first ones)
    rather than from a replay."""
    replayed = learning.mixer.replayed_last if learning.mixer else 0
    return len(queued.actor_task) - replayed


def to_batch(queued: transport.QueuedTrajectories, agent: networks.Agent) -> Batch:
    """Restores the agent's core-state structure, which the queue holds flattened."""
    agent_state = tf.nest.pack_sequence_as(agent.initial_state(1), queued.agent_state)
    return Batch(agent_state=agent_state, steps=queued.steps)


class LearnerStates(NamedTuple):
    """Every learner's state before a step, [L] each (index = rank)."""

    stop: np.ndarray  # asked to stop (a signal), so every learner stops before this step
    queue_size: np.ndarray
    trajectories_received: np.ndarray
    policy_lag: np.ndarray  # weight versions between acting and learning, batch mean
    actors: np.ndarray  # actor tasks that have connected since the learner started
    reconnections: np.ndarray  # connections beyond each task's first: restarted actors
    fresh: np.ndarray  # trajectories of the batch that came from actors, not from a replay


def policy_lag(version: int, versions: np.ndarray) -> float:
    """The mean of how many weight versions each trajectory's is behind `version`, the
    learner's; a version ahead of it (acted before the learner restarted from an earlier
    checkpoint, or a number an actor made up) counts as 0, not as a negative lag that would
    offset the others'."""
    behind = version - np.asarray(versions, np.float64)
    return float(np.mean(np.maximum(behind, 0.0))) if behind.size else np.nan


def learner_states(learning: Learning, queued, stop: bool) -> LearnerStates:
    """Gathers every learner's state; `queued` is this learner's batch, None if it was stopped,
    and `stop` whether it was asked to stop.

    Horovod: this is also the vote on stopping. A learner asked to stop cannot leave alone:
    the others would wait for it in the next all-reduce. So every learner says before each step
    whether it was asked to, and all stop after the same step, with identical weights.
    """
    service = learning.service
    stop = stop or queued is None
    lag, fresh = np.nan, 0
    if queued is not None:
        # The lag is the fresh trajectories', the actors'.
        fresh = fresh_count(learning, queued)
        lag = policy_lag(learning.counters.version, np.asarray(queued.weight_version)[:fresh])
    connections = service.connections
    own = [
        [
            float(stop),
            service.queue_size,
            service.trajectories_received,
            lag,
            len(connections),
            sum(connections.values()) - len(connections),
            fresh,
        ]
    ]
    states = allreduce.gather_from_learners(np.asarray(own, np.float64), "learner_states")
    return LearnerStates(*states.T)


def gather_episodes(service: transport.LearnerService, counters: Counters) -> np.ndarray:
    """Every learner's finished games since the last step, [K, 3]: return, length in frames,
    and the frames it began with (-1 where the game has no such start).

    A game whose return is not finite or beyond `MAX_ABS_EPISODE_RETURN` (which the transport
    refuses too) is left out and counted: one absurd score would swamp every mean over games.
    """
    games = service.pop_episodes()
    # Horovod: gathered every step, by every learner, so that rank 0 reports them all.
    fields = [games.episode_return, games.episode_frames, games.start_frames]
    episodes = allreduce.gather_from_learners(
        np.stack(fields, axis=1).astype(np.float64), "episodes"
    )
    sound = np.isfinite(episodes).all(axis=1) & (np.abs(episodes[:, 0]) <= MAX_ABS_EPISODE_RETURN)
    counters.episodes_ignored += int(np.sum(~sound))
    return episodes[sound]


def outputs_out_of_bounds(agent: networks.Agent, batch: Batch) -> str | None:
    """What, of the agent's outputs on `batch` with its weights now, its actors' chunks could
    be refused for (`refusals.check_trajectories`): logits or a recurrent state that are not
    finite or are beyond half their bounds (the actors meet other states than the batch's);
    None if nothing."""
    inputs = networks.make_input(
        batch.steps.prev_action, batch.steps.reward, batch.steps.done, batch.steps.observation
    )
    outputs, final_state = agent.unroll(inputs, batch.agent_state)
    bounded = [("policy logits", outputs.policy_logits, MAX_ABS_POLICY_LOGIT)]
    bounded += [("recurrent state", s, MAX_ABS_CORE_STATE) for s in tf.nest.flatten(final_state)]
    for name, values, bound in bounded:
        values = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(values)):
            return f"its {name} on the last batch are not finite"
        if values.size and np.abs(values).max() > bound / 2:
            largest = np.abs(values).max()
            return (
                f"its {name} on the last batch reach {largest:.3g}, more than half of the "
                f"{bound:g} its actors' games are refused beyond"
            )
    return None
