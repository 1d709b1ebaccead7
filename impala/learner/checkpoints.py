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
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
from typing import Any

import numpy as np
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


class NotFiniteError(FloatingPointError):
    """The state to checkpoint holds values that are not finite.

    Not a ValueError: a learner that stops on it is started again by its launcher, and resumes
    from the last checkpoint that is finite.
    """


STATE_FILE = "checkpoint"  # TensorFlow's name: tf.train.latest_checkpoint reads it too
VERSIONS_FILE = "published_version"  # the highest weight version that may have been published
UNUSABLE = "unusable"  # the folder checkpoints a restore passed over are set aside in
_PREFIX = "ckpt"
_NUMBERED = re.compile(rf"^{_PREFIX}-(\d+)\.index$")
# Any file or folder of a checkpoint, complete or not: its name holds the version it saved.
_OF_VERSION = re.compile(rf"^{_PREFIX}-(\d+)[._]")
# What a save killed before it ended leaves: TensorFlow's folder of the checkpoint's shards, its
# temporary files, and the temporaries of this module's own files.
_INTERRUPTED_FOLDER = re.compile(rf"^{_PREFIX}-\d+_temp$")
_INTERRUPTED_FILE = re.compile(
    rf"^({_PREFIX}-\d+\.(index|data-\d+-of-\d+)\.tempstate\d+"
    rf"|({STATE_FILE}|{VERSIONS_FILE})\.\d+\.tmp)$"
)
# Versions reserved at a time in the versions file: it is rewritten once every so many steps.
_VERSIONS_AHEAD = 100
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
        except _READ_ERRORS as error:
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
            _write_state(self._directory, [p for p in listed_paths if p not in paths])
        except OSError as error:
            report(f"cannot set aside {', '.join(paths)} ({first_line(error)})")
            return
        names = ", ".join(os.path.basename(p) for p in paths)
        report(f"set aside {names} in {folder}: no longer among the kept checkpoints")

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
        highest = -1
        for folder in (self._directory, os.path.join(self._directory, UNUSABLE)):
            if os.path.isdir(folder):
                for match in map(_OF_VERSION.match, os.listdir(folder)):
                    if match:
                        highest = max(highest, int(match[1]))
        path = os.path.join(self._directory, VERSIONS_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                highest = max(highest, int(f.read()))
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError, ValueError) as error:
            report(f"{path} cannot be read ({first_line(error)}); going by the checkpoints' names")
        return highest

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
        _write_durably(self._directory, VERSIONS_FILE, f"{version}\n")
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
    _write_durably(directory, STATE_FILE, text)


def _write_durably(directory: str, name: str, text: str) -> None:
    """Replaces file `name` in `directory` with `text`: a temporary file, flushed to disk,
    renamed over it, the folder flushed again."""
    path = os.path.join(directory, name)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    fsync_path(directory)


def remove_interrupted_saves(directory: str, report: Callable[[str], None]) -> list[str]:
    """Removes from `directory` what saves killed before they ended left there; returns the
    names removed.

    Only names saves leave (`ckpt-<N>_temp` folders, TensorFlow's `.tempstate` files of a
    checkpoint, the temporaries of the state and versions files), and only real folders and
    files: a link of such a name is left alone, and nothing inside a folder is followed.
    What cannot be removed is reported.
    """
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) and _INTERRUPTED_FOLDER.match(name):
                shutil.rmtree(path)  # removes links inside, never what they point to
            elif stat.S_ISREG(mode) and _INTERRUPTED_FILE.match(name):
                os.remove(path)
            else:
                continue
        except OSError as error:
            report(f"cannot remove {path}, left by an interrupted save ({first_line(error)})")
            continue
        removed.append(name)
    return removed


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
