"""Where a learner keeps its run: the run folder, its flags, checkpoints on a schedule and the
summary each learner writes at its end. Only rank 0 writes, except its own summary."""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from impala import run_folder, run_identity, run_secret
from impala.learner import allreduce, checkpoints


def make_run_folder(config, topology) -> str:
    """The run folder, created ('' without --logdir), owner-only with `config.private_files`;
    rank 0 names it if --experiment does not. In a run of several policies, this learner's
    policy's folder in it."""
    if not config.logdir:
        return ""
    name = config.experiment
    if not name:
        # Horovod: every learner writes into the folder rank 0 named, whatever its clock says.
        name = allreduce.broadcast_object_from_chief(
            run_folder.default_name(config.game.level_name) if topology.is_chief else None
        )
    run_dir = run_folder.path(config.logdir, name, config.policy_folder)
    run_folder.make_checked(run_dir)  # before anything in it is read back or written
    if config.private_files:
        run_folder.make_private(run_root(config, run_dir))
        run_folder.make_private(run_dir)
    return run_dir


def run_root(config, run_dir: str) -> str:
    """The run folder itself: `run_dir`, or in a run of several policies the folder above it
    (`run_dir` is then the policy's)."""
    return os.path.dirname(run_dir) if config.policy_folder is not None else run_dir


def secret_path(config, run_dir: str) -> str:
    """Where the run secret is: --secret_file, or the run folder's, which every policy of a run
    of several shares (`run_root`)."""
    return config.secret_file or run_secret.path_in(run_root(config, run_dir))


def load_run_secret(path: str, topology, report) -> str:
    """The run secret every learner serves with, in `path` (`secret_path`).

    Rank 0 creates the file if it is missing; the other learners read it (on their host) after
    that, and all check that they hold the same secret as rank 0.

    Raises:
      ValueError: a secret file is missing, unusable (`run_secret.load`) or differs from
        rank 0's.
    """
    secret, created = run_secret.ensure(path) if topology.is_chief else ("", False)
    allreduce.wait_for_learners("secret_written")
    if not topology.is_chief:
        secret = run_secret.load(path)
    # Horovod: only a digest travels between learners, and it is compared on rank 0's terms.
    digest = hashlib.sha256(secret.encode()).hexdigest()
    chief_digest = allreduce.broadcast_object_from_chief(digest)
    if not hmac.compare_digest(digest, chief_digest):
        raise run_secret.SecretError(
            f"{path}: learner {topology.rank} holds another run secret than learner 0; copy "
            "learner 0's file to every learner host"
        )
    report(
        f"run secret {'created in' if created else 'read from'} {path} (owner-only); actors "
        f"read it with --secret_file"
    )
    return secret


def save_flags(run_dir: str, flag_values: Mapping[str, Any], report) -> None:
    """Saves the run's flags, saying first which ones differ from an earlier start's."""
    saved = run_folder.read_flags(run_dir)
    if saved is None:
        report(f"run folder {run_dir}")
    else:
        changed = run_folder.changed_flags(saved, flag_values)
        report(
            f"run folder {run_dir} exists: resuming it"
            + (f", with changed flags: {'; '.join(changed)}" if changed else "")
        )
    if flag_values:
        run_folder.write_flags(run_dir, flag_values)


def make_checkpointer(run_dir, config, agent, trainer, identity) -> checkpoints.Checkpointer | None:
    """Rank 0's checkpoints in the run folder (None without one)."""
    if not run_dir:
        return None
    return checkpoints.Checkpointer(
        os.path.join(run_dir, run_folder.CHECKPOINTS),
        agent,
        trainer.optimizer,
        {key: identity[key] for key in run_identity.CHECKPOINT_KEYS},
        keep=config.keep_checkpoints,
        keep_every_frames=config.keep_checkpoint_every_frames,
    )


class Saver:
    """Writes rank 0's checkpoints every `every_secs` and when asked, and records the weight
    versions published (other ranks: never)."""

    def __init__(self, checkpointer, every_secs: float, report):
        self._checkpointer = checkpointer
        self._every_secs = every_secs
        self._report = report
        self._next = time.monotonic() + every_secs
        # Called with the weight version of each checkpoint before it is written (--with_pbt:
        # what a resume from it must take besides, `population.Population.before_save`).
        self.before_save: Callable[[int], None] | None = None

    def maybe_save(self, frames: int, version: int, training_secs: float) -> None:
        if time.monotonic() >= self._next:
            self.save(frames, version, training_secs)

    def save(self, frames: int, version: int, training_secs: float) -> None:
        if self._checkpointer is None:
            return
        if self.before_save is not None:
            self.before_save(version)
        path = self._checkpointer.save(frames, version, training_secs)
        self._report(f"checkpoint {path} at {frames} frames, weight version {version}")
        self._next = time.monotonic() + self._every_secs

    def record_published(self, version: int) -> None:
        """Called before the learners publish `version` (`Checkpointer.record_publishing`)."""
        if self._checkpointer is not None:
            self._checkpointer.record_publishing(version)

    def record_stopped(self, version: int) -> None:
        """Called once every learner has stopped after `version` (`Checkpointer.record_stopped`)."""
        if self._checkpointer is not None:
            self._checkpointer.record_stopped(version)


def weights_checksum(variables) -> str:
    """SHA-256 of the exact weight bytes, to compare learners."""
    hasher = hashlib.sha256()
    for variable in variables:
        hasher.update(np.ascontiguousarray(variable.numpy()).tobytes())
    return hasher.hexdigest()


def write_summary(run_dir: str, rank: int, summary: dict) -> None:
    if not run_dir:
        return
    run_folder.write_json(os.path.join(run_dir, f"learner_{rank}.json"), summary)
