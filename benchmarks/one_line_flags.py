"""absl's flag parsing for the benchmarks' commands, a bad flag answered in one line on stderr
(`<script>: error: flag --x=y: ...`, status 2) instead of absl's usage text."""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import flags


def parser(script: str) -> Callable[[list[str]], list[str]]:
    """The `flags_parser` for `app.run` of the command `script` (its name in the messages)."""

    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as error:
            print(f"{script}: error: {error}", file=sys.stderr)
            sys.exit(2)

    return parse
