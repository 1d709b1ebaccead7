"""Learner checkpoints: weights, optimizer state, frame count, weight version and training time,
written so that neither a crash nor a lost machine leaves a broken latest checkpoint, and read so
that a broken one costs one save interval, never the run.

A save writes the checkpoint's data and index files, flushes them and their folder to disk
(fsync), and only then rewrites the small `checkpoint` state file that names the latest ones
(a temporary file, flushed, renamed over it, the folder flushed again). Until that rename,
"latest" names the previous complete checkpoint. Old checkpoints are deleted only after.

A restore tries the checkpoints newest first. One that cannot be read (truncated, corrupt:
TensorFlow checks every tensor's CRC) is reported in one line and the previous one is used. A
state file that cannot be parsed is reported and the checkpoints in the folder are used. If
checkpoints exist and none can be read, the restore fails with a one-line error: a run never
silently starts again from frame 0.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
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


class CheckpointReadError(ValueError):
    """No checkpoint of the run could be read; the message names the folder and why."""


STATE_FILE = "checkpoint"  # TensorFlow's name: tf.train.latest_checkpoint reads it too
_PREFIX = "ckpt"
_NUMBERED = re.compile(rf"^{_PREFIX}-(\d+)\.index$")
# A line of the state file: the checkpoints' names (TensorFlow writes timestamps too).
_STATE_LINE = re.compile(
    r'(?P<key>model_checkpoint_path|all_model_checkpoint_paths): "(?P<name>[^"]+)"'
    r"|(all_model_checkpoint_timestamps|last_preserved_timestamp): [0-9.e+-]+"
)
# What reading a damaged checkpoint raises: a short or missing file, a bad CRC, garbage.
_READ_ERRORS = (
    # DataLossError, NotFoundError, OutOfRangeError, InvalidArgumentError, ..., and OpError
    # itself: what the counter reader raises on a bad index ("block checksum mismatch").
    tf.errors.OpError,
    AssertionError,
    ValueError,
    IndexError,  # TensorFlow's checkpoint reader on a short file: "Read less bytes than requested"
    OSError,
)


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

    @property
    def counters(self) -> list[tf.Variable]:
        return [self.frames, self.version, self.training_secs]

    @property
    def latest(self) -> str | None:
        """The newest checkpoint the state file names (None if none)."""
        found, _ = listed(self._directory)
        return found[-1] if found else None

    def restore_latest(self, report: Callable[[str], None] = print) -> str | None:
        """Restores the newest checkpoint that can be read; returns its path (None: no checkpoint).

        Args:
          report: told, in one line each, of every checkpoint skipped and why.

        Raises:
          CheckpointMismatchError: naming each setting that differs from this run's.
          CheckpointReadError: checkpoints exist but none can be read.
        """
        candidates, problem = listed(self._directory)
        if problem:
            report(problem)
        if not candidates:
            return None
        failures = []
        for path in reversed(candidates):
            try:
                self._restore(path)
            except CheckpointMismatchError:
                raise
            except _READ_ERRORS as error:
                reason = first_line(error)
                failures.append(f"{os.path.basename(path)}: {reason}")
                report(f"checkpoint {path} cannot be read ({reason}); trying the one before")
                continue
            return path
        raise CheckpointReadError(
            f"{self._directory}: no checkpoint can be read ({'; '.join(failures)}); refusing to "
            "start again from frame 0: move the folder away to start a new run"
        )

    def save(self, frames: int, version: int, training_secs: float = 0.0) -> str:
        """Writes a checkpoint of the current state at `frames` and weight `version`.

        Returns its path once it is on disk and the state file names it as the latest.
        """
        self.frames.assign(frames)
        self.version.assign(version)
        self.training_secs.assign(training_secs)
        os.makedirs(self._directory, exist_ok=True)
        path = os.path.join(self._directory, f"{_PREFIX}-{version}")
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
        _write_state(self._directory, [*kept, written])
        for old in set(before) - set(kept) - {written}:
            _delete_checkpoint(old)
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
            except _READ_ERRORS:
                unread.add(path)
                continue
            firsts.setdefault(int(frames // self._keep_every_frames), path)
        return set(firsts.values()) | unread

    def _restore(self, path: str) -> None:
        current = run_identity.decode(self._identity)
        saved = run_identity.with_legacy_defaults(read_identity(path), current)
        if saved != current:
            differences = run_identity.mismatch(current, saved, "this run", "the checkpoint")
            raise CheckpointMismatchError(f"refusing to resume from {path}: {differences}")
        self._checkpoint.read(path).assert_existing_objects_matched()


def listed(directory: str) -> tuple[list[str], str | None]:
    """The checkpoints in `directory` that its state file names, oldest first, and a problem
    to report.

    A state file that cannot be read is the problem; the checkpoints are then the ones in the
    folder, by number.
    """
    state = os.path.join(directory, STATE_FILE)
    if not os.path.exists(state):
        return _in_folder(directory), None
    try:
        with open(state, encoding="utf-8") as f:
            names = _parse_state(f.read())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        found = _in_folder(directory)
        return found, (
            f"{state} cannot be read ({first_line(error)}); using the {len(found)} "
            f"checkpoint(s) in {directory}"
        )
    return [os.path.join(directory, name) for name in names], None


def copy_checkpoint(path: str, directory: str) -> str:
    """Copies checkpoint `path` (its index and data files) into `directory`, on disk, and makes
    it that folder's only checkpoint in its state file; returns the copy's path.

    Raises:
      ValueError: naming the file, if there is no index file or one is not a regular file (a
        symlink is not followed: the checkpoint may be someone else's).
    """
    folder, prefix = os.path.split(os.path.abspath(path))
    data = re.compile(rf"^{re.escape(prefix)}\.(index|data-\d+-of-\d+)$")
    names = sorted(name for name in os.listdir(folder) if data.match(name))
    if prefix + ".index" not in names:
        raise ValueError(f"{path}: no such checkpoint (no {prefix}.index)")
    os.makedirs(directory, exist_ok=True)
    for name in names:
        copy_regular_file(os.path.join(folder, name), os.path.join(directory, name))
    fsync_path(directory)
    copy = os.path.join(directory, prefix)
    _write_state(directory, [copy])
    return copy


def copy_regular_file(source: str, destination: str) -> None:
    """Copies `source` to a new file `destination`, on disk; a one-line ValueError naming
    `source` if it is not a regular file (a symlink is not followed, a device not read)."""
    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        raise ValueError(f"{source}: cannot be read ({error.strerror or error})") from None
    with os.fdopen(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise ValueError(f"{source}: not a regular file; refusing to copy it")
        with open(destination, "xb") as writer:
            shutil.copyfileobj(reader, writer)
            writer.flush()
            os.fsync(writer.fileno())


def _in_folder(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    numbered = sorted(
        (int(match[1]), os.path.join(directory, f"{_PREFIX}-{match[1]}"))
        for match in map(_NUMBERED.match, os.listdir(directory))
        if match
    )
    return [path for _, path in numbered]


def _parse_state(text: str) -> list[str]:
    """The checkpoint names in a state file (TensorFlow's text format), oldest first."""
    latest, every = None, []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _STATE_LINE.fullmatch(line.strip())
        if not match:
            raise ValueError(f"line {number} is not a checkpoint entry")
        if match["key"] == "model_checkpoint_path":
            latest = match["name"]
        elif match["key"] == "all_model_checkpoint_paths":
            every.append(match["name"])
    if latest is None:
        raise ValueError("it names no latest checkpoint")
    return [name for name in every if name != latest] + [latest]


def _write_state(directory: str, paths: list[str]) -> None:
    """Makes `paths` (oldest first) the state file's checkpoints, atomically and durably."""
    names = [os.path.basename(p) for p in paths]
    text = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in names
    )
    state = os.path.join(directory, STATE_FILE)
    temporary = f"{state}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, state)
    fsync_path(directory)


def fsync_path(path: str) -> None:
    """Flushes the file or folder `path` to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delete_checkpoint(path: str) -> None:
    folder, prefix = os.path.split(path)
    for name in os.listdir(folder):
        if name.startswith(prefix + "."):
            os.remove(os.path.join(folder, name))


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return message.strip().splitlines()[0] if message.strip() else type(error).__name__
