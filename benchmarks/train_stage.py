"""The learner's train stage alone, for several settings in one run, and where its time goes.

  python -m benchmarks.train_stage                          # today's set-up against itself
  python -m benchmarks.train_stage \\
      --variants="batch_reuse=3,num_batches_per_epoch=2;batch_reuse=2,num_batches_per_epoch=4"
  python -m benchmarks.train_stage --variants="compute_dtype=bfloat16"
  python -m benchmarks.train_stage --profile                # and each one's kernels

The set-up is experiment.py's flags (what `make train` runs, and any given here); each variant
changes some of the learner's settings (`LearnerConfig` fields, and `compute_dtype`, the
network's precision; `name=value`, comma-separated; variants separated by `;`). The first row
is the set-up as given. The variants are measured in turns, `--rounds` times each, so that a
shared machine's drift falls on all of them alike, and each is given as a ratio to the first
in the same run.

Prints, per variant: the passes over each frame's data (`--batch_reuse`), optimisation steps
per batch, the train stage in emulator frames/s of new experience (the fresh share of each
batch with `--replay_parameters`) and CPU seconds per batch
(every thread), and its speed against the first row. With --profile, the kernels of one batch's
steps from TensorFlow's profiler, by op type, with their share of the time.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import glob
import os
import statistics
import tempfile
import typing
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as experiment.py's roles compute

import tensorflow as tf
from absl import app, flags

import experiment  # its flags: the set-up measured is the one make train runs
from benchmarks import stages
from benchmarks.ceiling import fresh_fraction
from impala import build, configs
from impala.learner import optimise

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "variants",
    "",
    "Learner settings to compare with the set-up, e.g. 'batch_reuse=3,num_batches_per_epoch=2;"
    "batch_reuse=2': `;` between variants, `,` between a variant's name=value settings.",
)
flags.DEFINE_float("seconds", 10.0, "How long each turn of a variant is measured.")
flags.DEFINE_integer("rounds", 3, "Turns each variant is measured in.", lower_bound=1)
flags.DEFINE_bool("profile", False, "Also print each variant's kernels, by op type.")
flags.DEFINE_integer("top_ops", 12, "Op types the profile lists.", lower_bound=1)


class Variant(NamedTuple):
    label: str
    config: configs.LearnerConfig
    compute_dtype: str


def parse_variants(
    text: str, base: configs.LearnerConfig, compute_dtype: str = "float32"
) -> list[Variant]:
    """The set-up (`base`, computing in `compute_dtype`), then each variant of `text`.

    Raises:
      ValueError: a one-line error naming the setting or value that is wrong.
    """
    types = typing.get_type_hints(configs.LearnerConfig)
    names = {field.name for field in dataclasses.fields(configs.LearnerConfig)}
    variants = [Variant("as given", base, compute_dtype)]
    for part in filter(None, (part.strip() for part in text.split(";"))):
        changes, dtype = {}, compute_dtype
        for item in filter(None, (item.strip() for item in part.split(","))):
            name, equals, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if equals and name == "compute_dtype":
                if value not in configs.COMPUTE_DTYPES:
                    raise ValueError(
                        f"--variants: compute_dtype={value}: must be one of "
                        f"{', '.join(configs.COMPUTE_DTYPES)}"
                    )
                dtype = value
                continue
            if not equals or name not in names:
                raise ValueError(
                    f"--variants: {item!r} is not name=value with a learner setting's name"
                )
            changes[name] = _parse(name, value, types[name])
        variants.append(Variant(part, dataclasses.replace(base, **changes), dtype))
    return variants


def _parse(name: str, value: str, field_type: type) -> object:
    try:
        if field_type is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if field_type in (int, float):
            number = float(value)
            return int(number) if field_type is int and number == int(number) else field_type(value)
        return value
    except ValueError:
        raise ValueError(f"--variants: {name}={value}: not a {field_type.__name__}") from None


def kernel_profile(run_batch, top: int) -> list[tuple[str, float, float]]:
    """The op types TensorFlow ran during `run_batch()`, by total time: (type, seconds, share),
    the `top` longest; read from the profiler's trace of that one call."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            run_batch()
        finally:
            tf.profiler.experimental.stop()
        # The trace's proto, read directly: TensorFlow ships its definition, not a reader.
        from tensorflow.tsl.profiler.protobuf import xplane_pb2

        space = xplane_pb2.XSpace()
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        with open(path, "rb") as trace:
            space.ParseFromString(trace.read())
    seconds: collections.Counter = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                # Kernels are named "op_name:OpType"; the executor's and the function's spans
                # that hold them ("ExecutorState::Process", "EagerLocalExecute: ...") are not.
                op_name, colon, op_type = name.rpartition(":")
                if colon and op_name and " " not in name and "::" not in name:
                    seconds[op_type] += event.duration_ps / 1e12
    total = sum(seconds.values()) or 1.0
    return [(op, secs, secs / total) for op, secs in seconds.most_common(top)]


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    experiment.apply_preset()
    try:
        base = experiment.learner_config_from_flags()
        variants = parse_variants(FLAGS.variants, base, FLAGS.compute_dtype)
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    _, num_actions, shape, dtype, frames_per_step = stages.measure_env(
        FLAGS.level_name,
        1,
        FLAGS.num_action_repeats,
        0.2,
        FLAGS.repeat_action_probability,
        FLAGS.frame_skip,
        FLAGS.frame_pooling,
    )
    try:
        agents = {
            precision: build.agent_for(FLAGS.agent_name, num_actions, shape, dtype, precision)
            for precision in {variant.compute_dtype for variant in variants}
        }
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    print(
        f"{FLAGS.level_name}, {FLAGS.agent_name}, {os.cpu_count()} CPUs, batch "
        f"{base.batch_size} x unroll {base.unroll_length}, {FLAGS.seconds:g} s x {FLAGS.rounds} "
        "rounds per variant"
    )
    measured = collections.defaultdict(list)
    for _ in range(FLAGS.rounds):
        for label, config, compute_dtype in variants:
            agent = agents[compute_dtype]
            measured[label].append(stages.measure_train(agent, shape, dtype, config, FLAGS.seconds))
    steps_per_batch = base.unroll_length * base.batch_size
    first = statistics.median(stage.steps_per_second for stage in measured["as given"])
    print(f"{'variant':58s} passes  steps  frames/s  CPU s/batch  speed")
    for label, config, _ in variants:
        rate = statistics.median(stage.steps_per_second for stage in measured[label])
        cpu = statistics.median(stage.cpu_per_step for stage in measured[label])
        steps = config.batch_reuse * config.num_batches_per_epoch
        # New experience: with replays, only the queue's share of each batch is fresh.
        new_frames = (
            rate * frames_per_step * fresh_fraction(FLAGS.replay_parameters, config.batch_size)
        )
        print(
            f"{label:58s} {config.batch_reuse:6d} {steps:6d} {new_frames:9,.0f} "
            f"{cpu * steps_per_batch:12.3f} {rate / first:5.2f}x"
        )
    if FLAGS.profile:
        for label, config, compute_dtype in variants:
            agent = agents[compute_dtype]
            batch = stages.train_batch(agent, shape, dtype, config)
            trainer = optimise.Trainer(agent, config)
            trainer.learn(batch, frames=0)  # traced before the profile
            print(f"\nkernels of one batch, {label}:")
            learn = functools.partial(trainer.learn, batch, frames=0)
            for op, seconds, share in kernel_profile(learn, FLAGS.top_ops):
                print(f"  {op:44s} {seconds * 1000:9.1f} ms {share:6.1%}")


if __name__ == "__main__":
    app.run(main)
