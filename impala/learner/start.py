"""A learner's start: its agent and trainer, the run's files (folder, secret, TLS bundle, latest
checkpoint), every learner on rank 0's state, and the service its actors reach it through."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable

import tensorflow as tf

import networks
from impala import build, run_folder, run_tls, transport
from impala.configs import LearnerConfig, LearnerJobConfig, addresses
from impala.learner import allreduce, saving
from impala.learner.optimise import Trainer
from impala.learner.population import Population
from impala.learner.replay import Mixer, make_encoder
from impala.learner.state import Counters, EnvInfo, Learning
from impala.learner.summaries import Summaries


def start(config: LearnerJobConfig, report: Callable[[str], None]) -> Learning:
    """Everything this learner trains with, on the state every learner shares: rank 0's latest
    checkpoint or its fresh weights, published to the actors."""
    topology = allreduce.init(len(config.learner_hosts))
    if topology.size != len(config.learner_hosts):
        raise ValueError(
            f"--learner_hosts names {len(config.learner_hosts)} learners but "
            f"{topology.size} were started (mpirun -np must match)"
        )
    chief_report = report if topology.is_chief else (lambda line: None)
    run_dir = saving.make_run_folder(config, topology)
    tf.random.set_seed(config.game.seed)
    env_info, agent = build_agent(config)
    trainer = make_trainer(
        agent,
        config.learner,
        config.grad_workers_communication,
        config.gradient_compression,
        seed=config.game.seed + topology.rank,
    )
    spec, identity = transport.describe(
        env_info,
        agent,
        config.learner.unroll_length,
        config.game.level_name,
        config.game.num_action_repeats,
    )
    secret = saving.load_run_secret(saving.secret_path(config, run_dir), topology, chief_report)
    tls = load_run_tls(config, run_dir, topology, chief_report) if config.transport_tls else None
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
    mixer, queue_capacity = None, config.queue_capacity or config.learner.batch_size
    if config.replays:
        mixer = Mixer(
            config.replays,
            config.learner.batch_size,
            config.game.seed + topology.rank,
            encode=make_encoder(agent),
        )
        queue_capacity = _replay_queue_capacity(config, mixer)
        # Rank 0's run folder says whether this policy started before: its flags are saved
        # once a start gets past this check. (A collective: every rank calls it.)
        flags_saved = allreduce.broadcast_object_from_chief(
            topology.is_chief
            and bool(run_dir)
            and os.path.exists(os.path.join(run_dir, run_folder.FLAGS_FILE))
        )
        started_before = resumed_from is not None or flags_saved
        learners_here = learners_to_count(config, topology, started_before)
        _check_replay_memory(config, mixer, spec, learners_here, chief_report)
    if run_dir and topology.is_chief:
        # Only now: a start that failed (a bad flag, another run's checkpoint, replays too
        # large) leaves the run's saved flags as they were.
        saving.save_flags(run_dir, config.flag_values, chief_report)
    # Looked up here, not imported: tests wrap the service class (tests/recording_learner.py).
    service = transport.LearnerService(
        address=config.learner_hosts[topology.rank],
        spec=spec,
        identity=identity,
        variables=list(agent.variables),
        learner_index=topology.rank,
        num_learners=topology.size,
        queue_capacity=queue_capacity,
        secret=secret,
        tls=tls,
        synchronous=config.synchronous_collection,
    )
    population = None
    if config.pbt.with_pbt:
        population = Population(
            config,
            trainer,
            list(agent.variables) + list(trainer.optimizer.variables),
            run_dir,
            topology.is_chief,
            chief_report,
            secret,
            tls,
        )
        population.restore(resumed_from)
    counters = Counters()
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
        f"learner {topology.rank}/{topology.size} serving {config.game.level_name} with "
        f"{type(agent).__name__} at {config.learner_hosts[topology.rank]}; frames are emulator "
        f"frames ({env_info.frames_per_step} per agent step)"
    )
    saver = saving.Saver(
        checkpointer if topology.is_chief else None, config.save_every_secs, chief_report
    )
    if population and run_dir and topology.is_chief:
        saver.before_save = population.before_save
    return Learning(
        config=config,
        topology=topology,
        agent=agent,
        trainer=trainer,
        service=service,
        env_info=env_info,
        counters=counters,
        saver=saver,
        report=chief_report,
        summaries=(
            Summaries(run_dir, config.summary_histograms) if run_dir and topology.is_chief else None
        ),
        run_dir=run_dir,
        start_frames=start_frames,
        resumed_from=resumed_from,
        mixer=mixer,
        population=population,
    )


def _replay_queue_capacity(config: LearnerJobConfig, mixer: Mixer) -> int:
    """The queue's capacity with replays: its entry's capacity in batches of its share, and at
    least one whole batch, which the first batches (all fresh, until the replays hold their
    shares) take from it."""
    return max(config.learner.batch_size, mixer.queue.capacity * mixer.fresh_share)


# How long the learner waits for the run's learner host names to resolve, all together.
RESOLVE_SECS = 5.0


def learners_to_count(config: LearnerJobConfig, topology, started_before: bool) -> int:
    """The learners on this host whose replays the memory check counts against what is free.

    A policy's first start counts every learner of the run on the host (`learners_on_host`,
    names that resolve to one address counted as one host), none of which holds its replays
    yet. A policy that `started_before` (a resume, or a restart after a learner died, with or
    without a checkpoint yet) counts its own learners only, Horovod's local ones, which all
    start again together: another policy's learners may be running, and what their replays
    hold (they fill in about a minute) is no longer free, so counting them too would count it
    twice and refuse a restart that fits (for good: the refusal is final). A user's resume of
    the whole run counts so too: its first start checked the run's learners together.
    """
    if started_before:
        return topology.local_size
    names = config.run_learner_host_names()
    resolved = (
        addresses.resolve(names, RESOLVE_SECS) if len({name.lower() for name in names}) > 1 else {}
    )
    return max(topology.local_size, config.learners_on_host(topology.rank, resolved))


def _check_replay_memory(
    config: LearnerJobConfig,
    mixer: Mixer,
    spec,
    learners_here: int,
    report: Callable[[str], None],
) -> None:
    """Says what each learner's replays hold at capacity; refuses, in one line, replays that do
    not fit in the memory this machine has free, each of the `learners_here` learners of the run
    on this host keeping its own (they check at the same time, before any fills)."""
    parts, total = [], 0
    for spec_of_replay, share, store in mixer.replays:
        size = store.bytes_at_capacity(store.capacity, spec.queue_specs())
        total += size
        parts.append(
            f"{spec_of_replay.type} of {store.capacity} trajectories ({size / 2**20:,.0f} MiB at "
            f"capacity) gives {share}"
        )
    report(
        f"replays: the queue gives {mixer.fresh_share} of each batch of "
        f"{config.learner.batch_size} fresh trajectories; " + "; ".join(parts) + "; resumed "
        "runs start with empty replays"
    )
    error = replay_memory_error(total, learners_here, _memory_available())
    if error:
        raise ValueError(error)


def replay_memory_error(per_learner: int, learners_here: int, available: int | None) -> str:
    """The one-line refusal of replays that hold `per_learner` bytes at capacity in each of
    `learners_here` learners on a host with `available` bytes free (None: unknown, no
    refusal), or '' when they fit."""
    needed = per_learner * learners_here
    if available is None or needed <= available:
        return ""
    held = f"{per_learner / 2**30:.1f} GiB"
    fewer = ""
    if learners_here > 1:
        held = (
            f"{needed / 2**30:.1f} GiB ({held} in each of the {learners_here} learners "
            "on this host)"
        )
        fewer = ", run fewer learners on this host"
    return (
        f"--replay_parameters: the replays would hold {held} at capacity, more than the "
        f"{available / 2**30:.1f} GiB this machine has free; lower their capacities (the "
        f"default's uniform replay holds 1,000 trajectories){fewer}, or give "
        "--replay_parameters='' to train on fresh trajectories only"
    )


def _memory_available() -> int | None:
    """Bytes of memory free for new allocations (Linux's MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def make_trainer(
    agent: networks.Agent, learner: LearnerConfig, scheme: str, compression: str, seed: int
) -> Trainer:
    """A learner's `Trainer` whose gradients Horovod averages over the learners under the
    gradient scheme `scheme` (`--grad_workers_communication`), sent as `compression`, with its
    optimiser's slots made."""
    delayed = scheme == "asynchronous"
    trainer = Trainer(
        agent,
        learner,
        # Synchronous gradients: averaged as the tape takes them; asynchronous: a step later.
        wrap_tape=None if delayed else allreduce.tape_wrapper(compression),
        every_learner=allreduce.every_learner,
        seed=seed,
        delayed_reduce=allreduce.gradient_reducer(compression) if delayed else None,
    )
    trainer.create_optimizer_slots()
    return trainer


def build_agent(config: LearnerJobConfig) -> tuple[EnvInfo, networks.Agent]:
    """Reads the environment's specs from one instance, built as the actors build theirs (a
    setting they would refuse stops the learner too), and builds the agent's variables."""
    # Its seed does not matter: only the specs are read.
    with build.game_environment(config.game, num_envs=1, seed=0) as env:
        env_info = EnvInfo(
            num_actions=env.num_actions,
            observation_shape=env.observation_shape,
            observation_dtype=env.observation_dtype,
            frames_per_step=env.frames_per_step,
            frame_pooling=env.frame_pooling,
        )
        agent = build.agent(config.agent_name, env, config.compute_dtype)
    return env_info, agent


def load_run_tls(config: LearnerJobConfig, run_dir: str, topology, report) -> run_tls.Material:
    """The run's TLS bundle, beside the run secret (`saving.load_run_secret`), as that is
    found: rank 0 creates it if it is missing, the other learners read it after that (on their
    host), and all check that they hold rank 0's.

    Raises:
      ValueError: a bundle is missing, unusable (`run_tls.load`) or differs from rank 0's.
    """
    path = run_tls.beside(saving.secret_path(config, run_dir))
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
