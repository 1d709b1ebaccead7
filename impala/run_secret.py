"""The run secret: a random token every RPC between an actor and its learner carries.

A launcher creates it in the run folder (`<run folder>/secret`, readable by its owner only) before
starting any process and hands every process its path (`--secret_file`), never the token itself,
so that neither `ps` nor a shell history shows it. A learner refuses every call that does not
carry it (see `impala/transport/authentication.py`). To rotate it, stop the run, write a new one
(`python -m impala.run_secret new <file> --force`), copy it where the actors read it, and start
the run again: it resumes from its latest checkpoint.

This module needs only the standard library: launchers use it too.

  python -m impala.run_secret new runs/pong/secret           # create (refuses to overwrite)
  python -m impala.run_secret new runs/pong/secret --force   # rotate
  python -m impala.run_secret check runs/pong/secret         # is it usable?
"""

from __future__ import annotations

import os
import secrets
import sys

from impala import owner_only

FILE_NAME = "secret"  # in the run folder
# 32 random bytes, written as 64 hexadecimal digits: every secret has this length.
NUM_BYTES = 32
LENGTH = 2 * NUM_BYTES
_HEX_DIGITS = frozenset("0123456789abcdef")


class SecretError(ValueError):
    """A secret file that cannot be used; the message names the file and says why."""


def path_in(run_dir: str) -> str:
    """Where a run folder keeps its secret."""
    return os.path.join(run_dir, FILE_NAME)


def create(path: str, *, overwrite: bool = False) -> str:
    """Writes a new secret to `path` (owner-only, written in full before it appears).

    Args:
      path: the file to write; its folder must exist.
      overwrite: replace an existing secret (rotation); otherwise an existing file is an error.

    Returns:
      The new secret.

    Raises:
      SecretError: `path` exists (and not `overwrite`) or cannot be written.
    """
    token = secrets.token_hex(NUM_BYTES)
    _write(path, token, overwrite)
    return token


def write(path: str, token: str) -> None:
    """Writes the secret `token` (another file's, e.g. a launcher copying it) to `path`,
    replacing what is there, owner-only and in full before it appears.

    Raises:
      SecretError: `token` is not a secret, or `path` cannot be written.
    """
    if len(token) != LENGTH or not set(token) <= _HEX_DIGITS:
        raise SecretError(f"{path}: refusing to write something that is not a run secret")
    _write(path, token, overwrite=True)


def _write(path: str, token: str, overwrite: bool) -> None:
    try:
        owner_only.write(path, (token + "\n").encode(), overwrite=overwrite)
    except FileExistsError:
        raise SecretError(
            f"{path}: a secret exists already (rotate it with "
            f"`python -m impala.run_secret new {path} --force`)"
        ) from None
    except OSError as error:
        raise SecretError(f"{path}: cannot write the run secret: {error.strerror}") from None


def ensure(path: str) -> tuple[str, bool]:
    """The secret at `path`, created first if there is none. Returns (secret, created)."""
    try:
        return create(path), True
    except SecretError:
        if not os.path.lexists(path):
            raise
    return load(path), False


def load(path: str) -> str:
    """Reads and checks the secret at `path`.

    Raises:
      SecretError: naming the file and what is wrong: missing, not a regular file, owned by
        someone else, readable or writable by others (as ssh refuses such keys), or not a secret.
    """
    try:
        content = owner_only.read(path, LENGTH + 2)
    except FileNotFoundError:
        raise SecretError(
            f"{path}: no run secret here; the learner's run folder has it (copy it, owner-only), "
            f"or create one with `python -m impala.run_secret new {path}`"
        ) from None
    except owner_only.UnsafeFileError as error:
        raise SecretError(f"{path}: the run secret {error}") from None
    except OSError as error:
        raise SecretError(f"{path}: cannot read the run secret: {error.strerror}") from None
    token = content.decode("ascii", errors="replace").strip()
    if len(token) != LENGTH or not set(token) <= _HEX_DIGITS:
        raise SecretError(
            f"{path}: not a run secret ({LENGTH} hexadecimal digits expected); write a new one "
            f"with `python -m impala.run_secret new {path} --force`"
        )
    return token


def main(argv: list[str]) -> int:
    usage = "usage: python -m impala.run_secret {new FILE [--force] | check FILE}"
    args = [a for a in argv[1:] if a != "--force"]
    force = "--force" in argv[1:]
    if len(args) != 2 or args[0] not in ("new", "check") or (force and args[0] != "new"):
        print(usage, file=sys.stderr)
        return 2
    command, path = args
    try:
        if command == "new":
            create(path, overwrite=force)
            print(f"{path}: new run secret written (owner-only)")
        else:
            load(path)
            print(f"{path}: a usable run secret")
    except SecretError as error:
        print(f"run_secret: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
