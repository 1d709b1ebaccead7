"""The learning benchmark's configurations, and how a run's settings compare with its
configuration's: what `benchmarks/learning.py` trains and what it says a run changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from impala import configs, run_folder
from impala.envs import catch


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A named learning benchmark.

    Attributes:
      flags: experiment.py / run_local.py flags on top of the make-train defaults.
      frames: the default frame budget.
      thresholds: returns whose first crossing (by the moving mean) is reported, in frames.
    """

    flags: tuple[str, ...]
    frames: float
    thresholds: tuple[float, ...]


# A checkpoint a million frames (about 20 MB each with the Nature network) to follow the policy
# along the run or branch the run from (`--branch_from`).
_MILESTONES = "--keep_checkpoint_every_frames=1e6"

BENCHMARKS = {
    # `make train ARGS="--total_environment_frames=10e6"`: the default learning-rate schedule
    # scales with that budget, the rate held to 8.5M and falling to 0 over the last 1.5M frames.
    "pong": Benchmark(
        ("--level_name=PongNoFrameskip-v4", _MILESTONES),
        10e6,
        (-15.0, 0.0, 10.0, 18.0),
    ),
    "breakout": Benchmark(
        ("--level_name=BreakoutNoFrameskip-v4", _MILESTONES),
        10e6,
        (10.0, 50.0, 100.0),
    ),
    # The Catch learning test (tests/e2e/test_benchmarks.py runs this): small batches, Adam.
    "catch": Benchmark(catch.QUICK_LEARNING_FLAGS, 60e3, (0.0, 0.5, 0.9)),
}


def load_experiment_flags():
    """experiment.py's flags (`impala.flags`), imported when first needed: importing them
    defines them, and a command with flags of its own that reads only the table above
    (`benchmarks.peer`, whose --num_epochs is also an experiment.py flag's other name) must not
    define them twice."""
    from impala import flags

    return flags


# experiment.py flags that say where a run is and which process plays which part (the launchers'
# per-process ones, and --mode=test's checkpoint), not how it learns; `total_environment_frames`
# is the budget, which `--frames` gives.
_PLACEMENT_FLAGS = run_folder.PER_PROCESS_FLAGS | {"checkpoint", "total_environment_frames"}


def configuration_values(
    benchmark: Benchmark, preset: str = "", given: Mapping[str, object] | None = None
) -> dict[str, object]:
    """The experiment.py flag values a run of `benchmark` gets from no `--extra` but `preset`:
    `make train`'s defaults (or the preset's), under the configuration's own flags; with `given`
    (flag name -> parsed value), those too, as if given on the command line, and the defaults
    that follow them (`configs.implied_defaults`) as they follow them."""
    experiment_flags = load_experiment_flags()
    given = dict(given or {})
    values = {
        name: experiment_flags.unset_value(name, preset) for name in experiment_flags.flag_values()
    }
    fixed = set(experiment_flags.PRESETS.get(preset, {}))
    for flag in benchmark.flags:
        name, _, text = flag.removeprefix("--").partition("=")
        values[name] = experiment_flags.FLAGS[name].parser.parse(text)
        fixed.add(name)
    values.update(given)
    fixed.update(given)
    return {**values, **configs.implied_defaults(values, fixed)}


def changed_settings(benchmark: Benchmark, saved: dict) -> dict[str, object]:
    """The flags of a run (its flags.json, `saved`) whose value is not the one the
    configuration gives with no `--extra` and no preset: what the run changed, as saved. A flag
    whose default follows others (`configs.IMPLIED_FLAGS`) is a change only where its value is
    not the one the run's other changes imply: `--replay_parameters=` alone changes one setting,
    though the run trains with 6 passes over each batch where the configuration has 3."""
    experiment_flags = load_experiment_flags()
    base = configuration_values(benchmark)
    changed, parsed = {}, {}
    for name, value in sorted(saved.items()):
        if name in _PLACEMENT_FLAGS or name not in base:
            continue
        try:
            parsed[name] = experiment_flags.parse_saved(name, value)
        except ValueError:
            changed[name] = value  # a value no process would take: not the configuration's
            continue
        if parsed[name] != base[name]:
            changed[name] = value
    implied = set(configs.IMPLIED_FLAGS) & set(parsed)
    given = {name: parsed[name] for name in changed if name in parsed and name not in implied}
    kept = configs.implied_to_keep(
        parsed, given, lambda values: configuration_values(benchmark, given=values)
    )
    changed = {name: value for name, value in changed.items() if name not in implied}
    return dict(sorted({**changed, **{name: saved[name] for name in kept}}.items()))


def repeated_values(benchmark: Benchmark, config: str, extra: list[str]) -> list[str]:
    """The `--extra` flags that give an experiment.py flag the value the configuration named
    `config` (with the `--preset` among them, if any) gives it already, each as a line saying
    so: a run meant to try a setting that changes nothing is one of the configuration's own.
    So is one that gives a flag the value the other `--extra` flags imply for it
    (`--batch_reuse=6` beside `--replay_parameters=`). Of a flag given twice, the last value
    is the one the run takes, and the one looked at."""
    experiment_flags = load_experiment_flags()
    settings = experiment_flags.flag_values()
    parsed = {}
    for flag in extra:
        name, equals, text = flag.removeprefix("--").partition("=")
        if not equals and name not in experiment_flags.FLAGS and name.startswith("no"):
            name, text = name[2:], "false"  # absl's --noname
        elif not equals:
            text = "true"
        if name in settings and name not in _PLACEMENT_FLAGS:
            parsed[name] = (flag, text)
    preset = parsed.get("preset", (None, ""))[1]
    preset = preset if preset in experiment_flags.PRESETS else ""
    values = {}
    for name, (_flag, text) in parsed.items():
        try:
            values[name] = experiment_flags.FLAGS[name].parser.parse(text)
        except (ValueError, TypeError, OverflowError):
            continue  # experiment.py names it in its own one-line error
    repeated = []
    for name, value in values.items():
        # What the run would have without this flag, with the others: a default that follows
        # them (--batch_reuse=6 beside --replay_parameters=) is one the run has already.
        others = {other: v for other, v in values.items() if other not in (name, "preset")}
        if value != configuration_values(benchmark, preset, others)[name]:
            continue
        flag, shown = parsed[name][0], experiment_flags.as_text(value)
        if value == configuration_values(benchmark, preset)[name]:
            has = f"the value --config={config} already has ({shown})"
        else:
            has = f"the value the other --extra flags imply ({shown})"
        repeated.append(f"--extra={flag} gives --{name} {has}: this run does not change it")
    return repeated
