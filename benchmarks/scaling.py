"""How well the learners would scale over several machines on 1 GbE and 10 GbE: two Horovod
ranks all-reduce the learner's gradients over a shaped link on this machine, and a ring model
fitted to that predicts 2, 4 and 8 machines.

  python -m benchmarks.scaling                          # 1gbit and 10gbit, none and fp16
  python -m benchmarks.scaling --rates=1gbit --compression=fp16 --repeats=20
  python -m benchmarks.scaling --mca=btl_tcp_links=4     # an Open MPI setting for the ranks
  python -m benchmarks.scaling --train_batches=0         # the all-reduce alone, no training
  python -m benchmarks.scaling --batch_reuse=1           # one step a batch, not the learner's 3

Run as root: it makes two network namespaces joined by a veth pair (10.77.0.1/24 and
10.77.0.2/24, inside the namespaces only; names carry this process's id), and holds both ends
of the pair to each rate of --rates with `tc ... tbf`, after measuring the unshaped pair. All of
it is removed at the end, also after an error, Ctrl-C or SIGTERM.

What it measures:
  step      the learner's train step alone on this machine, one learner, default config
            (`benchmarks.stages.measure_train`: the same `Trainer`, no Horovod), in seconds
            per optimisation step (each batch takes --batch_reuse x --num_batches_per_epoch);
  all-reduce  two Horovod ranks, one per namespace, each building the learner's network (the
            default: what `make train` trains on Pong) and all-reducing float32 tensors of
            exactly its trainable variables' shapes as the train step's
            `hvd.DistributedGradientTape` does, with each compression of --compression
            (Horovod's fp16 casts them to float16 for the collective): median and p90 seconds
            over --repeats calls after --warmup, and the bytes rank 0's veth end sent and
            received per call;
            and the train step's one-float vote (`allreduce.every_learner`), the latency;
  training  both ranks training, each on its own batch of random Pong frames with the learner's
            `Trainer`, under each gradient scheme (`--grad_workers_communication`): synchronous
            (each step waits for its gradients' all-reduce) and asynchronous (each step applies
            the gradients all-reduced while it computed: one step old), with each compression
            of --train_compression (default: each of --compression):
            the median seconds per batch over --train_batches batches, and what the
            asynchronous scheme gains on each shaped link (not the unshaped pair, which is
            this machine's loopback speed). The two ranks share this machine's cores,
            so a batch takes longer than the step alone; the schemes are compared in one run.

How the ranks run: one `mpirun`, itself inside namespace A, with hosts 10.77.0.1 (its own) and
10.77.0.2, whose daemon it starts through a launch agent (Open MPI's `plm_rsh_agent`, the role
ssh plays on a cluster) that is `ip netns exec B`; `--mca pml ob1 --mca btl tcp,self` with
`btl_tcp_if_include` and `oob_tcp_if_include` on 10.77.0.0/24 keep every byte between the ranks
on TCP over the pair. This is how the learners run on real machines (Horovod's MPI controller
and MPI all-reduce, as under `make train ARGS=--num_learners=2`), with Open MPI's defaults
unless --mca says otherwise. The simpler MPMD form,
`mpirun -np 1 ip netns exec A python ... : -np 1 ip netns exec B python ...`, does not start:
each rank's PMIx client must reach mpirun's PMIx server over loopback, which a namespace does
not share (`OPAL ERROR: Unreachable` in MPI_Init). Horovod's Gloo controller would need its
rendezvous server reachable from both namespaces, and would measure Gloo's all-reduce, which
the learners do not use.

The model (a ring all-reduce; N learners, one per machine):
  t(N) = 2 (N - 1) alpha + 2 (N - 1) / N x bytes / rate
  alpha  the latency of one of the ring's 2 (N - 1) steps: half the vote's median at N = 2
         (it carries 4 bytes), so it also holds Horovod's own per-collective work;
  rate   the link's effective rate, fitted so that t(2) is the measured median:
         rate = bytes / (median - 2 alpha), with bytes = what each rank contributes (4 bytes
         an element, 2 with fp16; fp16's casts thus count against its rate);
  efficiency(N) = step / (step + t(N)): the all-reduce is not overlapped with compute (the
         train step waits for the averaged gradients before it applies them; that Horovod may
         start on the last layers' gradients while the first layers' are computed is left
         out, so the model errs low). The vote is left out too: it depends on the loss alone,
         so it can run while the gradients are computed.
Then, for 90% at 8 learners on 10gbit and 70% on 1gbit, what would close the gap: fp16 (its
row), all-reduces per batch (each batch takes S steps, each all-reducing: at most
m = S step (1 - e) / (e t(8)) all-reduces per batch reach efficiency e), or overlap (the share
f = 1 - step (1 - e) / (e t(8)) of each all-reduce hidden behind compute, possible only while
f t(8) <= step).

The parts: the namespaces and the shaped link in `scaling_link.py`, the ranks' mpirun in
`scaling_ranks.py`, each rank in `scaling_rank.py`, the model and the report in
`scaling_model.py`.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks import scaling_link
from benchmarks.scaling_model import (
    UNSHAPED,
    StepCompute,
    fit,
    gap_lines,
    learner_config,
    model_lines,
    ms,
    table_lines,
    train_lines,
)
from benchmarks.scaling_ranks import Ranks, ranks_command, write_launch_agent

FLAGS = flags.FLAGS
flags.DEFINE_list("rates", ["1gbit", "10gbit"], "Link rates to hold the pair to (tc's spelling).")
flags.DEFINE_list("compression", ["none", "fp16"], "Horovod compressions to measure: none, fp16.")
flags.DEFINE_list(
    "train_compression",
    [],
    "Compressions the ranks train with (a subset of --compression); default: each of "
    "--compression.",
)
flags.DEFINE_integer("repeats", 50, "Timed all-reduces per link and compression.", lower_bound=1)
flags.DEFINE_integer("warmup", 5, "Untimed all-reduces before them.", lower_bound=1)
flags.DEFINE_integer(
    "train_batches",
    3,
    "Batches both ranks train on per shaped link, compression and gradient scheme (after one "
    "untimed), to show what --grad_workers_communication=asynchronous gains; 0: none.",
    lower_bound=0,
)
flags.DEFINE_float(
    "step_seconds", 10.0, "How long the train step alone is measured.", lower_bound=0.01
)
flags.DEFINE_integer(
    "batch_reuse",
    None,
    "Optimisation steps on each batch (the learner's --batch_reuse), in the train step alone, "
    "the model's all-reduces per batch and the ranks' training; default: the learner's.",
    lower_bound=1,
)
flags.DEFINE_multi_string(
    "mca",
    [],
    "More Open MPI settings for the ranks' mpirun, name=value (e.g. btl_tcp_links=4); "
    "default: Open MPI's own, as the learners run.",
)
flags.DEFINE_float(
    "rank_timeout_secs", 300.0, "Give up when the ranks are silent this long.", lower_bound=1
)

_SCRIPT = "scaling.py"
COMPRESSIONS = ("none", "fp16")
# The Open MPI settings that put the ranks on the pair: --mca may not change them.
_OWN_MCA = ("plm_rsh_agent", "oob_tcp_if_include", "pml", "btl", "btl_tcp_if_include")


class StoppedError(Exception):
    """SIGTERM or SIGINT arrived."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame):
    raise StoppedError(signum)


# --- the flags ---------------------------------------------------------------------------------


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parse, its errors in one line."""
    try:
        return FLAGS(argv)
    except flags.Error as error:
        _fail(str(error), status=2)


def _fail(message: str, status: int = 1):
    print(f"{_SCRIPT}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def checked_flags() -> tuple[list[str], list[str], list[str]]:
    """--rates, --compression and --train_compression, checked; ValueError in one line."""
    rates = [rate.strip().lower() for rate in FLAGS.rates if rate.strip()]
    for rate in rates:
        try:
            scaling_link.rate_bits(rate)
        except ValueError as error:
            raise ValueError(f"--rates: {error}") from None
    if len(set(rates)) != len(rates):
        raise ValueError(f"--rates: a rate is given twice: {','.join(rates)}")
    compressions = [name.strip().lower() for name in FLAGS.compression if name.strip()]
    wrong = [name for name in compressions if name not in COMPRESSIONS]
    if wrong or not compressions:
        raise ValueError(
            f"--compression: {','.join(wrong) or 'nothing'} is not one of {', '.join(COMPRESSIONS)}"
        )
    compressions = list(dict.fromkeys(compressions))
    trained = [name.strip().lower() for name in FLAGS.train_compression if name.strip()]
    wrong = [name for name in trained if name not in compressions]
    if wrong:
        raise ValueError(
            f"--train_compression: {','.join(wrong)} is not one of --compression's "
            f"({', '.join(compressions)})"
        )
    return rates, compressions, list(dict.fromkeys(trained)) or compressions


def checked_mca() -> dict[str, str]:
    """--mca as {name: value}; ValueError in one line."""
    settings = {}
    for item in FLAGS.mca:
        name, equals, value = item.partition("=")
        if not equals or not re.fullmatch(r"[a-z][a-z0-9_]*", name) or not value:
            raise ValueError(f"--mca={item}: give an Open MPI setting as name=value")
        if name in _OWN_MCA:
            raise ValueError(f"--mca={item}: {name} is the benchmark's own (it keeps the link)")
        settings[name] = value
    return settings


# --- the measurements --------------------------------------------------------------------------


def measure_step(seconds: float) -> StepCompute:
    """One learner's train step with the default config (and --batch_reuse), on this machine,
    without Horovod."""
    # TensorFlow loads here: a bad flag or a missing tool is reported before it.
    from benchmarks import stages
    from impala import configs
    from impala.learner import start

    job = configs.LearnerJobConfig()
    env_info, agent = start.build_agent(job)
    config = learner_config(job, FLAGS.batch_reuse)
    stage = stages.measure_train(
        agent, env_info.observation_shape, env_info.observation_dtype, config, seconds
    )
    steps_per_batch = config.batch_reuse * config.num_batches_per_epoch
    batch_secs = config.unroll_length * config.batch_size / stage.steps_per_second
    return StepCompute(batch_secs / steps_per_batch, steps_per_batch)


def measure_links(
    link: scaling_link.Link,
    rates: list[str],
    compressions: list[str],
    trained: list[str],
    folder: str,
) -> tuple[dict, dict]:
    """The ranks' description of the network, and their measurements per link set-up."""
    agent = write_launch_agent(link, folder)
    ranks = Ranks(
        ranks_command(
            link,
            agent,
            FLAGS.warmup,
            FLAGS.repeats,
            compressions,
            checked_mca(),
            FLAGS.train_batches,
            trained,
            FLAGS.batch_reuse,
        )
    )
    try:
        ready = ranks.result(FLAGS.rank_timeout_secs)
        measured = {}
        for rate in [None, *rates]:
            label = rate or UNSHAPED
            scaling_link.shape(link, rate)
            print(f"  measuring the {label} link ...", flush=True)
            ranks.send(label)
            result = ranks.result(FLAGS.rank_timeout_secs)
            measured[result["link"]] = result["results"]
        ranks.send("")
        try:
            ranks.process.wait(timeout=FLAGS.rank_timeout_secs)
        except subprocess.TimeoutExpired:
            raise RuntimeError("the ranks' mpirun did not end once told to") from None
        return ready, measured
    finally:
        ranks.stop()


# --- the report --------------------------------------------------------------------------------


def report(ready: dict, measured: dict, step: StepCompute, rates: list[str], compressions, trained):
    elements = ready["elements"]
    print(
        f"\n{ready['level']}, {ready['agent']}: {elements:,} trainable floats in "
        f"{ready['tensors']} tensors ({elements * 4 / 1e6:.2f} MB as float32); train step alone "
        f"{ms(step.seconds)} per optimisation step, {step.steps_per_batch} per batch; "
        f"{FLAGS.repeats} timed all-reduces after {FLAGS.warmup}, two ranks"
        + (f"; mpirun --mca {' '.join(FLAGS.mca)}" if FLAGS.mca else "")
        + "\n"
    )
    fits = [
        fit(link, compression, measured[link], ready["payload"][compression])
        for link in [UNSHAPED, *rates]
        for compression in compressions
    ]
    lines = [*table_lines(fits, step), "", *model_lines(ready, compressions), ""]
    lines += gap_lines(fits, step)
    training = train_lines(measured, rates, trained)
    print("\n".join([*lines, *(["", *training] if training else [])]), flush=True)


# --- the run -----------------------------------------------------------------------------------


def run(rates: list[str], compressions: list[str], trained: list[str]) -> int:
    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg()
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f} (1 min) / {load[1]:.2f} (5 min) at the start",
        flush=True,
    )
    link = scaling_link.Link.for_pid(os.getpid())
    for namespace in scaling_link.leftovers(os.getpid()):
        print(f"  note: {namespace} is left from an earlier run: ip netns del {namespace}")
    print("  measuring the train step alone ...", flush=True)
    step = measure_step(FLAGS.step_seconds)
    folder = tempfile.mkdtemp(prefix=f"{link.tag}-")
    try:
        print(f"  making {link.namespaces[0]} and {link.namespaces[1]} ...", flush=True)
        scaling_link.set_up(link)
        ready, measured = measure_links(link, rates, compressions, trained, folder)
    finally:
        # A second signal must not stop the clean-up half way.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        problems = scaling_link.tear_down(link)
        shutil.rmtree(folder, ignore_errors=True)
        for problem in problems:
            print(f"{_SCRIPT}: warning: {problem}", file=sys.stderr)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _stop)
    print(f"  removed {link.namespaces[0]} and {link.namespaces[1]}", flush=True)
    report(ready, measured, step, rates, compressions, trained)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        _fail(f"unexpected arguments: {' '.join(argv[1:])}", status=2)
    try:
        rates, compressions, trained = checked_flags()
        checked_mca()
    except ValueError as error:
        _fail(str(error), status=2)
    missing = scaling_link.missing_tools()
    if missing:
        _fail(missing)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    try:
        return run(rates, compressions, trained)
    except StoppedError as stopped:
        left = set(scaling_link.Link.for_pid(os.getpid()).namespaces)
        gone = not left & scaling_link.namespaces_present()
        state = "the namespaces are removed" if gone else "see the warning above"
        print(f"{_SCRIPT}: stopped by {stopped}; {state}", file=sys.stderr)
        return 128 + stopped.signum
    except RuntimeError as error:
        _fail(str(error))


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
