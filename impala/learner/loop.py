"""The learner role: serve actors, train on their trajectories, stay in step with other learners.

Each learner owns a queue fed by its actors (actor task i belongs to learner i mod L). Every step it
takes one batch from its own queue, computes the IMPALA loss, averages gradients with the other
learners through Horovod and applies them, then publishes the new weights to its actors. The frame
budget is global: all learners count the frames of all learners, so they stop at the same step.

`run` is the process: `start.start` (agent, trainer, run files, service), `_train` (the steps),
`_finish` (the last checkpoint, telling the actors, the summary). The helpers around each step
are in `steps.py`, what the learner says in `reports.py`, its state in `state.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from impala.configs import LearnerJobConfig
from impala.learner import allreduce, reports, saving, steps
from impala.learner.start import start
from impala.learner.state import Learning
from impala.progress import Progress, thread_core_waits

__all__ = ["LearnerJobConfig", "request_stop", "run"]

# Set by a signal handler (Ctrl-C, SIGTERM, SIGUSR1): the learners stop at the next step
# boundary, all at the same one, so the checkpoint holds weights and counters of one step.
_stop_requested = threading.Event()
# Set once the learner waits for its first batch: a stop asked before then (while TensorFlow
# loads or the checkpoint is read: nothing trained, nothing to save) ends the process at once.
training = threading.Event()


def request_stop() -> None:
    """Asks a running learner to stop after its current step, save and exit."""
    _stop_requested.set()


def run(config: LearnerJobConfig, report: Callable[[str], None] = logging.info) -> dict:
    """Trains until the global frame budget is spent. Returns this learner's summary."""
    learning = start(config, report)
    try:
        progress = _train(learning)
    finally:
        if learning.summaries:
            learning.summaries.close()
    return _finish(learning, progress)


def _train(learning: Learning) -> Progress:
    """Takes steps until the frame budget is spent or the learners are asked to stop."""
    config, counters = learning.config, learning.counters
    progress = Progress(config.learner.total_environment_frames, start_frames=learning.start_frames)
    next_report = time.monotonic()  # the first step is reported at once, then every few seconds
    training.set()
    while not progress.done:
        started = time.monotonic()
        queued = steps.wait_for_batch(learning, _stop_requested)
        waited = time.monotonic() - started
        learners = steps.learner_states(learning, queued, stop=_stop_requested.is_set())
        if np.any(learners.stop):
            break
        train_started = time.monotonic()
        batch = steps.to_batch(queued, learning.agent)
        stats = learning.trainer.learn(batch, progress.frames)
        trained = time.monotonic() - train_started
        _publish(learning, queued, stats)
        # The environment frames the actors played for this step: its fresh trajectories on
        # every learner (replayed ones were counted when they came).
        progress.add_frames(int(learners.fresh.sum()) * learning.frames_per_trajectory)
        counters.end_step(progress.frames)
        learning.saver.maybe_save(progress.frames, counters.version, counters.training_secs())
        episodes = _record_episodes(learning, progress)
        if learning.population:
            _take_part_in_pbt(learning, progress.frames, episodes, batch)
        if time.monotonic() >= next_report or progress.done:
            reports.report_progress(learning, progress, stats, learners)
            reports.report_refusals(learning)
            next_report = time.monotonic() + config.log_every_secs
        counters.add_step_times(started, waited, trained)
    counters.end_core_waits = thread_core_waits()
    return progress


def _publish(learning: Learning, queued, stats: dict) -> None:
    """Counts the step and publishes its weights to the actors as the next version."""
    counters = learning.counters
    counters.steps += 1
    counters.version += 1
    reports.count_skipped(learning, stats["skipped_steps"])
    learning.saver.record_published(counters.version)
    learning.service.publish_weights(counters.version)
    fresh = steps.fresh_count(learning, queued)
    counters.trajectories_by_actor.update(np.asarray(queued.actor_task)[:fresh].tolist())


def _record_episodes(learning: Learning, progress: Progress) -> np.ndarray:
    """Adds every learner's games finished since the last step to the progress and the
    TensorBoard summaries; returns them (a row per game: return, frames, start frames)."""
    episodes = steps.gather_episodes(learning.service, learning.counters)
    progress.add_episode_returns(episodes[:, 0])
    if learning.summaries and len(episodes):
        learning.summaries.episodes(progress.frames, episodes[:, 0], episodes[:, 1], episodes[:, 2])
    return episodes


def _take_part_in_pbt(learning: Learning, frames: int, episodes: np.ndarray, batch) -> None:
    """--with_pbt: counts the policy's games; at a look, every learner of the policy takes its
    decision (a copy, checked on the step's `batch`, is published as a new weight version);
    rank 0 serves the policy's status and, when asked, its state."""
    population, counters = learning.population, learning.counters
    population.record(episodes[:, 0])

    def check() -> str | None:
        return steps.outputs_out_of_bounds(learning.agent, batch)

    if population.due(frames) and population.look(frames, learning.summaries, check):
        counters.version += 1
        learning.saver.record_published(counters.version)
        learning.service.publish_weights(counters.version)
    if learning.topology.is_chief:
        population.serve(learning.service, frames)


def _finish(learning: Learning, progress: Progress) -> dict:
    """Saves the last state, tells the actors if the run is over, writes this learner's
    summary and waits for every learner to be done."""
    counters, service = learning.counters, learning.service
    # Asynchronous gradients: every learner applies the last step's, kept until now.
    reports.count_skipped(learning, learning.trainer.flush())
    if counters.steps:
        # (After no step, the latest checkpoint already holds this state: writing it again
        # would rewrite that checkpoint's files in place.)
        learning.saver.save(progress.frames, counters.version, counters.training_secs())
    # Every learner stopped after this version: none above it was published.
    learning.saver.record_stopped(counters.version)
    if progress.done:
        # Only a finished run tells the actors to exit; after a stop they keep trying to
        # reconnect, so that a resumed learner finds them.
        service.close(linger_secs=learning.config.linger_secs)
    # Calls under way end now: left to the interpreter's exit, the server's threads outlived
    # their pool and held an actor's calls until their deadline.
    service.stop()
    if learning.population:
        learning.population.close()
    summary = reports.summary(learning, progress)
    saving.write_summary(learning.run_dir, learning.topology.rank, summary)
    learning.report(f"done: {progress.summary()}")
    # Horovod: no learner exits before rank 0 has saved. mpirun kills every rank as soon as one
    # exits with an error status, which a stopped learner does.
    allreduce.wait_for_learners("exit")
    return summary
