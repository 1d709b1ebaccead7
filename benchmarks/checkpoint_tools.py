"""What the scripts that play a checkpoint share: restoring it from the path they are given,
and their one-line errors."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from absl import flags

if TYPE_CHECKING:
    import networks


def restore_checkpoint(checkpoint: str) -> tuple[str, dict[str, Any], networks.Agent]:
    """The checkpoint a run folder, checkpoints folder or checkpoint path names, what it was
    trained on, and its agent; a one-line ValueError if there is none or it is not one."""
    # TensorFlow loads here, not when the script starts: a bad flag is refused before it.
    from impala.evaluation import restore

    path = restore.resolve_checkpoint(checkpoint)
    identity = restore.read_identity(path)
    return path, identity, restore.restore_agent(path, identity)


@contextlib.contextmanager
def one_line_errors(script: str) -> Iterator[None]:
    """Turns a ValueError into `<script>: error: ...` on stderr and exit status 1."""
    try:
        yield
    except ValueError as error:
        # The checkpoint is the script's argument, not experiment.py's --checkpoint flag.
        message = str(error).removeprefix("--checkpoint=")
        print(f"{script}: error: {message}", file=sys.stderr)
        sys.exit(1)


def require_probability(flag: str) -> None:
    """Makes absl refuse a value of the float flag `flag` outside [0, 1), in its one line."""
    flags.register_validator(
        flag, lambda value: 0 <= value < 1, message="must be a number in [0, 1)"
    )
