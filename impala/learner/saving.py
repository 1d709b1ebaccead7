"""Where a learner keeps its run: the run folder, its flags, checkpoints on a schedule and the
summary each learner writes at its end. Only rank 0 writes, except its own summary."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from impala import run_folder, run_identity
from impala.learner import allreduce, checkpoints


def make_run_folder(config, topology) -> str:
    """The run folder, created ('' without --logdir); rank 0 names it if --experiment does not."""
    if not config.logdir:
        return ""
    name = config.experiment
    if not name:
        # Horovod: every learner writes into the folder rank 0 named, whatever its clock says.
        name = allreduce.broadcast_object_from_chief(
            run_folder.default_name(config.level_name) if topology.is_chief else None
        )
    run_dir = run_folder.path(config.logdir, name)
    os.makedirs(run_dir, exist_ok=True)
    return run_dir


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
    )


class Saver:
    """Writes rank 0's checkpoints every `every_secs` and when asked (other ranks: never)."""

    def __init__(self, checkpointer, every_secs: float, report):
        self._checkpointer = checkpointer
        self._every_secs = every_secs
        self._report = report
        self._next = time.monotonic() + every_secs

    def maybe_save(self, frames: int, version: int, training_secs: float) -> None:
        if time.monotonic() >= self._next:
            self.save(frames, version, training_secs)

    def save(self, frames: int, version: int, training_secs: float) -> None:
        if self._checkpointer is None:
            return
        path = self._checkpointer.save(frames, version, training_secs)
        self._report(f"checkpoint {path} at {frames} frames, weight version {version}")
        self._next = time.monotonic() + self._every_secs


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
