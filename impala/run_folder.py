"""The run folder: where everything of one training run lives, and the flags it was started with.

  <logdir>/<experiment>/
    flags.json                 every experiment.py flag of the latest start (rank 0)
    secret                     the run secret (owner-only; `run_secret.py`)
    tls.pem                    with --transport_tls: the run's TLS bundle (owner-only; `run_tls.py`)
    events.out.tfevents.*      TensorBoard summaries (rank 0), one file per start
    checkpoints/               rank 0's checkpoints (`checkpoints.py`), the highest weight
                               version that may have been published (`published_version`),
                               and in `unusable/` checkpoints a restore passed over
    learner_<rank>.json        each learner's closing summary
    learners.log, actor_*.log  each process's output (written by the launchers)
    videos/<checkpoint>/       `experiment.py --mode=test --record_video`
    branch.json                a branch of another run: the checkpoint it started from
                               (`benchmarks/branch.py`)
    policy_<k>/                with --num_policies=N > 1: policy k's flags.json, events,
                               checkpoints/, learner_<rank>.json and logs, as above (the
                               secret and TLS bundle stay in the run folder, for every policy)

`--experiment` names the folder; without it a run gets `<level_name>-<start time>`. Starting again
with an existing run folder resumes from its latest checkpoint. With --private_run_files (the
default) the folder and what the run's processes write in it are owner-only (`keep_private`).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from typing import IO, Any

FLAGS_FILE = "flags.json"
BRANCH_FILE = "branch.json"
CHECKPOINTS = "checkpoints"  # the folder of rank 0's checkpoints
POLICY_PREFIX = "policy_"  # policy k of a run of several lives in <run>/policy_<k>/
# The most a JSON file of the run folder (flags, a branch, PBT's state) may hold: far more than
# this project writes, and little enough to read at once.
MAX_JSON_BYTES = 1 << 20
# How the name of a file being written ends (`.<name>.<random>.tmp`) until it is renamed.
TEMPORARY_SUFFIX = ".tmp"

# Flags that say where and as what a process runs, not how it trains: they may differ between
# the processes of one run and between its starts, and launchers set them for each process.
PER_PROCESS_FLAGS = frozenset(
    {
        "job_name",
        "task",
        "learner_hosts",
        "actor_hosts",
        "logdir",
        "experiment",
        "mode",
        "secret_file",
        "policy",
        "policy_hosts",
        "run_learner_hosts",
    }
)

# Exit codes after which the launchers (run_local.py, the frontend's tmux windows) do not start a
# process of the run again: it finished (0), refused its flags or files (2, experiment.py's code
# for a one-line error: the same start would fail the same way) or was stopped on purpose (130).
FINAL_EXIT_CODES = (0, 2, 130)


def path(logdir: str, experiment: str, policy: int | None = None) -> str:
    """The run folder of run `experiment` under `logdir`, or with `policy` the folder of that
    policy of a run of several (`--num_policies`)."""
    run_dir = os.path.join(logdir, experiment)
    return run_dir if policy is None else policy_path(run_dir, policy)


def policy_path(run_dir: str, policy: int) -> str:
    """The folder of policy `policy` in the folder of a run of several policies."""
    return os.path.join(run_dir, f"{POLICY_PREFIX}{policy}")


def policies_in(run_dir: str) -> list[int]:
    """The policies whose folders `run_dir` holds, in order ([] for a run of one policy)."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    found = []
    for name in names:
        number = name.removeprefix(POLICY_PREFIX)
        if (
            name.startswith(POLICY_PREFIX)
            and number.isascii()
            and number.isdigit()
            and str(int(number)) == number
        ):
            found.append(int(number))
    return sorted(found)


def default_name(level_name: str, now: datetime.datetime | None = None) -> str:
    """`<level_name>-<YYYYmmdd-HHMMSS>`, with '/' (as in `ALE/Pong-v5`) made safe for a path."""
    now = now or datetime.datetime.now()
    return f"{level_name.replace('/', '_')}-{now:%Y%m%d-%H%M%S}"


def check_name(experiment: str) -> None:
    """Raises a one-line error unless `experiment` is a plain folder name."""
    if experiment in (".", "..") or "/" in experiment or "\\" in experiment:
        raise ValueError(
            f"--experiment={experiment!r}: must be a folder name (no '/'); the folder goes "
            f"under --logdir"
        )


def read_json(path: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the file at `path`, a file of the run folder that anyone who can write
    there may have put there: it is read only if it is a regular file (a link is not followed, a
    FIFO or device not opened for long) of at most `max_bytes`.

    Raises:
      FileNotFoundError: there is no file at `path`.
      NotADirectoryError: a folder on `path` is a file.
      ValueError: one line naming `path` and what is wrong.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValueError(f"{path}: is a link; this file is never read through one") from None
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
        data = b""
        while len(data) <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror or error})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: more than {max_bytes:,} bytes, not a file this project wrote")
    try:
        return json.loads(data.decode())
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not valid JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    except (ValueError, RecursionError):  # an integer of over 4,300 digits; nesting too deep
        raise ValueError(
            f"{path}: not valid JSON (nested too deeply, or a too long number)"
        ) from None


def read_flags(run_dir: str) -> dict[str, Any] | None:
    """The flags saved in `run_dir`, or None if it has none.

    Raises:
      ValueError: the file exists but is not a JSON object (naming the file).
    """
    path = os.path.join(run_dir, FLAGS_FILE)
    try:
        saved = read_json(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror})") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: expected a JSON object of flag values")
    return saved


def read_branch(run_dir: str) -> dict[str, Any] | None:
    """What `branch.json` says of the checkpoint the run in `run_dir` was branched from
    (`checkpoint`, its `frames`, the `given` path), or None for a run that is not a branch.

    Raises:
      ValueError: the file exists but does not say so (naming the file).
    """
    path = os.path.join(run_dir, BRANCH_FILE)
    try:
        record = read_json(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("checkpoint"), str)
        and isinstance(record.get("given"), str)
        and type(record.get("frames")) is int
    ):
        raise ValueError(f"{path}: expected checkpoint, given and frames")
    return record


def write_flags(run_dir: str, flag_values: Mapping[str, Any]) -> None:
    """Saves `flag_values` as `flags.json`, replacing the previous file only once complete."""
    os.makedirs(run_dir, exist_ok=True)
    write_json(os.path.join(run_dir, FLAGS_FILE), dict(flag_values), sort_keys=True)


def not_plain_absolute(folder: str) -> bool:
    """Whether `folder` is relative or has a '..' part: the frontend writes only where it
    planned to, and its paths have neither (a CSV's paths may not)."""
    return not os.path.isabs(folder) or ".." in folder.split("/")


def unsafe_folder(folder: str) -> str | None:
    """Why another user could change what is written in `folder` (absolute), or None. The path
    is resolved part by part as the kernel does (`resolve`): a symlink met on the way that
    another user owns (they could point it elsewhere), or on its real path, above a link met or
    left by a '..', a folder owned by someone other than root or this user, or writable by
    others without the sticky bit. Group-writable folders are the group's trust, left alone;
    ACLs are not read.

    Raises:
      OSError: a part missing, or too many links.
    """
    if not os.path.isabs(folder):
        return f"{folder} is not an absolute path"
    met, real = resolve(folder)  # a ".." as the kernel takes it: after the link before it
    for path in (*met, real):
        while True:
            status = os.lstat(path)
            if status.st_uid not in (0, os.getuid()):
                kind = "symlink" if stat.S_ISLNK(status.st_mode) else "folder"
                return f"{path}: a {kind} owned by another user"
            writable = status.st_mode & stat.S_IWOTH and not status.st_mode & stat.S_ISVTX
            if writable and not stat.S_ISLNK(status.st_mode):
                return f"{path} is writable by others and not sticky"
            if path == os.path.dirname(path):
                break
            path = os.path.dirname(path)
    return None


# The most links a path may lead through, as Linux's own limit (40).
MAX_LINKS = 40


def resolve(path: str) -> tuple[list[str], str]:
    """What resolving absolute `path` part by part, as the kernel does, goes through: the
    symlinks met (each at a path whose folders are real) and the real folders a '..' leaves,
    and the real path it leads to. Unlike os.path.realpath, it names every link on the way, a
    link reached through another link included: whoever can change any of them can change
    where the path leads.

    Raises:
      OSError: too many links (ELOOP).
    """
    met: list[str] = []
    links = 0
    real = ""  # the real folders resolved so far; "" is the root
    rest = path.split("/")
    rest.reverse()  # a stack: the next part last
    while rest:
        part = rest.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if real:
                met.append(real)
            real = real.rsplit("/", 1)[0]
            continue
        step = f"{real}/{part}"
        if not os.path.islink(step):
            real = step
            continue
        met.append(step)
        links += 1
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        target = os.readlink(step)
        if target.startswith("/"):
            real = ""
        rest.extend(reversed(target.split("/")))
    return met, real or "/"


def nearest_existing(folder: str) -> str:
    """`folder` if it exists (a link counts), else the nearest folder above it that does."""
    while not os.path.lexists(folder) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    return folder


def check_safe(run_dir: str) -> None:
    """Refuses a run folder another user could change (`unsafe_folder`, on the folder or, for
    a new one, on the nearest folder above it that exists): its processes would read back and
    append to files they could plant or swap, such as a `flags.json` that turns the run's
    protections off, or a log that is a link to a file of this user's.

    Raises:
      ValueError: one line, naming the folder and why.
    """
    # The run's processes take a '..' as text (os.path.abspath, TensorFlow's file paths), the
    # kernel after the link before it: a path where the two differ is refused, not checked as
    # one folder and written in another.
    given = os.path.join(os.getcwd(), run_dir)
    folder = os.path.normpath(given)
    if ".." in given.split("/"):
        as_read, as_opened = resolve(folder)[1], resolve(given)[1]
        if as_read != as_opened:
            raise ValueError(
                f"run folder {run_dir}: a '..' after a symlink leads to {as_opened}, not to "
                f"{as_read} as the path reads (give --logdir without it)"
            )
    folder = nearest_existing(folder)
    try:
        why = unsafe_folder(folder)
    except OSError as error:  # a part of it removed or made a dangling link meanwhile
        why = f"{error.filename}: {error.strerror}"
    if why:
        raise ValueError(
            f"run folder {run_dir}: {why}; another user could change what the run reads and "
            "writes there (give --logdir a folder of yours)"
        )


def make_checked(run_dir: str) -> None:
    """Makes the run folder (and the folders above it) if missing, between two `check_safe`s:
    nothing is made where others could change it, and a folder another user made between the
    first check and its making is refused too.

    Raises:
      ValueError: one line, naming the folder and why.
    """
    check_safe(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    check_safe(run_dir)


def current_umask() -> int:
    """The process's umask: from /proc (Linux), else by setting it and setting it back, which
    for an instant gives the other threads' new files no mask."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Masks every permission of group and others: what this process creates is its owner's only.
PRIVATE_UMASK = 0o077


def keep_private() -> None:
    """Makes every folder and file this process (and any it starts) creates from now on
    owner-only: 0700 and 0600, or less if the umask already masked more (--private_run_files)."""
    os.umask(current_umask() | PRIVATE_UMASK)


def make_private(folder: str) -> None:
    """Takes group's and others' permissions off `folder` itself (not what is in it, which no
    one else can then reach): a run folder made before runs were private.

    Raises:
      ValueError: one line, if this user cannot change them (another user's folder).
    """
    mode = os.stat(folder).st_mode
    if not mode & PRIVATE_UMASK:
        return
    try:
        os.chmod(folder, mode & ~PRIVATE_UMASK & 0o7777)
    except PermissionError as error:
        raise ValueError(
            f"{folder}: cannot make it owner-only ({error.strerror}); give "
            "--noprivate_run_files to leave its permissions as they are"
        ) from None


def write_json(path: str, value: Any, sort_keys: bool = False) -> None:
    """Writes `value` as indented JSON to `path`, replacing what was there only once complete."""
    write_text(path, json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")


def write_text(path: str, text: str, durable: bool = False) -> None:
    """Writes `text` to `path`, replacing what was there only once complete (`replacing`)."""
    with replacing(path, durable=durable) as f:
        f.write(text)


@contextlib.contextmanager
def replacing(
    path: str, *, binary: bool = False, owner_only: bool = False, durable: bool = False
) -> Iterator[IO]:
    """A new file to write, which replaces `path` once the block ends without an error; an
    error (a full disk) leaves what was there and no partial file beside it.

    The file has a random name in the same folder (`.<name>.<random>.tmp`) until it is renamed
    over `path`: a link planted at either name is replaced, never written through. It gets the
    permissions `open` would give it, or `owner_only`: its owner's only from its first byte.
    `durable`: flushed to disk before the rename, and the folder after it (a power cut leaves
    the old file or the new).
    """
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(temporary, flags, 0o600 if owner_only else 0o666)
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(temporary, path)
        if durable:
            fsync_path(folder or ".")
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def fsync_path(path: str) -> None:
    """Flushes the file or folder `path` to disk (a folder: the names renamed into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def changed_flags(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Training flags whose value differs from the saved run's, as `--name: old -> new`."""
    return [
        f"--{name}: {saved[name]!r} -> {current[name]!r}"
        for name in sorted(current)
        if name in saved and name not in PER_PROCESS_FLAGS and saved[name] != current[name]
    ]
