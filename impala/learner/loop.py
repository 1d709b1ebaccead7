"""The learner role: serve actors, train on their trajectories, stay in step with other learners.

Each learner owns a queue fed by its actors (actor task i belongs to learner i mod L). Every step it
takes one batch from its own queue, computes the IMPALA loss, averages gradients with the other
learners through Horovod and applies them, then publishes the new weights to its actors. The frame
budget is global: all learners count the frames of all learners, so they stop at the same step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

import networks
from impala import build, run_folder, run_secret, run_tls, transport
from impala.configs import (
    LearnerConfig,
    check_learner_hosts,
    check_learner_job_flags,
    check_playing_flags,
)
from impala.learner import allreduce, saving
from impala.learner.optimise import Trainer
from impala.learner.summaries import Summaries
from impala.progress import Progress, core_wait_secs, thread_core_waits
from impala.trajectory import MAX_ABS_EPISODE_RETURN, Batch


@dataclasses.dataclass(frozen=True)
class LearnerJobConfig:
    """Everything a learner process needs.

    Attributes:
      learner_hosts: "host:port" of every learner; learner rank r listens on the r-th.
      queue_capacity: trajectories the queue holds before actors block (0: one batch).
      logdir: holds the run folders; this run's is `<logdir>/<experiment>` (see `run_folder`):
        rank 0's flags, TensorBoard events and checkpoints, and every learner's summary
        (`learner_<rank>.json`). A run started again on the same folder resumes from its
        latest checkpoint. '' writes nothing.
      experiment: the run folder's name; '' lets rank 0 name it after the level and the time.
      secret_file: the run secret every actor's call must carry (`impala/run_secret.py`);
        '' is the run folder's `secret`, which rank 0 creates if it is missing.
      transport_tls: serve over mutual TLS with the run's TLS bundle (`impala/run_tls.py`),
        the `tls.pem` beside the secret file, which rank 0 creates if it is missing.
      private_files: make the run folder owner-only (0700), one made before too; what is
        created in it is as private as the process's umask makes it (`experiment.py` sets it
        to 077 with --private_run_files).
      flag_values: every flag of the run, saved by rank 0 as the run folder's `flags.json`.
      summary_histograms: also write histograms of the weights to TensorBoard.
      save_every_secs: rank 0 writes a checkpoint this often, at the end, and when stopped.
      keep_checkpoints: how many recent checkpoints to keep.
      keep_checkpoint_every_frames: also keep the first checkpoint at or after each multiple of
        this many frames (0: none).
      stall_warning_secs: warn when no full batch arrived for this long.
      linger_secs: after the last step, keep answering actors for this long so that they hear
        that training is over.
    """

    level_name: str
    agent_name: str
    learner_hosts: tuple[str, ...]
    num_action_repeats: int = 1
    repeat_action_probability: float = 0.0
    frame_skip: int = 0
    frame_pooling: str = "max"
    seed: int = 0
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    queue_capacity: int = 0
    logdir: str = ""
    experiment: str = ""
    secret_file: str = ""
    transport_tls: bool = False
    private_files: bool = True
    flag_values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    summary_histograms: bool = False
    log_every_secs: float = 5.0
    stall_warning_secs: float = 60.0
    linger_secs: float = 3.0
    save_every_secs: float = 600.0
    keep_checkpoints: int = 3
    keep_checkpoint_every_frames: float = 0

    def __post_init__(self):
        check_learner_hosts(self.learner_hosts)
        run_folder.check_name(self.experiment)
        if not (self.secret_file or self.logdir):
            raise ValueError(
                "--secret_file: needed with --logdir='' (a run folder would keep the run secret)"
            )
        check_playing_flags(
            self.num_action_repeats,
            self.seed,
            self.repeat_action_probability,
            self.frame_skip,
            self.frame_pooling,
        )
        check_learner_job_flags(
            self.queue_capacity,
            self.learner.batch_size,
            self.keep_checkpoints,
            self.save_every_secs,
            self.keep_checkpoint_every_frames,
        )


# Set by a signal handler (Ctrl-C, SIGTERM, SIGUSR1): the learners stop at the next step
# boundary, all at the same one, so the checkpoint holds weights and counters of one step.
_stop_requested = threading.Event()


def request_stop() -> None:
    """Asks a running learner to stop after its current step, save and exit."""
    _stop_requested.set()


@dataclasses.dataclass
class _Counters:
    """What the learner has done so far."""

    version: int = 0
    steps: int = 0
    # Optimisation steps skipped because their loss or gradients were not finite (the same on
    # every learner: they skip together), and finished games left out of the statistics for a
    # return that is not finite or beyond `MAX_ABS_EPISODE_RETURN`.
    skipped_steps: int = 0
    episodes_ignored: int = 0
    trajectories_by_actor: Counter = dataclasses.field(default_factory=Counter)
    refusals_reported: dict[str, int] = dataclasses.field(default_factory=dict)
    # When the first step ended, and the frames then: the steady-state rate is measured from
    # there, leaving out start-up, waiting for actors and tracing the train step.
    first_step_time: float | None = None
    first_step_frames: int = 0
    last_step_time: float | None = None
    # This process's CPU seconds (all its threads: the train step's and the RPC server's) at
    # the end of the first step and of the last.
    first_step_cpu: float = 0.0
    last_step_cpu: float = 0.0
    # Each thread's nanoseconds waiting for a core (`progress.thread_core_waits`) at the end of
    # the first step and when training ended (read once each: off the per-step path); None
    # where the kernel does not say.
    first_step_core_waits: dict[str, int] | None = None
    end_core_waits: dict[str, int] | None = None
    # Where the learner's time went in the steps after the first (the steady-state window):
    # waiting for a full batch, in the optimisation steps, and everything else (gathering the
    # learners' states and games, publishing weights, checkpoints, reports).
    waiting_secs: float = 0.0
    train_secs: float = 0.0
    other_secs: float = 0.0
    # Training time before this start (from the checkpoint), and when this start began.
    earlier_training_secs: float = 0.0
    started: float = dataclasses.field(default_factory=time.monotonic)

    def training_secs(self) -> float:
        return self.earlier_training_secs + time.monotonic() - self.started


@dataclasses.dataclass
class _Learning:
    """Everything one learner trains with; built once by `run`."""

    config: LearnerJobConfig
    topology: allreduce.Topology
    agent: networks.Agent
    trainer: Trainer
    service: transport.LearnerService
    env_info: _EnvInfo
    counters: _Counters
    saver: saving.Saver
    report: Callable[[str], None]  # rank 0's report; other ranks' is silent
    summaries: Summaries | None  # rank 0 with a run folder only


def run(config: LearnerJobConfig, report: Callable[[str], None] = logging.info) -> dict:
    """Trains until the global frame budget is spent. Returns this learner's summary."""
    topology = allreduce.init()
    if topology.size != len(config.learner_hosts):
        raise ValueError(
            f"--learner_hosts names {len(config.learner_hosts)} learners but "
            f"{topology.size} were started (mpirun -np must match)"
        )
    chief_report = report if topology.is_chief else (lambda line: None)
    run_dir = saving.make_run_folder(config, topology)
    tf.random.set_seed(config.seed)
    env_info, agent = _build_agent(config)
    trainer = Trainer(
        agent,
        config.learner,
        wrap_tape=allreduce.wrap_tape,
        every_learner=allreduce.every_learner,
    )
    trainer.create_optimizer_slots()
    spec, identity = transport.describe(
        env_info, agent, config.learner.unroll_length, config.level_name, config.num_action_repeats
    )
    secret = saving.load_run_secret(config.secret_file, run_dir, topology, chief_report)
    tls = _load_run_tls(config, run_dir, topology, chief_report) if config.transport_tls else None
    checkpointer = saving.make_checkpointer(run_dir, config, agent, trainer, identity)
    resumed_from = (
        checkpointer.restore_latest(chief_report) if checkpointer and topology.is_chief else None
    )
    # Horovod: every learner starts from rank 0's weights, optimizer state and counters,
    # restored from a checkpoint or freshly initialised.
    allreduce.broadcast_from_chief(
        list(agent.variables)
        + list(trainer.optimizer.variables)
        + (checkpointer.counters if checkpointer else [])
    )
    resumed_from = allreduce.broadcast_object_from_chief(resumed_from)
    if run_dir and topology.is_chief:
        # Only now: a start that failed (a bad flag, another run's checkpoint) leaves the run's
        # saved flags as they were.
        saving.save_flags(run_dir, config.flag_values, chief_report)
    service = transport.LearnerService(
        address=config.learner_hosts[topology.rank],
        spec=spec,
        identity=identity,
        variables=list(agent.variables),
        learner_index=topology.rank,
        num_learners=topology.size,
        queue_capacity=config.queue_capacity or config.learner.batch_size,
        secret=secret,
        tls=tls,
    )
    counters = _Counters()
    start_frames = 0
    if checkpointer:
        counters.version, start_frames = int(checkpointer.version), int(checkpointer.frames)
        counters.earlier_training_secs = float(checkpointer.training_secs)
    service.publish_weights(counters.version)
    if resumed_from:
        chief_report(
            f"resumed from {resumed_from}: {start_frames} frames done, weight version "
            f"{counters.version}, weights sha256 {saving.weights_checksum(agent.variables)}"
        )
    chief_report(
        f"learner {topology.rank}/{topology.size} serving {config.level_name} with "
        f"{type(agent).__name__} at {config.learner_hosts[topology.rank]}; frames are emulator "
        f"frames ({env_info.frames_per_step} per agent step)"
    )
    learning = _Learning(
        config=config,
        topology=topology,
        agent=agent,
        trainer=trainer,
        service=service,
        env_info=env_info,
        counters=counters,
        saver=saving.Saver(
            checkpointer if topology.is_chief else None, config.save_every_secs, chief_report
        ),
        report=chief_report,
        summaries=(
            Summaries(run_dir, config.summary_histograms) if run_dir and topology.is_chief else None
        ),
    )
    try:
        progress = _train(learning, start_frames)
    finally:
        if learning.summaries:
            learning.summaries.close()
    if counters.steps:
        # (After no step, the latest checkpoint already holds this state: writing it again
        # would rewrite that checkpoint's files in place.)
        learning.saver.save(progress.frames, counters.version, counters.training_secs())
    # Every learner stopped after this version: none above it was published.
    learning.saver.record_stopped(counters.version)
    if progress.done:
        # Only a finished run tells the actors to exit; after a stop they keep trying to
        # reconnect, so that a resumed learner finds them.
        service.close(linger_secs=config.linger_secs)
    # Calls under way end now: left to the interpreter's exit, the server's threads outlived
    # their pool and held an actor's calls until their deadline.
    service.stop()
    summary = {
        "rank": topology.rank,
        "run_dir": run_dir,
        "frames": progress.frames,
        "steps": counters.steps,
        "weights_version": counters.version,
        "weights_sha256": saving.weights_checksum(agent.variables),
        "trajectories_by_actor": {
            str(k): v for k, v in sorted(counters.trajectories_by_actor.items())
        },
        "episodes": progress.episodes,
        "mean_return": progress.mean_return,
        "best_mean_return": progress.best_mean_return,
        "frames_per_second_steady": _steady_rate(counters, progress.frames),
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
        "resumed_from": resumed_from,
        "refused_calls": service.refusals,
        "skipped_steps": counters.skipped_steps,
        "episodes_ignored": counters.episodes_ignored,
        # Calls refused for the secret, by the caller's host ("ipv4:10.0.0.7").
        "refusing_hosts": service.refusing_hosts,
        "stopped_early": not progress.done,
    }
    saving.write_summary(run_dir, topology.rank, summary)
    chief_report(f"done: {progress.summary()}")
    # Horovod: no learner exits before rank 0 has saved. mpirun kills every rank as soon as one
    # exits with an error status, which a stopped learner does.
    allreduce.wait_for_learners("exit")
    return summary


def _load_run_tls(config: LearnerJobConfig, run_dir: str, topology, report) -> run_tls.Material:
    """The run's TLS bundle, beside the run secret (`saving.load_run_secret`), as that is
    found: rank 0 creates it if it is missing, the other learners read it after that (on their
    host), and all check that they hold rank 0's.

    Raises:
      ValueError: a bundle is missing, unusable (`run_tls.load`) or differs from rank 0's.
    """
    path = run_tls.beside(config.secret_file or run_secret.path_in(run_dir))
    material, created = run_tls.ensure(path) if topology.is_chief else (None, False)
    allreduce.wait_for_learners("tls_written")
    if not topology.is_chief:
        material = run_tls.load(path)
    # Horovod: only a digest of the run's authority travels between learners.
    digest = hashlib.sha256(material.ca).hexdigest()
    if not hmac.compare_digest(digest, allreduce.broadcast_object_from_chief(digest)):
        raise run_tls.TlsError(
            f"{path}: learner {topology.rank} holds another TLS bundle than learner 0; "
            "copy learner 0's file to every learner host"
        )
    report(
        f"TLS bundle {'created in' if created else 'read from'} {path} (owner-only); actors "
        "read it beside their --secret_file"
    )
    return material


def _steady_rate(counters: _Counters, frames: int) -> float | None:
    """Frames per second (all learners) from the end of the first step to the end of the last."""
    if counters.first_step_time is None or counters.last_step_time == counters.first_step_time:
        return None
    elapsed = counters.last_step_time - counters.first_step_time
    return (frames - counters.first_step_frames) / elapsed


def _build_agent(config: LearnerJobConfig):
    """Reads the environment's specs from one instance, built as the actors build theirs (a
    setting they would refuse stops the learner too), and builds the agent's variables."""
    with build.environment(
        config.level_name,
        num_envs=1,
        num_action_repeats=config.num_action_repeats,
        repeat_action_probability=config.repeat_action_probability,
        frame_skip=config.frame_skip,
        frame_pooling=config.frame_pooling,
    ) as env:
        env_info = _EnvInfo(
            num_actions=env.num_actions,
            observation_shape=env.observation_shape,
            observation_dtype=env.observation_dtype,
            frames_per_step=env.frames_per_step,
            frame_pooling=env.frame_pooling,
        )
        agent = build.agent(config.agent_name, env)
    return env_info, agent


@dataclasses.dataclass(frozen=True)
class _EnvInfo:
    num_actions: int
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    frames_per_step: int
    frame_pooling: str


def _train(learning: _Learning, start_frames: int) -> Progress:
    config, counters, service = learning.config, learning.counters, learning.service
    batch_size = config.learner.batch_size
    frames_per_trajectory = config.learner.unroll_length * learning.env_info.frames_per_step
    frames_per_step_all_learners = batch_size * frames_per_trajectory * learning.topology.size
    progress = Progress(config.learner.total_environment_frames, start_frames=start_frames)
    next_report = time.monotonic()  # the first step is reported at once, then every few seconds
    while not progress.done:
        started = time.monotonic()
        queued = _wait_for_batch(service, batch_size, config, learning.topology)
        waited = time.monotonic() - started
        learners = _learner_states(learning, queued)
        if np.any(learners.stop):
            break
        train_started = time.monotonic()
        stats = learning.trainer.learn(_to_batch(queued, learning.agent), progress.frames)
        trained = time.monotonic() - train_started
        counters.steps += 1
        counters.version += 1
        _count_skipped(learning, stats["skipped_steps"])
        learning.saver.record_published(counters.version)
        service.publish_weights(counters.version)
        counters.trajectories_by_actor.update(queued.actor_task.numpy().tolist())
        progress.add_frames(frames_per_step_all_learners)
        counters.last_step_time = time.monotonic()
        counters.last_step_cpu = time.process_time()
        if counters.first_step_time is None:
            counters.first_step_time = counters.last_step_time
            counters.first_step_frames = progress.frames
            counters.first_step_cpu = counters.last_step_cpu
            counters.first_step_core_waits = thread_core_waits()
        learning.saver.maybe_save(progress.frames, counters.version, counters.training_secs())
        episodes = _gather_episodes(service, counters)
        progress.add_episode_returns(episodes[:, 0])
        if learning.summaries and len(episodes):
            learning.summaries.episodes(
                progress.frames, episodes[:, 0], episodes[:, 1], episodes[:, 2]
            )
        if time.monotonic() >= next_report or progress.done:
            _report(learning, progress, stats, learners, frames_per_trajectory)
            _report_refusals(learning)
            next_report = time.monotonic() + config.log_every_secs
        if counters.steps > 1:
            counters.waiting_secs += waited
            counters.train_secs += trained
            counters.other_secs += time.monotonic() - started - waited - trained
    counters.end_core_waits = thread_core_waits()
    return progress


class _LearnerStates(NamedTuple):
    """Every learner's state before a step, [L] each (index = rank)."""

    stop: np.ndarray  # asked to stop (a signal), so every learner stops before this step
    queue_size: np.ndarray
    trajectories_received: np.ndarray
    policy_lag: np.ndarray  # weight versions between acting and learning, batch mean
    actors: np.ndarray  # actor tasks that have connected since the learner started
    reconnections: np.ndarray  # connections beyond each task's first: restarted actors


def _learner_states(learning: _Learning, queued) -> _LearnerStates:
    """Gathers every learner's state; `queued` is this learner's batch, None if it was stopped.

    Horovod: this is also the vote on stopping. A learner asked to stop cannot leave alone:
    the others would wait for it in the next all-reduce. So every learner says before each step
    whether it was asked to, and all stop after the same step, with identical weights.
    """
    service = learning.service
    stop = queued is None or _stop_requested.is_set()
    lag = np.nan
    if queued is not None:
        lag = learning.counters.version - float(np.mean(queued.weight_version.numpy()))
    connections = service.connections
    own = [
        [
            float(stop),
            service.queue_size,
            service.trajectories_received,
            lag,
            len(connections),
            sum(connections.values()) - len(connections),
        ]
    ]
    states = allreduce.gather_from_learners(np.asarray(own, np.float64), "learner_states")
    return _LearnerStates(*states.T)


def _gather_episodes(service: transport.LearnerService, counters: _Counters) -> np.ndarray:
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


def _count_skipped(learning: _Learning, skipped: int) -> None:
    """Counts the step's skipped optimisation steps; says so when the first one is."""
    if skipped and not learning.counters.skipped_steps:
        learning.report(
            f"step {learning.counters.version} skipped an optimisation step: its loss or "
            "gradients were not finite (a batch beyond what float32 holds, see "
            "impala/trajectory.py); the weights were left as they were. Skipped steps are "
            "counted on the progress line and in TensorBoard's optimizer/skipped_steps"
        )
    learning.counters.skipped_steps += skipped


def _report(learning: _Learning, progress: Progress, stats, learners, frames_per_trajectory):
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
        f"grad norm {stats['gradient_norm']:.2f}{_skipped(counters)} | "
        f"lr {stats['learning_rate']:.2e} | policy lag {policy_lag:.1f} "
        f"(clipped {stats['clipped_fraction']:.0%}) | "
        f"queue {service.queue_size}/{service.queue_capacity} | "
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
        frames_received=learners.trajectories_received * frames_per_trajectory,
        actor_reconnections=learners.reconnections,
    )
    summaries.weights(progress.frames, learning.agent.variables)
    summaries.flush()


def _skipped(counters: _Counters) -> str:
    """The progress line's count of skipped steps, once there is one."""
    if not counters.skipped_steps:
        return ""
    return f" ({counters.skipped_steps} steps skipped: not finite)"


def _report_refusals(learning: _Learning) -> None:
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


def _wait_for_batch(service, batch_size, config, topology) -> transport.QueuedTrajectories | None:
    """Dequeues a batch, polling so that a stop request is seen meanwhile (then: None).

    A learner whose actors are gone says so once (not only the chief: a learner without data
    stalls every learner), keeps waiting for them, and says when data flows again.
    """
    started = time.monotonic()
    warned = False
    received = service.trajectories_received
    while service.queue_size < batch_size:
        if _stop_requested.is_set():
            return None
        time.sleep(0.002)
        if not warned and time.monotonic() >= started + config.stall_warning_secs:
            warned = True
            logging.warning(
                "learner %d has waited %.0f s for a batch (%d/%d trajectories queued): are its "
                "actors (tasks %d mod %d) running? It keeps waiting for them",
                topology.rank,
                time.monotonic() - started,
                service.queue_size,
                batch_size,
                topology.rank,
                topology.size,
            )
    if warned:
        logging.warning(
            "learner %d: its actors are back (%d trajectories after %.0f s)",
            topology.rank,
            service.trajectories_received - received,
            time.monotonic() - started,
        )
    return service.dequeue(batch_size)


def _to_batch(queued: transport.QueuedTrajectories, agent: networks.Agent) -> Batch:
    """Restores the agent's core-state structure, which the queue holds flattened."""
    agent_state = tf.nest.pack_sequence_as(agent.initial_state(1), queued.agent_state)
    return Batch(agent_state=agent_state, steps=queued.steps)
