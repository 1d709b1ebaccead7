"""A setting declared once: a config dataclass's field, whose metadata carries its flag's help
and the check of its values.

`@config` makes a config class (a frozen dataclass whose fields are given by name), `setting(...)`
one of its declared fields. `impala/flags.py` defines one experiment.py flag per declared field
(its type from the field's, its default the field's), and each config checks its values with
`check_settings(self)` in `__post_init__`, so that a config built in Python and one built from
flags refuse a value with the same one line: `--<flag>=<value>: what is wrong`.

TensorFlow-free and free of absl: launchers and the frontend use it.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any

# Raises the one-line ValueError of a bad value of the flag named by its first argument.
Check = Callable[[str, Any], None]


def setting(
    default: Any,
    help: str,
    *,
    check: Check | None = None,
    choices: Sequence[str] = (),
    flag: str = "",
    frames: bool = False,
    aliases: Sequence[str] = (),
) -> Any:
    """A config field that is also an experiment.py flag.

    Args:
      default: its value when neither the command line nor the caller gives one; a tuple for a
        flag that takes a comma-separated list.
      help: the flag's help: what it does, briefly.
      check: raises the one-line error of a bad value.
      choices: the values allowed (the flag is an enum); checked after `check`.
      flag: the flag's name, where it is not the field's.
      frames: a count of emulator frames: an int field whose flag takes a float, so that 10e6
        is accepted (a whole number only).
      aliases: other names its flag answers to, where users of another system know it by
        another (Sample Factory's --num_epochs for --batch_reuse).
    """
    metadata = {
        "help": help,
        "check": check,
        "choices": tuple(choices),
        "flag": flag,
        "frames": frames,
        "aliases": tuple(aliases),
    }
    return dataclasses.field(default=default, metadata=metadata)


@typing.dataclass_transform(
    frozen_default=True, kw_only_default=True, field_specifiers=(dataclasses.field, setting)
)
def config(cls: type) -> type:
    """Makes `cls` a config: a frozen dataclass whose fields are given by name."""
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


def declared(config_class: type) -> list[dataclasses.Field]:
    """The fields of `config_class` (a dataclass) that are settings, in their order."""
    return [field for field in dataclasses.fields(config_class) if "help" in field.metadata]


def flag_name(field: dataclasses.Field) -> str:
    """The experiment.py flag of a declared field."""
    return field.metadata["flag"] or field.name


def check_value(field: dataclasses.Field, value: Any) -> None:
    """Raises the one-line error of `value` for declared `field`, if it is bad."""
    name = flag_name(field)
    if field.metadata["check"] is not None:
        field.metadata["check"](name, value)
    choices = field.metadata["choices"]
    if choices and value not in choices:
        raise ValueError(f"--{name}={value}: must be one of {', '.join(choices)}")


def check_settings(config: Any) -> None:
    """Raises the one-line error of the first declared field of `config` with a bad value."""
    for field in declared(type(config)):
        check_value(field, getattr(config, field.name))


def check_setting(config_class: type, name: str, value: Any) -> None:
    """Raises the one-line error of `value` for the field `name` of `config_class`."""
    (field,) = [field for field in declared(config_class) if field.name == name]
    check_value(field, value)


# ---- Checks that declarations share. Each message follows `--<flag>=<value>: `.


def rule(ok: Callable[[Any], bool], what: str, show: Callable[[Any], str] = str) -> Check:
    """The check that `ok(value)` holds, else says `what` (e.g. "must be at least 1") of the
    value as `show` writes it (`repr` where a string or a wrong type must show as such)."""

    def check(name: str, value: Any) -> None:
        if not ok(value):
            raise ValueError(f"--{name}={show(value)}: {what}")

    return check


def raising(check_value: Callable[[Any], None]) -> Check:
    """The check `check_value(value)`, which raises its own one-line error."""
    return lambda name, value: check_value(value)


def at_least(minimum: int, note: str = "") -> Check:
    return rule(lambda value: value >= minimum, f"must be at least {minimum}{note}")


def non_negative(note: str = "") -> Check:
    return rule(lambda value: value >= 0, f"must be >= 0{note}")


def finite(positive: bool = False) -> Check:
    """A finite number, > 0 (`positive`) or >= 0; NaN is refused."""
    if positive:
        return rule(lambda value: 0 < value < math.inf, "must be a finite number > 0")
    return rule(lambda value: 0 <= value < math.inf, "must be a finite number >= 0")


def within(low: float, high: float, include_high: bool = True) -> Check:
    """In [low, high], or [low, high) without `include_high`; NaN is refused."""
    if include_high:
        return rule(lambda value: low <= value <= high, f"must be in [{low}, {high}]")
    return rule(lambda value: low <= value < high, f"must be in [{low}, {high})")


def whole_frames(name: str, value: float) -> int:
    """A frame-count flag's value (a float, so that 10e6 is accepted) as a whole number."""
    if not math.isfinite(value) or value != math.floor(value):
        raise ValueError(f"--{name}={value}: must be a finite, whole number of frames")
    return int(value)
