"""Learner checkpoints: weights, optimizer state, frame count, weight version and training time,
written so that a crash never leaves a broken latest checkpoint.

`tf.train.CheckpointManager` writes a checkpoint's data and index files first and then replaces
the small `checkpoint` state file atomically (write to a temporary file, rename): until that
rename, "latest" still names the previous complete checkpoint.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from impala import run_identity

_IDENTITY_KEY = "identity/.ATTRIBUTES/VARIABLE_VALUE"


def read_identity(path: str) -> dict[str, Any]:
    """What the checkpoint at `path` was written for: its environment and network.

    Args:
      path: one checkpoint, e.g. `runs/pong/checkpoints/ckpt-25`.

    Returns:
      The identity a `Checkpointer` saved (`level_name`, `agent_name`, `num_actions`, ...).
    """
    saved = tf.train.load_variable(path, _IDENTITY_KEY)
    return run_identity.decode(saved)


def read_counter(path: str, name: str) -> int:
    """The counter `name` ("frames" or "version") saved in the checkpoint at `path`."""
    return int(tf.train.load_variable(path, f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))


class CheckpointMismatchError(ValueError):
    """The checkpoint was written by a run with another environment or network."""


class Checkpointer:
    """Saves and restores one learner's training state in `directory`."""

    def __init__(self, directory: str, agent, optimizer, identity: dict[str, Any], keep: int):
        """Tracks `agent` and `optimizer` (its slots must exist) plus the counters.

        Args:
          directory: where checkpoints go (created on the first save).
          identity: what a checkpoint must match to be restored (environment, network, ...).
          keep: how many recent checkpoints to keep.
        """
        self.frames = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.version = tf.Variable(0, dtype=tf.int64, trainable=False)
        # Seconds spent training, so that a resumed run's time axis excludes the pause.
        self.training_secs = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._identity = run_identity.encode(identity)
        self._checkpoint = tf.train.Checkpoint(
            agent=agent,
            optimizer=optimizer,
            frames=self.frames,
            version=self.version,
            training_secs=self.training_secs,
            identity=tf.Variable(self._identity, trainable=False),
        )
        self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=keep)

    @property
    def counters(self) -> list[tf.Variable]:
        return [self.frames, self.version, self.training_secs]

    @property
    def latest(self) -> str | None:
        return self._manager.latest_checkpoint

    def restore_latest(self) -> str | None:
        """Restores the latest checkpoint, if any; returns its path.

        Raises:
          CheckpointMismatchError: naming each setting that differs from this run's.
        """
        path = self.latest
        if path is None:
            return None
        saved = read_identity(path)
        if saved != run_identity.decode(self._identity):
            differences = run_identity.mismatch(
                run_identity.decode(self._identity), saved, "this run", "the checkpoint"
            )
            raise CheckpointMismatchError(f"refusing to resume from {path}: {differences}")
        self._checkpoint.restore(path).assert_existing_objects_matched()
        return path

    def save(self, frames: int, version: int, training_secs: float = 0.0) -> str:
        """Writes a checkpoint of the current state at `frames` and weight `version`."""
        self.frames.assign(frames)
        self.version.assign(version)
        self.training_secs.assign(training_secs)
        return self._manager.save(checkpoint_number=version)
