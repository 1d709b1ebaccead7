"""Running Sample Factory for `benchmarks.peer` in a process group of its own, which a stop
signals whole and which does not outlive this command."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import time

from benchmarks import peer_results

STOP_GRACE_SECS = 60  # after Ctrl-C's signal, the time Sample Factory has to save and stop
_PROGRESS_SECS = 60
# What Sample Factory's learner logs when no checkpoint could be loaded, and then trains from
# scratch (into the same folder, beside the checkpoints it could not read).
FROM_SCRATCH = "Did not load from checkpoint, starting from scratch"
LOADED = "Loaded experiment state at"  # and this once it has loaded one


class ResumeError(Exception):
    """Sample Factory, asked to resume, could not load its checkpoint: stopped at once."""


def _die_with_parent() -> None:
    """In the child, before exec: Ctrl-C's signal when this command dies, even by SIGKILL, so
    that no Sample Factory process outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def _child_env() -> dict[str, str]:
    """This environment without the project's venv and paths; no network for wandb or the
    Hugging Face hub (neither is used).

    Sample Factory 2.1.1 loads its checkpoints with `torch.load`'s default, which since torch 2.6
    loads weights only and refuses the numpy scalars its checkpoints hold, so a resume trained
    from scratch; `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` gives back the old default. The files it
    loads are the run's own, written by the same command into `--out_dir`.
    """
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(
        PYTHONUNBUFFERED="1",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
    )
    return env


def _signal_group(pgid: int, signum: int) -> bool:
    """Sends `signum` to the process group; False if it has no process left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (one that has exited but was not yet waited
    for by its parent does not)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            return True
    return False


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _log_since(log_path: str, start: int) -> str:
    """What the log gained since byte `start`, as text ('' if it cannot be read)."""
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_sf(argv: list[str], log_path: str, cwd: str, resuming: bool = False) -> tuple[int, bool]:
    """Runs `argv` in a new process group, its output appended to `log_path`, printing its
    progress every minute. SIGINT, SIGTERM and SIGHUP stop the group: Ctrl-C's signal first
    (Sample Factory's learner saves), SIGKILL after `STOP_GRACE_SECS` or at a second signal.
    `resuming`: the run has a checkpoint, so a start from scratch kills the group at once
    (before it saves over the run) and raises ResumeError.

    Returns:
      (exit status, whether a signal stopped it).
    """
    requested: list[float] = []
    start = _log_size(log_path)
    resumed, from_scratch = not resuming, False
    child: subprocess.Popen | None = None

    def stop(signum, frame):
        requested.append(time.monotonic())
        if child is not None:
            _signal_group(child.pid, signal.SIGINT if len(requested) == 1 else signal.SIGKILL)

    previous = {
        signum: signal.signal(signum, stop)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        with open(log_path, "ab") as log:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=_child_env(),
                start_new_session=True,  # its own process group, which a stop signals whole
                preexec_fn=_die_with_parent,
            )
        if requested:  # a signal came before the child existed
            _signal_group(child.pid, signal.SIGINT)
        last_progress = time.monotonic()
        while child.poll() is None:
            time.sleep(1.0)
            if requested and time.monotonic() - requested[0] > STOP_GRACE_SECS:
                _signal_group(child.pid, signal.SIGKILL)
            if not resumed:
                since = _log_since(log_path, start)
                if FROM_SCRATCH in since:
                    from_scratch = True
                    _signal_group(child.pid, signal.SIGKILL)
                    child.wait()
                    break
                resumed = LOADED in since
            if time.monotonic() - last_progress >= _PROGRESS_SECS:
                last_progress = time.monotonic()
                _print_progress(log_path)
        # Its processes stop with it; any left (it was killed) are killed, then waited for.
        deadline = time.monotonic() + 10
        while group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if group_alive(child.pid):
            _signal_group(child.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while group_alive(child.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if from_scratch:
        raise ResumeError(_resume_failure(log_path, start))
    return child.returncode, bool(requested)


def _resume_failure(log_path: str, start: int) -> str:
    """The one-line error of a resume that started from scratch, naming the checkpoint."""
    loading = re.findall(r"Loading state from checkpoint (\S+?)\.\.\.", _log_since(log_path, start))
    which = f" {loading[-1]}" if loading else ""
    return (
        f"Sample Factory could not load its checkpoint{which} and began to train from scratch: "
        f"killed before it saved; its error is in {log_path}. Move that checkpoint aside to "
        "resume from the one before it, or give a new --out_dir"
    )


def tail(path: str, size: int = 1 << 16) -> str:
    """The end of a log, as text."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _print_progress(log_path: str) -> None:
    lines = peer_results.fps_lines(tail(log_path))
    if lines:
        last = lines[-1]
        print(
            f"[peer] {last.frames:,} frames trained, {last.fps_60:,.0f} frames/s over its last "
            f"60 s, {last.samples:,} samples this start",
            flush=True,
        )
