"""Every flag of experiment.py, the presets, and the flag values a run records and forwards.

The settings are declared once, as fields of the configs in `impala/configs/` (name, type,
default, allowed values, help): this module defines one flag per declared field, plus the few
that choose what the process does (--mode, --job_name, --actor_hosts, --preset), and builds the
configs back from the flags (`config_from_flags`).

TensorFlow-free, so that launchers (run_local.py, the frontend) can read, check and forward a
run's flags without the ML stack. Defining the flags is importing this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from absl import flags

from impala import configs
from impala.configs.declare import declared, flag_name, whole_frames

FLAGS = flags.FLAGS
PRESETS = configs.PRESETS

flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "test"],
    "train: run the role given by --job_name. test: load a checkpoint (--checkpoint) and play "
    "--test_num_episodes games with it, printing statistics of the real game score.",
)
flags.DEFINE_enum(
    "job_name",
    "local",
    ["learner", "actor", "local"],
    "Role of this process. learner: trains, serving its actors (run under mpirun for "
    "several). actor: plays and streams unrolls to learner task mod L. local: actor and "
    "learner in this one process.",
)
flags.DEFINE_list(
    "actor_hosts",
    [],
    "Host of each actor, in task order (used by launchers; an actor checks its --task is in "
    "range when given).",
)
flags.DEFINE_enum(
    "preset",
    "",
    ["", *PRESETS],
    "A named set of hyperparameters for the flags not given explicitly. paper: the IMPALA "
    "paper's shallow network and Atari values (RMSProp, batch 32, one step per batch, lambda 1, "
    "V-trace's policy gradient).",
)


def _define(field: dataclasses.Field, field_type: Any) -> None:
    """Defines the flag of a declared config field, of the field's type and default."""
    name, default, help = flag_name(field), field.default, field.metadata["help"]
    choices = field.metadata["choices"]
    if field.metadata["frames"]:
        flags.DEFINE_float(name, float(default), help)
    elif choices:
        flags.DEFINE_enum(name, default, list(choices), help)
    elif field_type is bool:
        flags.DEFINE_bool(name, default, help)
    elif field_type is int:
        flags.DEFINE_integer(name, default, help)
    elif field_type is float:
        flags.DEFINE_float(name, default, help)
    elif field_type is str:
        flags.DEFINE_string(name, default, help)
    elif typing.get_origin(field_type) is tuple:
        flags.DEFINE_list(name, list(default), help)
    else:
        raise TypeError(f"{field.name}: no flag type for {field_type}")


# Where flag aliases are registered (no such module): `flag_values` leaves them out.
_ALIASES_MODULE = "impala.flags.aliases"


def _define_declared_flags() -> None:
    """One flag per declared field of `configs.DECLARING`; a field that several configs inherit
    is one flag."""
    defined: dict[str, dataclasses.Field] = {}
    for config_class in configs.DECLARING:
        types = typing.get_type_hints(config_class)
        for field in declared(config_class):
            name = flag_name(field)
            if name in defined:
                if defined[name] is not field:
                    raise TypeError(f"--{name} is declared twice")
                continue
            _define(field, types[field.name])
            defined[name] = field
            for alias in field.metadata["aliases"]:
                # Registered under another module's name: a run's flags.json and the flags
                # launchers forward hold the flag's own name only (the alias sets its value).
                flags.DEFINE_alias(alias, name, module_name=_ALIASES_MODULE)


_define_declared_flags()


def config_from_flags(config_class: type, **given: Any) -> Any:
    """`config_class` with its declared fields from their flags, and `given` for the others
    (or in a flag's place).

    Raises:
      ValueError: the one-line error of a bad value, naming its flag.
    """
    values = {}
    for field in declared(config_class):
        if field.name not in given:
            values[field.name] = _field_value(field)
    return config_class(**values, **given)


def _field_value(field: dataclasses.Field) -> Any:
    """A declared field's value from its flag: a frame count as an int, a list as a tuple."""
    name = flag_name(field)
    value = FLAGS[name].value
    if field.metadata["frames"]:
        return whole_frames(name, value)
    if isinstance(value, list):
        return tuple(value)
    return value


def apply_preset(single_process: bool = False) -> None:
    """Gives the flags of `--preset` their preset values, then those whose default follows other
    flags their implied value (`configs.implied_defaults`; `single_process` for a process that
    trains alone, --job_name=local), unless given on the command line."""
    preset = PRESETS.get(FLAGS.preset, {})
    for name, value in preset.items():
        if not FLAGS[name].present:
            FLAGS[name].value = value
    own = FLAGS.get_flags_for_module(sys.modules[__name__])
    _imply(set(preset) | {flag.name for flag in own if flag.present}, single_process)


def _imply(fixed: set[str], single_process: bool = False) -> None:
    """Sets the flags whose default follows other flags, except those in `fixed` (given, or set
    by the preset), from this module's flags' values."""
    own = FLAGS.get_flags_for_module(sys.modules[__name__])
    values = {flag.name: flag.value for flag in own}
    implied = configs.implied_defaults(values, fixed, single_process=single_process)
    for name, value in implied.items():
        FLAGS[name].value = value


@contextlib.contextmanager
def as_forwarded(forwarded: Mapping[str, object]) -> Iterator[None]:
    """Gives this module's flags, until the block ends, the values a run's processes get when a
    launcher passes on `forwarded` (flag name -> value): those, then --preset's, then the
    defaults (those that follow other flags as they follow them). For launchers, to check those
    values as the processes will."""
    own = FLAGS.get_flags_for_module(sys.modules[__name__])
    kept = {flag.name: flag.value for flag in own}
    preset = PRESETS.get(forwarded.get("preset", FLAGS["preset"].default), {})
    try:
        for flag in own:
            flag.value = forwarded.get(flag.name, preset.get(flag.name, flag.default))
        _imply(set(forwarded) | set(preset))
        yield
    finally:
        for flag in own:
            flag.value = kept[flag.name]


def as_text(value: object) -> str:
    """`value` as a launcher writes it in `--name=<text>`."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_saved(name: str, value: object) -> object:
    """The value a process gets for this file's flag `name` when a launcher forwards `value`
    (say, from a run's flags.json, which anyone may have edited) as `--name=<as_text(value)>`.

    Raises:
      ValueError: one line naming the flag, if its parser refuses the value.
    """
    if value is None:
        raise ValueError(f"{name}=null: expected a value")
    try:
        return FLAGS[name].parser.parse(as_text(value))
    except (ValueError, TypeError, OverflowError) as error:
        reason = " ".join(str(error).split())
        raise ValueError(f"{name}={value!r}: {reason}") from None


def unset_value(name: str, preset: str) -> object:
    """The value a process gets for flag `name` when it is not given: `preset`'s, else the
    default."""
    return PRESETS.get(preset, {}).get(name, FLAGS[name].default)


def flag_values(only_given: bool = False) -> dict:
    """The flags this file defines, with their values: all of them (what a run folder's
    flags.json holds), or only those given on the command line (what launchers forward)."""
    return {
        flag.name: flag.value
        for flag in FLAGS.get_flags_for_module(sys.modules[__name__])
        if flag.present or not only_given
    }
