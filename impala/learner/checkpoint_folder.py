"""A folder of checkpoints on disk: the state file that names the kept ones, durable writes, what
interrupted saves leave behind, copies, and one checkpoint's identity and counters.

The state file (`checkpoint`, TensorFlow's name and text format, so that
`tf.train.latest_checkpoint` reads it too) names the kept checkpoints by their file names in the
folder, the latest last. A name that would reach outside the folder is refused as a state file
that cannot be read: a restore then goes by the checkpoints in the folder, and nothing outside it
is ever read, moved or deleted.
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
from impala.run_folder import fsync_path, write_text

STATE_FILE = "checkpoint"  # TensorFlow's name: tf.train.latest_checkpoint reads it too
VERSIONS_FILE = "published_version"  # the highest weight version that may have been published
UNUSABLE = "unusable"  # the folder checkpoints a restore passed over are set aside in
# Set-aside checkpoints kept there for a look, the newest: a run whose checkpoints keep being
# passed over must not fill its disk with them. The newest holds the highest version set aside,
# which a resumed run goes on above (with the versions file).
KEEP_UNUSABLE = 3
PREFIX = "ckpt"
_IDENTITY_KEY = "identity/.ATTRIBUTES/VARIABLE_VALUE"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)\.index$")
# Any file or folder of a checkpoint, complete or not: its name holds the version it saved.
OF_VERSION = re.compile(rf"^{PREFIX}-(\d+)[._]")
# What a save killed before it ended leaves: TensorFlow's folder of the checkpoint's shards, its
# temporary files, and the temporaries of this folder's own files (`run_folder.write_text`'s
# `.<name>.<random>.tmp`; `<name>.<pid>.tmp` before 2026-12-07), PBT's state file's too.
_INTERRUPTED_FOLDER = re.compile(rf"^{PREFIX}-\d+_temp$")
_OWN_FILES = rf"({STATE_FILE}|{VERSIONS_FILE}|pbt_state\.json)"
_INTERRUPTED_FILE = re.compile(
    rf"^({PREFIX}-\d+\.(index|data-\d+-of-\d+)\.tempstate\d+"
    rf"|{_OWN_FILES}\.\d+\.tmp|\.{_OWN_FILES}\.[a-z0-9_]+\.tmp)$"
)
# A line of the state file: the checkpoints' names (TensorFlow writes timestamps too).
_STATE_LINE = re.compile(
    r'(?P<key>model_checkpoint_path|all_model_checkpoint_paths): "(?P<name>[^"]+)"'
    r"|(all_model_checkpoint_timestamps|last_preserved_timestamp): [0-9.e+-]+"
)
_MAX_STATE_BYTES = 1 << 20  # a state file names a few checkpoints, in a few hundred bytes
# What reading a damaged checkpoint raises: a short or missing file, a bad CRC, garbage.
READ_ERRORS = (
    # DataLossError, NotFoundError, OutOfRangeError, InvalidArgumentError, ..., and OpError
    # itself: what the counter reader raises on a bad index ("block checksum mismatch").
    tf.errors.OpError,
    AssertionError,
    ValueError,
    IndexError,  # TensorFlow's checkpoint reader on a short file: "Read less bytes than requested"
    TypeError,  # a counter that is no number
    OSError,
)


def read_identity(path: str) -> dict[str, Any]:
    """What the checkpoint at `path` was written for: its environment and network.

    Args:
      path: one checkpoint, e.g. `runs/pong/checkpoints/ckpt-25`.

    Returns:
      The identity a `Checkpointer` saved (`level_name`, `agent_name`, `num_actions`, ...).

    Raises:
      One of `READ_ERRORS`: the checkpoint cannot be read, has no identity (another program's),
        or one that is not a JSON object.
    """
    saved = tf.train.load_variable(path, _IDENTITY_KEY)
    identity = run_identity.decode(saved)
    if not isinstance(identity, dict):
        raise ValueError(f"its identity is a JSON {type(identity).__name__}, not an object")
    return identity


def read_counter(path: str, name: str) -> int:
    """The counter `name` ("frames" or "version") saved in the checkpoint at `path`."""
    return int(tf.train.load_variable(path, f"{name}/.ATTRIBUTES/VARIABLE_VALUE"))


def path_of(directory: str, version: int) -> str:
    """The checkpoint of weight `version` in `directory`."""
    return os.path.join(directory, f"{PREFIX}-{version}")


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
        names = _parse_state(_read_state(state))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        found = _in_folder(directory)
        return found, (
            f"{state} cannot be read ({first_line(error)}); using the {len(found)} "
            f"checkpoint(s) in {directory}"
        )
    return [os.path.join(directory, name) for name in names], None


def versions_in(directory: str) -> list[int]:
    """The versions of every checkpoint file or folder in `directory`, complete or not."""
    if not os.path.isdir(directory):
        return []
    return [int(match[1]) for match in map(OF_VERSION.match, os.listdir(directory)) if match]


def _in_folder(directory: str) -> list[str]:
    if not os.path.isdir(directory):
        return []
    numbered = sorted(
        (int(match[1]), path_of(directory, int(match[1])))
        for match in map(_NUMBERED.match, os.listdir(directory))
        if match
    )
    return [path for _, path in numbered]


def _read_state(path: str) -> str:
    """The state file's text, if it is a regular file of a state file's size."""
    if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would be read forever
        raise ValueError("not a regular file")
    with open(path, "rb") as f:
        data = f.read(_MAX_STATE_BYTES + 1)
    if len(data) > _MAX_STATE_BYTES:
        raise ValueError(f"larger than {_MAX_STATE_BYTES >> 10} KiB")
    return data.decode("utf-8")


def _parse_state(text: str) -> list[str]:
    """The checkpoint names in a state file (TensorFlow's text format), oldest first."""
    latest, every = None, []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _STATE_LINE.fullmatch(line.strip())
        if not match:
            raise ValueError(f"line {number} is not a checkpoint entry")
        name = match["name"]
        if name is not None and (name in (".", "..") or "/" in name or "\\" in name):
            raise ValueError(f"line {number} names {name!r}, not a checkpoint in this folder")
        if match["key"] == "model_checkpoint_path":
            latest = name
        elif match["key"] == "all_model_checkpoint_paths":
            every.append(name)
    if latest is None:
        raise ValueError("it names no latest checkpoint")
    return [name for name in every if name != latest] + [latest]


def write_state(directory: str, paths: list[str]) -> None:
    """Makes `paths` (oldest first) the state file's checkpoints, atomically and durably."""
    names = [os.path.basename(p) for p in paths]
    text = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in names
    )
    write_durably(directory, STATE_FILE, text)


def write_durably(directory: str, name: str, text: str) -> None:
    """Replaces file `name` in `directory` with `text`: a new temporary file, flushed to disk,
    renamed over it, the folder flushed again (`run_folder.write_text`)."""
    write_text(os.path.join(directory, name), text, durable=True)


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
    write_state(directory, [copy])
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


def prune_unusable(folder: str, report: Callable[[str], None]) -> list[int]:
    """Removes from `folder` (`unusable/`) the files of every checkpoint but the newest
    `KEEP_UNUSABLE`; returns the versions removed. Only real files and folders are removed, a
    link is left alone; what cannot be removed is reported."""
    versions = sorted(set(versions_in(folder)))
    removed = versions[:-KEEP_UNUSABLE]
    for name in sorted(os.listdir(folder)) if removed else []:
        match = OF_VERSION.match(name)
        if not match or int(match[1]) not in removed:
            continue
        path = os.path.join(folder, name)
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                shutil.rmtree(path)
            elif stat.S_ISREG(mode):
                os.remove(path)
        except OSError as error:
            report(f"cannot remove {path}, an old set-aside checkpoint ({first_line(error)})")
    return removed


def delete_checkpoint(path: str) -> None:
    """Removes the files of checkpoint `path` (`<path>.index`, `<path>.data-...`)."""
    folder, prefix = os.path.split(path)
    for name in os.listdir(folder):
        if name.startswith(prefix + "."):
            os.remove(os.path.join(folder, name))


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return message.strip().splitlines()[0] if message.strip() else type(error).__name__
