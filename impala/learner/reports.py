"""What a learner says: rank 0's progress lines and TensorBoard summaries, each learner's refused
calls, and the summary each learner writes at its end (`learner_<rank>.json`)."""

from __future__ import annotations

import logging

import numpy as np

from impala.learner import saving
from impala.learner.state import Counters, Learning
from impala.learner.steps import LearnerStates
from impala.progress import Progress, core_wait_secs


def count_skipped(learning: Learning, skipped: int) -> None:
    """Counts the step's skipped optimisation steps; says so when the first one is."""
    if skipped and not learning.counters.skipped_steps:
        learning.report(
            f"step {learning.counters.version} skipped an optimisation step: its loss or "
            "gradients were not finite (a batch beyond what float32 holds, see "
            "impala/trajectory.py); the weights were left as they were. Skipped steps are "
            "counted on the progress line and in TensorBoard's optimizer/skipped_steps"
        )
    learning.counters.skipped_steps += skipped


def report_progress(
    learning: Learning, progress: Progress, stats: dict, learners: LearnerStates
) -> None:
    """Rank 0's progress lines and TensorBoard summaries."""
    service, counters = learning.service, learning.counters
    policy_lag = float(np.mean(learners.policy_lag))
    frames_per_sec = progress.rate()
    learning.report(progress.line(frames_per_sec))
    # The entropy bonus's weight when it follows a schedule (--entropy_cost_anneal_frames).
    entropy_weight = (
        f" at weight {stats['entropy_cost']:.4f}"
        if learning.config.learner.entropy_cost_anneal_frames
        else ""
    )
    learning.report(
        # Counted since the run began (the weights' version), not since this start.
        f"  step {counters.version} | loss {stats['loss/total']:.3f} "
        f"(pg {stats['loss/policy_gradient']:.3f}, baseline {stats['loss/baseline']:.3f}, "
        f"entropy {stats['loss/entropy']:.3f}{entropy_weight}) | "
        f"grad norm {stats['gradient_norm']:.2f}{skipped_text(counters)} | "
        f"lr {stats['learning_rate']:.2e} | policy lag {policy_lag:.1f} "
        f"(clipped {stats['clipped_fraction']:.0%}) | "
        f"queue {service.queue_size}/{service.queue_capacity}{replay_text(learning)}"
        f"{stale_text(learning)} | "
        f"actors {int(learners.actors.sum())} (back {int(learners.reconnections.sum())}x)"
    )
    summaries = learning.summaries
    if summaries is None:
        return
    summaries.training(
        progress.frames,
        stats,
        frames_per_sec,
        counters.training_secs(),
        policy_lag,
        counters.skipped_steps,
    )
    summaries.learners(
        progress.frames,
        queue_fill=learners.queue_size / service.queue_capacity,
        frames_received=learners.trajectories_received * learning.frames_per_trajectory,
        actor_reconnections=learners.reconnections,
    )
    if learning.mixer:
        summaries.replays(progress.frames, learning.mixer)
    summaries.weights(progress.frames, learning.agent.variables)
    summaries.flush()


def replay_text(learning: Learning) -> str:
    """The progress line's replays, with --replay_parameters: each one's fill and how often
    its trajectories were sampled on average, and how much of the last batch was replayed."""
    mixer = learning.mixer
    if mixer is None:
        return ""
    parts = []
    for index, (spec, _, store) in enumerate(mixer.replays):
        text = f"{spec.type} {store.size}/{store.capacity} (sampled "
        text += f"{_mean(store.times_sampled()):.1f}x"
        if index in mixer.distances_last:
            text += f", distance {_mean(mixer.distances_last[index]):.3f}"
        parts.append(text + ")")
    batch_size = learning.config.learner.batch_size
    return f" | replayed {mixer.replayed_last}/{batch_size}: " + ", ".join(parts)


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def stale_text(learning: Learning) -> str:
    """The progress line's count of trajectories dropped for their lag, in synchronous
    collection (this learner's)."""
    if not learning.config.synchronous_collection:
        return ""
    return f" (stale dropped {learning.service.stale_trajectories})"


def skipped_text(counters: Counters) -> str:
    """The progress line's count of skipped steps, once there is one."""
    if not counters.skipped_steps:
        return ""
    return f" ({counters.skipped_steps} steps skipped: not finite)"


def report_refusals(learning: Learning) -> None:
    """Says (every learner, for itself) which calls it refused since it last said so."""
    refusals = learning.service.refusals
    seen = learning.counters.refusals_reported
    new = {reason: n - seen.get(reason, 0) for reason, n in refusals.items()}
    if any(new.values()):
        logging.warning(
            "learner %d refused %s (%d since it started)",
            learning.topology.rank,
            ", ".join(f"{n} call(s): {reason}" for reason, n in new.items() if n),
            sum(refusals.values()),
        )
    learning.counters.refusals_reported = refusals


def summary(learning: Learning, progress: Progress) -> dict:
    """This learner's closing summary, which it writes as `learner_<rank>.json`."""
    counters, service = learning.counters, learning.service
    return {
        "rank": learning.topology.rank,
        "run_dir": learning.run_dir,
        "frames": progress.frames,
        "steps": counters.steps,
        "weights_version": counters.version,
        "weights_sha256": saving.weights_checksum(learning.agent.variables),
        "trajectories_by_actor": {
            str(k): v for k, v in sorted(counters.trajectories_by_actor.items())
        },
        "episodes": progress.episodes,
        "mean_return": progress.mean_return,
        "best_mean_return": progress.best_mean_return,
        "frames_per_second_steady": counters.steady_rate(progress.frames),
        # The steady window's steps (all but this start's first) and where their time went.
        "steady_steps": max(counters.steps - 1, 0),
        "steady_secs": {
            "waiting_for_batch": counters.waiting_secs,
            "train_steps": counters.train_secs,
            "other": counters.other_secs,
        },
        # CPU seconds this process used over the steady window, every thread counted.
        "steady_cpu_secs": counters.last_step_cpu - counters.first_step_cpu,
        # Seconds its threads were runnable but waited for a core, summed over threads (None:
        # the kernel does not say): what the processes sharing its cores took from its steps.
        "steady_core_wait_secs": core_wait_secs(
            counters.first_step_core_waits, counters.end_core_waits
        ),
        "training_secs": counters.training_secs(),
        "resumed_from": learning.resumed_from,
        "refused_calls": service.refusals,
        "skipped_steps": counters.skipped_steps,
        # Synchronous collection: trajectories dropped for being acted with older weights.
        "stale_trajectories": service.stale_trajectories,
        "episodes_ignored": counters.episodes_ignored,
        # Calls refused for the secret, by the caller's host ("ipv4:10.0.0.7").
        "refusing_hosts": service.refusing_hosts,
        # Calls refused while callers left too many replies unread, and replies cancelled
        # after long unread (`serving.ReplyBudget`).
        "unread_replies": service.unread_replies,
        "stopped_early": not progress.done,
    }
