"""The actor role: play with the latest weights of its learner and stream unrolls to it.

Actor task i belongs to learner i mod L. It waits for its learner to come up, checks that both
run the same environment and network, then loops: fetch weights if the learner's version
changed, generate one unroll on all of its environments, send it with the finished episodes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from impala import build, run_secret, run_tls, transport
from impala.actor.actor import Actor
from impala.configs import ActorJobConfig

__all__ = ["ActorJobConfig", "derived_seeds", "run"]


def run(config: ActorJobConfig, report: Callable[[str], None] = logging.info) -> int:
    """Acts until the learner finishes. Returns the number of unrolls sent."""
    secret = _read_secret(config, report)  # before anything slow: a bad file fails fast
    tls = _read_tls(config, report) if config.transport_tls else None
    # Before TensorFlow runs anything: its thread pools are made once, at its first op.
    tf.config.threading.set_intra_op_parallelism_threads(config.threads)
    game = config.game
    env_seed, sampling_seed = derived_seeds(game.seed, config.task, config.num_envs)
    with build.game_environment(game, config.num_envs, env_seed) as env:
        agent = build.agent(config.agent_name, env, config.compute_dtype)
        spec, identity = transport.describe(
            env, agent, config.unroll_length, game.level_name, game.num_action_repeats
        )
        actor = Actor(env, agent, config.unroll_length, seed=sampling_seed)
        counts = _Counts()
        try:
            while True:
                client = _connect(
                    config, spec, identity, list(agent.variables), secret, tls, report
                )
                try:
                    _act(client, actor, counts, config, report)
                except transport.LearnerUnreachableError as error:
                    # The learner may come back (a restart, a network blip), or be back
                    # already (LearnerRestartedError): reconnect, so that it checks this actor,
                    # keeping the environments and the recurrent state as they are.
                    report(f"actor {config.task}: {error}; reconnecting")
                finally:
                    client.close()
        except transport.LearnerFinishedError:
            report(
                f"actor {config.task}: learner finished after {counts.unrolls} unrolls "
                f"({counts.sent_chunks} chunks sent, {counts.full_chunks} of them to a queue "
                f"that had filled while they travelled; {counts.room_calls} calls asking for room; "
                f"{counts.cpu_per_unroll()}; "
                f"its time: {counts.time_split()}); "
                "exiting"
            )
        return counts.unrolls


def derived_seeds(seed: int, task: int, num_envs: int) -> tuple[int, int]:
    """This actor's seeds from the run's `--seed`: (first environment's, action sampling's).

    Environment i of the actor gets the first seed + i. Seeds come from NumPy's SeedSequence
    keyed by (run seed, actor task), so that no two actors, and no two runs with different
    `--seed`, share a stream (`seed + task * num_envs` would make runs with seeds 0 and 1 share
    all but one environment).
    """
    env_state, sampling_state = np.random.SeedSequence(seed, spawn_key=(task,)).generate_state(2)
    # ALE takes environment seeds as C ints: keep seed + i below 2**31.
    return int(env_state) % (2**31 - num_envs), int(sampling_state)


# How long one attempt to reach the learner may block.
_CONNECT_ATTEMPT_SECS = 3.0
# While waiting for the learner or the run's files, say so at most this often.
_WAIT_REPORT_SECS = 30.0
# Synchronous collection: the longest pause between two asks for the learner's next weights.
_NEXT_WEIGHTS_POLL_SECS = 0.02


@dataclasses.dataclass
class _Counts:
    unrolls: int = 0
    sent_chunks: int = 0  # over every connection
    full_chunks: int = 0
    room_calls: int = 0
    # Where the actor's time went while connected, over its whole run (the learner's start-up
    # included, as waiting for room): playing (the environments and the policy), fetching
    # weights, sending unrolls, and (within sending) waiting for room in the queue.
    acting_secs: float = 0.0
    weights_secs: float = 0.0
    next_weights_secs: float = 0.0  # synchronous collection: waiting for the next version
    sending_secs: float = 0.0
    room_wait_secs: float = 0.0
    # This process's CPU seconds (every thread) when its first unroll had been sent.
    first_unroll_cpu: float | None = None

    def cpu_per_unroll(self) -> str:
        """E.g. '0.31 CPU seconds per unroll after the first'."""
        if self.first_unroll_cpu is None or self.unrolls < 2:
            return "too few unrolls to say its CPU per unroll"
        per_unroll = (time.process_time() - self.first_unroll_cpu) / (self.unrolls - 1)
        return f"{per_unroll:.3f} CPU seconds per unroll after the first"

    def time_split(self) -> str:
        """E.g. '40% acting, 5% fetching weights, 10% sending, 45% waiting for room'."""
        waiting = self.room_wait_secs
        parts = {
            "acting": self.acting_secs,
            "fetching weights": self.weights_secs,
            "sending": self.sending_secs - waiting,
            "waiting for room": waiting,
        }
        if self.next_weights_secs:
            parts["waiting for the next weights"] = self.next_weights_secs
        total = sum(parts.values())
        if total <= 0:
            return "no time acting"
        return ", ".join(f"{secs / total:.0%} {what}" for what, secs in parts.items())


def _act(client, actor: Actor, counts: _Counts, config: ActorJobConfig, report) -> None:
    """Sends unrolls until the learner finishes or stops answering (both raise)."""
    _wait_for_first_weights(client, actor)
    actor.decide_first_step_again()  # with the learner's weights, not the initial random ones
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    report(
        f"actor {config.task} acting for learner {config.learner_address} ({config.num_envs} "
        f"environments, {threads} TensorFlow thread{'s' if threads != 1 else ''} per op)"
    )
    while True:
        started = time.monotonic()
        _update_weights(client, actor)
        fetched = time.monotonic()
        if config.synchronous_collection and actor.first_step_version != actor.weight_version:
            actor.decide_first_step_again()  # lag 0 on every step, the first one too
        unroll = actor.unroll()
        acted = time.monotonic()
        counts.weights_secs += fetched - started
        counts.acting_secs += acted - fetched
        refused, sent, full = client.refused_chunks, client.sent_chunks, client.full_chunks
        room_wait, room_calls = client.room_wait_secs, client.room_calls
        try:
            client.send(unroll)
        finally:
            counts.sent_chunks += client.sent_chunks - sent
            counts.full_chunks += client.full_chunks - full
            counts.sending_secs += time.monotonic() - acted
            counts.room_wait_secs += client.room_wait_secs - room_wait
            counts.room_calls += client.room_calls - room_calls
        refused_now = client.refused_chunks > refused
        if refused_now:
            report(
                f"actor {config.task}: the learner refused an unroll ({client.refused_chunks} "
                "chunks so far); its log says why"
            )
        client.report_episodes(actor.pop_episode_stats())
        counts.unrolls += 1
        # Synchronous collection: acts again only with the learner's next weights, unless the
        # learner refused (some of) this unroll: it takes no place in the learner's round, which
        # may need it to fill the batch that leads to the next weights.
        if config.synchronous_collection and not refused_now:
            waited = time.monotonic()
            _wait_for_weights_after(client, actor, unroll.weight_version)
            counts.next_weights_secs += time.monotonic() - waited
        if counts.first_unroll_cpu is None:
            counts.first_unroll_cpu = time.process_time()


def _connect(config, spec, identity, variables, secret, tls, report) -> transport.ActorClient:
    """Connects to the learner, retrying while it starts up."""
    deadline = time.monotonic() + config.connect_timeout_secs
    next_report = time.monotonic()
    while True:
        try:
            remaining = deadline - time.monotonic()
            # Short attempts: a signal (a launcher stopping the run) waits for the RPC layer's
            # call to return before Python sees it.
            return transport.ActorClient(
                config.learner_address,
                config.task,
                spec,
                identity,
                variables,
                connect_timeout_secs=min(_CONNECT_ATTEMPT_SECS, max(1.0, remaining)),
                secret=secret,
                tls=tls,
            )
        except transport.LearnerUnreachableError as error:
            if time.monotonic() >= deadline:
                raise transport.LearnerUnreachableError(
                    f"actor {config.task}: no learner answered at {config.learner_address} "
                    f"within {config.connect_timeout_secs:.0f} s ({error})"
                ) from None
            if time.monotonic() >= next_report:
                report(f"actor {config.task}: waiting for learner {config.learner_address}")
                next_report = time.monotonic() + _WAIT_REPORT_SECS
            time.sleep(1.0)


def _read_secret(config: ActorJobConfig, report) -> str:
    """The run secret (see `_wait_for_file`)."""
    return _wait_for_file(config, config.secret_file, run_secret.load, "the run secret", report)


def _read_tls(config: ActorJobConfig, report) -> run_tls.Material:
    """The run's TLS bundle, beside the run secret (see `_wait_for_file`)."""
    path = run_tls.beside(config.secret_file)
    return _wait_for_file(config, path, run_tls.load, "the run's TLS bundle", report)


def _wait_for_file(config: ActorJobConfig, path: str, load, what: str, report):
    """`load(path)`; a missing file is waited for as the learner is (the learner may be
    creating it), anything else wrong with it is an error at once (`load`'s)."""
    deadline = time.monotonic() + config.connect_timeout_secs
    next_report = time.monotonic()
    while True:
        try:
            return load(path)
        except (run_secret.SecretError, run_tls.TlsError):
            if os.path.lexists(path) or time.monotonic() >= deadline:
                raise
        if time.monotonic() >= next_report:
            report(f"actor {config.task}: waiting for {what} at {path}")
            next_report = time.monotonic() + _WAIT_REPORT_SECS
        time.sleep(1.0)


def _wait_for_first_weights(client: transport.ActorClient, actor: Actor) -> None:
    # The learner serves from the moment its service exists and publishes once it has built or
    # restored its weights, so this wait is short; acting with our own random initial weights
    # instead would make the first unrolls' weight version meaningless.
    while not _update_weights(client, actor):
        time.sleep(0.1)


def _wait_for_weights_after(client: transport.ActorClient, actor: Actor, version: int) -> None:
    """Synchronous collection: waits until the learner publishes weights newer than `version`
    (it does after its next step), asking again after 1 ms, then at most every 20 ms."""
    delay = 0.001
    while not (_update_weights(client, actor) and actor.weight_version > version):
        time.sleep(delay)
        delay = min(2 * delay, _NEXT_WEIGHTS_POLL_SECS)


def _update_weights(client: transport.ActorClient, actor: Actor) -> bool:
    fetched = client.fetch_weights()
    if fetched is not None:
        actor.set_weights(*fetched)
    return actor.weight_version >= 0
