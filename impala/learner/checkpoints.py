"""Learner checkpoints: weights, optimizer state, frame count, weight version and training time,
written so that neither a crash nor a lost machine leaves a broken latest checkpoint, and read so
that a broken one costs one save interval, never the run.

A save writes the checkpoint's data and index files, flushes them and their folder to disk
(fsync), and only then rewrites the small `checkpoint` state file that names the latest ones
(a temporary file, flushed, renamed over it, the folder flushed again). Until that rename,
"latest" names the previous complete checkpoint. Old checkpoints are deleted only after.

A save refuses a state that is not finite (a NaN or infinite weight or optimizer value): such
a checkpoint would be the latest, and every later start would resume it.

A restore first removes what saves interrupted by a kill left behind (`remove_interrupted_saves`),
then tries the checkpoints newest first. One that cannot be read (truncated, corrupt:
TensorFlow checks every tensor's CRC) or that holds values that are not finite is reported in
one line and the previous one is used; once one is, those it passed over are set aside in
`unusable/` and leave the state file, so that they hold none of the kept places. A state file
that cannot be parsed is reported and the checkpoints in the folder are used. If checkpoints
exist and none can be used, the restore fails with a one-line error, moving nothing: a run never
silently starts again from frame 0.

Weight versions only grow, across restarts and fallbacks too: actors take a version they hold
for the weights they hold, so a version must never be published again with other weights.
Before a version is published, the folder's `published_version` file says that versions up to
it (and some beyond, so that it is rewritten rarely) may have been; a restore goes on from the
restored checkpoint's version only if none above it may have been published, and otherwise
from the next version above them.

The folder's files themselves (the state file, durable writes, what interrupted saves leave,
copies) are `checkpoint_folder.py`'s.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from impala import run_identity
from impala.learner.checkpoint_folder import (
    KEEP_UNUSABLE,
    READ_ERRORS,
    UNUSABLE,
    VERSIONS_FILE,
    delete_checkpoint,
    first_line,
    fsync_path,
    listed,
    path_of,
    prune_unusable,
    read_counter,
    read_identity,
    remove_interrupted_saves,
    versions_in,
    write_durably,
    write_state,
)

__all__ = [
    "VERSIONS_FILE",
    "CheckpointMismatchError",
    "CheckpointReadError",
    "Checkpointer",
    "NotFiniteError",
    "first_line",
    "listed",
    "read_counter",
    "read_identity",
]


class CheckpointMismatchError(ValueError):
    """The checkpoint was written by a run with another environment or network."""


class CheckpointReadError(ValueError):
    """No checkpoint of the run could be read; the message names the folder and why."""


class NotFiniteError(FloatingPointError):
    """The state to checkpoint holds values that are not finite.

    Not a ValueError: a learner that stops on it is started again by its launcher, and resumes
    from the last checkpoint that is finite.
    """


# Versions reserved at a time in the versions file: it is rewritten once every so many steps.
_VERSIONS_AHEAD = 100
# A weight version has at most this many digits (int64, which the counters are, holds 18).
_MAX_VERSION_DIGITS = 15


class Checkpointer:
    """Saves and restores one learner's training state in `directory`."""

    def __init__(
        self,
        directory: str,
        agent,
        optimizer,
        identity: dict[str, Any],
        keep: int,
        keep_every_frames: float = 0,
    ):
        """Tracks `agent` and `optimizer` (its slots must exist) plus the counters.

        Args:
          directory: where checkpoints go (created on the first save).
          identity: what a checkpoint must match to be restored (environment, network, ...).
          keep: how many recent checkpoints to keep.
          keep_every_frames: also keep the first checkpoint written at or after each multiple
            of this many frames (0: none), so that a run can be followed or branched
            (`benchmarks/branch.py`) from points along it. They stay while the run keeps the
            setting (a resume takes it from flags.json); without it only the recent ones do.
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
        self._directory = directory
        self._keep = keep
        self._keep_every_frames = keep_every_frames
        self._agent, self._optimizer = agent, optimizer
        self._reserved = -1  # versions up to this are recorded as possibly published

    @property
    def counters(self) -> list[tf.Variable]:
        return [self.frames, self.version, self.training_secs]

    @property
    def latest(self) -> str | None:
        """The newest checkpoint the state file names (None if none)."""
        found, _ = listed(self._directory)
        return found[-1] if found else None

    def restore_latest(self, report: Callable[[str], None] = print) -> str | None:
        """Restores the newest checkpoint that can be read and holds finite values; returns its
        path (None: no checkpoint).

        Also removes what interrupted saves left, sets aside the checkpoints passed over, and
        makes `version` the one to go on from (see the module's docstring), recording it.

        Args:
          report: told, in one line each, of every checkpoint skipped and why, and of what
            was removed or set aside.

        Raises:
          CheckpointMismatchError: naming each setting that differs from this run's.
          CheckpointReadError: checkpoints exist but none can be used.
        """
        published = self._highest_published(report)  # before what an interrupted save left goes
        for name in remove_interrupted_saves(self._directory, report):
            report(f"removed {os.path.join(self._directory, name)}, left by an interrupted save")
        candidates, problem = listed(self._directory)
        if problem:
            report(problem)
        passed_over, failures = [], []
        for path in reversed(candidates):
            reason = self._restore_if_usable(path)
            if reason is None:
                self._set_aside(passed_over, candidates, report)
                self._go_on_above(published, report)
                return path
            failures.append(f"{os.path.basename(path)}: {reason}")
            passed_over.append(path)
            report(f"checkpoint {path} {reason}; trying the one before")
        if failures:
            raise CheckpointReadError(
                f"{self._directory}: no checkpoint can be used ({'; '.join(failures)}); "
                "refusing to start again from frame 0: move the folder away to start a new run"
            )
        self._go_on_above(published, report)
        return None

    def _restore_if_usable(self, path: str) -> str | None:
        """Restores `path`; returns why it cannot be resumed from, or None if it can."""
        try:
            self._restore(path)
        except CheckpointMismatchError:
            raise
        except READ_ERRORS as error:
            return f"cannot be read ({first_line(error)})"
        not_finite = self._not_finite()
        if not_finite:
            return f"holds values that are not finite ({not_finite})"
        return None

    def _set_aside(self, paths: list[str], listed_paths: list[str], report) -> None:
        """Moves the files of checkpoints `paths` into `unusable/` and drops them from the state
        file, which then names the rest of `listed_paths`."""
        if not paths:
            return
        folder = os.path.join(self._directory, UNUSABLE)
        try:
            for path in paths:
                prefix = os.path.basename(path) + "."
                for name in os.listdir(self._directory):
                    if name.startswith(prefix):
                        os.makedirs(folder, exist_ok=True)
                        os.replace(os.path.join(self._directory, name), os.path.join(folder, name))
            write_state(self._directory, [p for p in listed_paths if p not in paths])
        except OSError as error:
            report(f"cannot set aside {', '.join(paths)} ({first_line(error)})")
            return
        names = ", ".join(os.path.basename(p) for p in paths)
        report(f"set aside {names} in {folder}: no longer among the kept checkpoints")
        pruned = prune_unusable(folder, report)
        if pruned:
            report(
                f"removed the set-aside checkpoints {', '.join(map(str, pruned))} from {folder}: "
                f"it keeps the newest {KEEP_UNUSABLE}"
            )

    def _go_on_above(self, highest: int, report) -> None:
        """Makes `version` one above `highest`, the highest version that may have been
        published, unless the restored one is that high (its weights are that version's), and
        records it."""
        restored = int(self.version)
        if highest > restored:
            self.version.assign(highest + 1)
            report(
                f"weight versions up to {highest} may have been published by an earlier start; "
                f"going on from {highest + 1}, not from the checkpoint's {restored}"
            )
        self.record_publishing(int(self.version))

    def _highest_published(self, report) -> int:
        """What the versions file says, and at least the version of every checkpoint in the
        folder, set aside or interrupted (each is written after its version is published)."""
        unusable = os.path.join(self._directory, UNUSABLE)
        highest = max([-1, *versions_in(self._directory), *versions_in(unusable)])
        path = os.path.join(self._directory, VERSIONS_FILE)
        try:
            with open(path, "rb") as f:
                recorded = int(f.read(_MAX_VERSION_DIGITS + 2).decode("ascii"))
            if not 0 <= recorded < 10**_MAX_VERSION_DIGITS:
                raise ValueError(f"{recorded} is no weight version")
        except FileNotFoundError:
            return highest
        except (OSError, UnicodeDecodeError, ValueError) as error:
            report(f"{path} cannot be read ({first_line(error)}); going by the checkpoints' names")
            return highest
        return max(highest, recorded)

    def record_publishing(self, version: int) -> None:
        """Records, before any learner publishes `version`, that it may have been published.

        Learners step together, so another may publish one version more than rank 0 has: the
        record covers that one too, and as many again as `_VERSIONS_AHEAD` so that it is
        rewritten once every so many steps.
        """
        if version + 1 > self._reserved:
            self._write_versions(version + _VERSIONS_AHEAD)

    def record_stopped(self, version: int) -> None:
        """Records that every learner stopped after `version`: none above it was published."""
        self._write_versions(version)

    def _write_versions(self, version: int) -> None:
        os.makedirs(self._directory, exist_ok=True)
        write_durably(self._directory, VERSIONS_FILE, f"{version}\n")
        self._reserved = version

    def _not_finite(self) -> str | None:
        """Which values of the state (weights, optimizer state, training time) are not finite,
        in a few words; None if all are."""
        state = [*self._agent.variables, *self._optimizer.variables, self.training_secs]
        floats = [v for v in state if v.dtype.is_floating]
        bad = [v.name for v in floats if not np.isfinite(v.numpy()).all()]
        if not bad:
            return None
        return f"{len(bad)} of {len(floats)} variables, such as {bad[0]}"

    def save(self, frames: int, version: int, training_secs: float = 0.0) -> str:
        """Writes a checkpoint of the current state at `frames` and weight `version`.

        Returns its path once it is on disk and the state file names it as the latest.

        Raises:
          NotFiniteError: the state holds values that are not finite; nothing is written.
        """
        not_finite = self._not_finite()
        if not_finite:
            raise NotFiniteError(
                f"refusing to checkpoint weight version {version}: its state holds values that "
                f"are not finite ({not_finite})"
            )
        self.frames.assign(frames)
        self.version.assign(version)
        self.training_secs.assign(training_secs)
        os.makedirs(self._directory, exist_ok=True)
        path = path_of(self._directory, version)
        written = self._checkpoint.write(path)
        for name in os.listdir(self._directory):
            if name.startswith(os.path.basename(written) + "."):
                fsync_path(os.path.join(self._directory, name))
        fsync_path(self._directory)
        before, _ = listed(self._directory)
        older = [p for p in before if p != written]
        recent = older[-(self._keep - 1) :] if self._keep > 1 else []
        milestones = self._milestones([*older, written])
        kept = [p for p in older if p in milestones or p in recent]
        write_state(self._directory, [*kept, written])
        for old in set(before) - set(kept) - {written}:
            delete_checkpoint(old)
        return written

    def _milestones(self, paths: list[str]) -> set[str]:
        """Of `paths` (oldest first), the first at or after each multiple of keep_every_frames.

        While the setting is the same, every checkpoint a save deleted had an older one of
        its multiple kept, so the first of each multiple among those left is the first of all
        that were written. One whose frames cannot be read (now) is kept too: nothing is
        deleted on a guess.
        """
        if not self._keep_every_frames:
            return set()
        firsts: dict[int, str] = {}
        unread = set()
        for path in paths:
            try:
                frames = read_counter(path, "frames")
            except READ_ERRORS:
                unread.add(path)
                continue
            firsts.setdefault(int(frames // self._keep_every_frames), path)
        return set(firsts.values()) | unread

    def _restore(self, path: str) -> None:
        current = run_identity.decode(self._identity)
        saved = read_identity(path)
        # An identity this project never wrote is compared as it is: it differs.
        with contextlib.suppress(KeyError, TypeError):
            saved = run_identity.with_legacy_defaults(saved, current)
        if saved != current:
            differences = run_identity.mismatch(current, saved, "this run", "the checkpoint")
            raise CheckpointMismatchError(f"refusing to resume from {path}: {differences}")
        self._checkpoint.read(path).assert_existing_objects_matched()
