"""Files that only their owner may read: the run secret (`run_secret.py`) and the TLS bundle
(`run_tls.py`). Written owner-only from the first byte and whole before they appear; read only
when they are the owner's own regular file that nobody else can read or change.

This module needs only the standard library: launchers use it too.
"""

from __future__ import annotations

import errno
import os
import stat


class UnsafeFileError(ValueError):
    """A file that is not its owner's alone; the message says why, after "the file"."""


def write(path: str, data: bytes, *, overwrite: bool) -> None:
    """Writes `data` to `path`, owner-only, in full before it appears.

    Raises:
      FileExistsError: `path` exists and not `overwrite`.
      OSError: `path` cannot be written.
    """
    folder = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        # Owner-only from its first byte: O_EXCL never follows a link someone planted.
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)  # fails if `path` exists, whoever made it meanwhile
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def read(path: str, max_bytes: int) -> bytes:
    """The first `max_bytes` bytes of the file at `path`, once it is shown to be safe.

    Raises:
      FileNotFoundError: there is no file at `path`.
      UnsafeFileError: it is a link, not a regular file, another user's, or open to others.
      OSError: it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFileError("is a link; put the file itself here") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError("must be a regular file")
        if info.st_uid != os.getuid():
            raise UnsafeFileError(f"belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise UnsafeFileError(
                f"is open to other users (mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
            )
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)
