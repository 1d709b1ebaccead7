"""A branch of a run: a new run folder that starts from one checkpoint of another run.

  make bench-learning ARGS="--branch_from=runs/pong/checkpoints/ckpt-7178 \\
      --out_dir=runs/pong-e003 --extra=--entropy_cost=0.003"

trains a branch (`benchmarks/learning.py --branch_from`): a setting tried from a point of a run,
beside a control branched from the same checkpoint with the run's own settings. The branch holds
what a resume reads, as the run had it at that checkpoint:
  flags.json               the run's flags (a resume takes them, the flags given over them);
  checkpoints/             that checkpoint alone (weights, optimiser state, frames, training
                           time), as the latest;
  events.out.tfevents.*    the run's event files cut at the checkpoint's frames, so that the
                           branch's learning curve goes on from the run's at that point;
  branch.json              the checkpoint, its frames and the path it was given as;
and not the run's secret: the launcher makes the branch one of its own. The run is only read,
and only its regular files (a symlink in it is refused, not followed). Its flags.json holds the
flags of its latest start, which may be later than the checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import tempfile
from typing import Any

import tensorflow as tf
from google.protobuf import message

from impala import run_folder
from impala.curves import events as run_events
from impala.evaluation import restore
from impala.learner import checkpoint_folder


@dataclasses.dataclass(frozen=True)
class Source:
    """The checkpoint a branch starts from."""

    given: str  # the path it was named by: a checkpoint or a run folder (its latest then)
    checkpoint: str  # its path, e.g. runs/pong/checkpoints/ckpt-7178
    run_dir: str  # the run folder holding it
    frames: int  # the frames the run had trained when it was written
    flags: dict[str, Any]  # the run's flags.json


def source(checkpoint: str) -> Source:
    """The checkpoint that `checkpoint` names (a run folder: its latest) and its run.

    Raises:
      ValueError: one line, if it names no checkpoint, or one outside a run folder.
    """
    try:
        path = restore.resolve_checkpoint(checkpoint)
    except ValueError as error:
        raise ValueError(str(error).removeprefix("--checkpoint=")) from None
    run_dir = restore.run_folder_of(path)
    flags = run_folder.read_flags(run_dir)
    if flags is None:
        raise ValueError(f"{path}: its folder {run_dir} has no {run_folder.FLAGS_FILE}")
    try:
        frames = checkpoint_folder.read_counter(path, "frames")
    except (tf.errors.OpError, ValueError, IndexError, TypeError) as error:  # IndexError: short
        reason = checkpoint_folder.first_line(error)
        raise ValueError(f"{path}: not a checkpoint of this project ({reason})") from None
    return Source(os.path.abspath(checkpoint), os.path.abspath(path), run_dir, frames, flags)


def branch(start: Source, run_dir: str) -> None:
    """Makes the new run folder `run_dir` from `start`, all at once: until it is complete it is
    built in a hidden folder beside it, removed if anything fails.

    Raises:
      ValueError: one line, if `run_dir` exists already.
    """
    run_dir = os.path.abspath(run_dir)
    if os.path.lexists(run_dir):
        raise ValueError(f"{run_dir} exists; a branch starts a new run folder")
    if os.path.commonpath([run_dir, start.run_dir]) == start.run_dir:
        raise ValueError(f"{run_dir} is inside the run it branches, {start.run_dir}")
    parent = os.path.dirname(run_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(run_dir)}.", dir=parent)
    try:
        # As a run folder a launcher makes (mkdtemp makes it private).
        os.chmod(staging, 0o777 & ~run_folder.current_umask())
        checkpoint_folder.copy_regular_file(
            os.path.join(start.run_dir, run_folder.FLAGS_FILE),
            os.path.join(staging, run_folder.FLAGS_FILE),
        )
        checkpoint_folder.copy_checkpoint(
            start.checkpoint, os.path.join(staging, run_folder.CHECKPOINTS)
        )
        for events in run_events.event_files(start.run_dir):
            copy_events(events, os.path.join(staging, os.path.basename(events)), start.frames)
        record = {"checkpoint": start.checkpoint, "frames": start.frames, "given": start.given}
        run_folder.write_json(os.path.join(staging, run_folder.BRANCH_FILE), record)
        checkpoint_folder.fsync_path(os.path.join(staging, run_folder.BRANCH_FILE))
        checkpoint_folder.fsync_path(staging)
        os.rename(staging, run_dir)
        checkpoint_folder.fsync_path(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def copy_events(path: str, out: str, last_step: int) -> int:
    """Copies the records of event file `path` up to step `last_step` (the summaries' step is
    the frames trained) into `out`, unchanged and on disk; returns how many. A damaged last
    record (a learner killed mid-write) ends the copy, as `plot.py` ends its reading there.

    Raises:
      ValueError: one line naming `path`, if it is not a regular file or cannot be read.
    """
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise ValueError(f"{path}: not a regular file; refusing to copy it")
    kept = 0
    with tf.io.TFRecordWriter(out) as writer:
        try:
            for record in tf.data.TFRecordDataset(path):
                raw = record.numpy()
                if tf.compat.v1.Event.FromString(raw).step <= last_step:
                    writer.write(raw)
                    kept += 1
        except tf.errors.DataLossError:
            pass
        except (tf.errors.OpError, message.DecodeError) as error:
            reason = checkpoint_folder.first_line(error)
            raise ValueError(f"{path}: cannot be read as TensorBoard events ({reason})") from None
    checkpoint_folder.fsync_path(out)
    return kept
