"""The learner role: serve actors, train on their trajectories, stay in step with other learners.

Each learner owns a queue fed by its actors (actor task i belongs to learner i mod L). Every step it
takes one batch from its own queue, computes the IMPALA loss, averages gradients with the other
learners through Horovod and applies them, then publishes the new weights to its actors. The frame
budget is global: all learners count the frames of all learners, so they stop at the same step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import checkpoints
import distributed
import environments
import networks
import transport
from learner import Batch, Learner, LearnerConfig
from progress import Progress


@dataclasses.dataclass(frozen=True)
class LearnerJobConfig:
    """Everything a learner process needs.

    Attributes:
      learner_hosts: "host:port" of every learner; learner rank r listens on the r-th.
      queue_capacity: trajectories the queue holds before actors block (0: 4 batches).
      logdir: the run's folder: the learner's summary (`learner_<rank>.json`) and rank 0's
        checkpoints (`checkpoints/`) go there, and a run started again with the same folder
        resumes from its latest checkpoint. '' for none of that.
      save_every_secs: rank 0 writes a checkpoint this often, at the end, and when stopped.
      keep_checkpoints: how many recent checkpoints to keep.
      stall_warning_secs: warn when no full batch arrived for this long.
      linger_secs: after the last step, keep answering actors for this long so that they hear
        that training is over.
    """

    level_name: str
    agent_name: str
    learner_hosts: tuple[str, ...]
    num_action_repeats: int = 1
    seed: int = 0
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    queue_capacity: int = 0
    logdir: str = ""
    log_every_secs: float = 5.0
    stall_warning_secs: float = 60.0
    linger_secs: float = 3.0
    save_every_secs: float = 600.0
    keep_checkpoints: int = 3

    def __post_init__(self):
        check_learner_hosts(self.learner_hosts)
        if self.queue_capacity < 0:
            raise ValueError(f"--queue_capacity={self.queue_capacity}: must be >= 0")
        if self.keep_checkpoints < 1:
            raise ValueError(f"--keep_checkpoints={self.keep_checkpoints}: must be >= 1")
        if self.save_every_secs <= 0:
            raise ValueError(f"--save_every_secs={self.save_every_secs}: must be > 0")


# Set by a signal handler (Ctrl-C, SIGTERM): the learner stops at the next step boundary, so
# the checkpoint it then writes holds weights and counters of the same step.
_stop_requested = threading.Event()


def request_stop() -> None:
    """Asks a running learner to stop after its current step, save and exit."""
    _stop_requested.set()


def check_learner_hosts(learner_hosts: tuple[str, ...]) -> None:
    """Raises a one-line error unless `--learner_hosts` is a non-empty list of host:port."""
    if not learner_hosts:
        raise ValueError("--learner_hosts is empty: give one host:port per learner")
    for address in learner_hosts:
        parse_address(address, "--learner_hosts")


def parse_address(address: str, flag: str) -> tuple[str, int]:
    """Splits "host:port", raising a one-line error that names `flag`."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag}: {address!r} is not host:port with a port in 1-65535")
    return host, int(port)


@dataclasses.dataclass
class _Counters:
    """What the learner has done so far."""

    version: int = 0
    steps: int = 0
    trajectories_by_actor: Counter = dataclasses.field(default_factory=Counter)
    # When the first step ended, and the frames then: the steady-state rate is measured from
    # there, leaving out start-up, waiting for actors and tracing the train step.
    first_step_time: float | None = None
    first_step_frames: int = 0
    last_step_time: float | None = None


def run(config: LearnerJobConfig, report: Callable[[str], None] = logging.info) -> dict:
    """Trains until the global frame budget is spent. Returns this learner's summary."""
    topology = distributed.init()
    if topology.size != len(config.learner_hosts):
        raise ValueError(
            f"--learner_hosts names {len(config.learner_hosts)} learners but "
            f"{topology.size} were started (mpirun -np must match)"
        )
    tf.random.set_seed(config.seed)
    env_info, agent = _build_agent(config)
    trainer = Learner(agent, config.learner, wrap_tape=distributed.wrap_tape)
    trainer.create_optimizer_slots()
    spec, identity = transport.describe(
        env_info, agent, config.learner.unroll_length, config.level_name, config.num_action_repeats
    )
    checkpointer = _make_checkpointer(config, agent, trainer, identity)
    resumed_from = checkpointer.restore_latest() if checkpointer and topology.is_chief else None
    # Horovod: every learner starts from rank 0's weights, optimizer state and counters,
    # restored from a checkpoint or freshly initialised.
    distributed.broadcast_from_chief(
        list(agent.variables)
        + list(trainer.optimizer.variables)
        + (checkpointer.counters if checkpointer else [])
    )
    capacity = config.queue_capacity or 4 * config.learner.batch_size
    service = transport.LearnerService(
        address=config.learner_hosts[topology.rank],
        spec=spec,
        identity=identity,
        variables=list(agent.variables),
        learner_index=topology.rank,
        num_learners=topology.size,
        queue_capacity=capacity,
    )
    counters = _Counters()
    start_frames = 0
    if checkpointer:
        counters.version, start_frames = int(checkpointer.version), int(checkpointer.frames)
    service.publish_weights(counters.version)
    chief_report = report if topology.is_chief else (lambda line: None)
    if resumed_from:
        chief_report(
            f"resumed from {resumed_from}: {start_frames} frames done, weight version "
            f"{counters.version}, weights sha256 {weights_checksum(agent.variables)}"
        )
    chief_report(
        f"learner {topology.rank}/{topology.size} serving {config.level_name} with "
        f"{type(agent).__name__} at {config.learner_hosts[topology.rank]}; frames are emulator "
        f"frames ({env_info.frames_per_step} per agent step)"
    )
    saver = _Saver(
        checkpointer if topology.is_chief else None, config.save_every_secs, chief_report
    )
    progress = _train(
        config,
        topology,
        agent,
        trainer,
        service,
        env_info,
        counters,
        chief_report,
        start_frames,
        saver,
    )
    saver.save(progress.frames, counters.version)
    if progress.done:
        # Only a finished run tells the actors to exit; after a stop they keep trying to
        # reconnect, so that a resumed learner finds them.
        service.close(linger_secs=config.linger_secs)
    summary = {
        "rank": topology.rank,
        "frames": progress.frames,
        "steps": counters.steps,
        "weights_version": counters.version,
        "weights_sha256": weights_checksum(agent.variables),
        "trajectories_by_actor": {
            str(k): v for k, v in sorted(counters.trajectories_by_actor.items())
        },
        "episodes": progress.episodes,
        "mean_return": progress.mean_return,
        "best_mean_return": progress.best_mean_return,
        "frames_per_second_steady": _steady_rate(counters, progress.frames),
        "resumed_from": resumed_from,
        "stopped_early": not progress.done,
    }
    _write_summary(config.logdir, topology.rank, summary)
    chief_report(f"done: {progress.summary()}")
    return summary


def _make_checkpointer(config, agent, trainer, identity) -> checkpoints.Checkpointer | None:
    if not config.logdir:
        return None
    # What a checkpoint must match to be resumed; the unroll length, batch size and the like
    # may change between runs.
    keys = (
        "level_name",
        "agent_name",
        "num_actions",
        "observation_shape",
        "observation_dtype",
        "num_action_repeats",
    )
    return checkpoints.Checkpointer(
        os.path.join(config.logdir, "checkpoints"),
        agent,
        trainer.optimizer,
        {key: identity[key] for key in keys},
        keep=config.keep_checkpoints,
    )


class _Saver:
    """Writes rank 0's checkpoints every `every_secs` and when asked (other ranks: never)."""

    def __init__(self, checkpointer, every_secs: float, report):
        self._checkpointer = checkpointer
        self._every_secs = every_secs
        self._report = report
        self._next = time.monotonic() + every_secs

    def maybe_save(self, frames: int, version: int) -> None:
        if time.monotonic() >= self._next:
            self.save(frames, version)

    def save(self, frames: int, version: int) -> None:
        if self._checkpointer is None:
            return
        path = self._checkpointer.save(frames, version)
        self._report(f"checkpoint {path} at {frames} frames, weight version {version}")
        self._next = time.monotonic() + self._every_secs


def _steady_rate(counters: _Counters, frames: int) -> float | None:
    """Frames per second (all learners) from the end of the first step to the end of the last."""
    if counters.first_step_time is None or counters.last_step_time == counters.first_step_time:
        return None
    elapsed = counters.last_step_time - counters.first_step_time
    return (frames - counters.first_step_frames) / elapsed


def _build_agent(config: LearnerJobConfig):
    """Reads the environment's specs from one instance and builds the agent's variables."""
    env_config = environments.EnvConfig(
        level_name=config.level_name, num_envs=1, num_action_repeats=config.num_action_repeats
    )
    with environments.make_environment(env_config) as env:
        env_info = _EnvInfo(
            num_actions=env.num_actions,
            observation_shape=env.observation_shape,
            observation_dtype=env.observation_dtype,
            frames_per_step=env.frames_per_step,
        )
    agent = networks.make_agent(config.agent_name, env_info.num_actions)
    networks.build_variables(agent, env_info.observation_shape, env_info.observation_dtype)
    return env_info, agent


@dataclasses.dataclass(frozen=True)
class _EnvInfo:
    num_actions: int
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype
    frames_per_step: int


def _train(
    config, topology, agent, trainer, service, env_info, counters, report, start_frames, saver
) -> Progress:
    learner_config = config.learner
    frames_per_step_all_learners = (
        learner_config.batch_size
        * learner_config.unroll_length
        * env_info.frames_per_step
        * topology.size
    )
    progress = Progress(learner_config.total_environment_frames, start_frames=start_frames)
    next_report = time.monotonic() + config.log_every_secs
    while not progress.done and not _stop_requested.is_set():
        queued = _wait_for_batch(service, learner_config.batch_size, config, topology, report)
        if queued is None:  # asked to stop while waiting
            break
        stats = trainer.step(_to_batch(queued, agent), progress.frames)
        counters.steps += 1
        counters.version += 1
        service.publish_weights(counters.version)
        counters.trajectories_by_actor.update(queued.actor_task.numpy().tolist())
        progress.add_frames(frames_per_step_all_learners)
        counters.last_step_time = time.monotonic()
        if counters.first_step_time is None:
            counters.first_step_time, counters.first_step_frames = (
                counters.last_step_time,
                progress.frames,
            )
        saver.maybe_save(progress.frames, counters.version)
        episodes = service.pop_episodes()
        # Horovod: every learner's finished episodes, so rank 0 reports them all.
        progress.add_episode_returns(
            distributed.gather_from_learners(episodes.episode_return, "episode_returns")
        )
        if time.monotonic() >= next_report or progress.done:
            policy_lag = counters.version - 1 - float(np.mean(queued.weight_version.numpy()))
            report(progress.line())
            report(
                f"  step {counters.steps} | loss {stats['loss/total']:.3f} "
                f"(pg {stats['loss/policy_gradient']:.3f}, baseline {stats['loss/baseline']:.3f}, "
                f"entropy {stats['loss/entropy']:.3f}) | grad norm {stats['gradient_norm']:.2f} | "
                f"lr {stats['learning_rate']:.2e} | policy lag {policy_lag:.1f} | "
                f"queue {service.queue_size}/{service.queue_capacity}"
            )
            next_report = time.monotonic() + config.log_every_secs
    return progress


def _wait_for_batch(
    service, batch_size, config, topology, report
) -> transport.QueuedTrajectories | None:
    """Dequeues a batch, polling so that a stop request is seen meanwhile (then: None)."""
    started = time.monotonic()
    next_warning = started + config.stall_warning_secs
    while service.queue_size < batch_size:
        if _stop_requested.is_set():
            return None
        time.sleep(0.002)
        if time.monotonic() >= next_warning:
            # Not only the chief: a learner whose actors all died stalls every learner.
            logging.warning(
                "learner %d has waited %.0f s for a batch (%d/%d trajectories queued): "
                "are its actors (tasks %d mod %d) running?",
                topology.rank,
                time.monotonic() - started,
                service.queue_size,
                batch_size,
                topology.rank,
                topology.size,
            )
            next_warning += config.stall_warning_secs
    return service.dequeue(batch_size)


def _to_batch(queued: transport.QueuedTrajectories, agent: networks.Agent) -> Batch:
    """Restores the agent's core-state structure, which the queue holds flattened."""
    agent_state = tf.nest.pack_sequence_as(agent.initial_state(1), queued.agent_state)
    return Batch(agent_state=agent_state, steps=queued.steps)


def weights_checksum(variables) -> str:
    """SHA-256 of the exact weight bytes, to compare learners."""
    hasher = hashlib.sha256()
    for variable in variables:
        hasher.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return hasher.hexdigest()


def _write_summary(logdir: str, rank: int, summary: dict) -> None:
    if not logdir:
        return
    os.makedirs(logdir, exist_ok=True)
    path = os.path.join(logdir, f"learner_{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(path + ".tmp", path)
