"""The model and the report of `benchmarks.scaling`: a ring all-reduce fitted to two ranks'
measurements, what the learners' efficiency would be at 2, 4 and 8 machines, what would close
the gap to the targets, and the train steps timed under each gradient scheme."""

from __future__ import annotations

import dataclasses
import statistics

LEARNERS = (2, 4, 8)
# What would close the gap is worked out for these links: (rate, efficiency at 8 learners).
TARGETS = (("10gbit", 0.9), ("1gbit", 0.7))
# The link as the veth pair carries it, before any rate is set: both ranks' traffic at this
# machine's own speed. The ranks train only on the shaped links.
UNSHAPED = "unshaped"


@dataclasses.dataclass(frozen=True)
class Fit:
    """One link and compression: the two-rank all-reduce measured, and the ring model fitted.

    Attributes:
      median, p90: seconds per all-reduce of the whole gradient set, two ranks.
      alpha: seconds of latency per ring step (half the vote's median).
      payload: bytes each rank contributes (elements x bytes per element on the wire).
      sent, received: bytes rank 0's end of the link sent and received per all-reduce,
        measured (with TCP/IP headers and Horovod's own messages).
    """

    link: str
    compression: str
    median: float
    p90: float
    alpha: float
    payload: int
    sent: float
    received: float

    @property
    def bandwidth_secs(self) -> float:
        """The bandwidth term at N = 2, where 2 (N - 1) / N = 1."""
        return max(self.median - 2 * self.alpha, 1e-9)

    @property
    def rate(self) -> float:
        """The fitted effective rate, bytes per second."""
        return self.payload / self.bandwidth_secs

    def seconds(self, learners: int) -> float:
        """t(N) of a ring all-reduce over `learners`."""
        steps = 2 * (learners - 1)
        return steps * self.alpha + steps / learners * self.payload / self.rate


def efficiency(step: float, all_reduce: float) -> float:
    """Share of a learner's time spent computing when each step waits for `all_reduce`."""
    return step / (step + all_reduce)


def fit(link: str, compression: str, measured: dict, payload: int) -> Fit:
    """The model fitted to one link's rank-0 measurements (`benchmarks.scaling_rank`)."""
    seconds = measured[compression]["seconds"]
    return Fit(
        link=link,
        compression=compression,
        median=statistics.median(seconds),
        p90=percentile(seconds, 90),
        alpha=statistics.median(measured["vote"]["seconds"]) / 2,
        payload=payload,
        sent=measured[compression]["sent"] / len(seconds),
        received=measured[compression]["received"] / len(seconds),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclasses.dataclass(frozen=True)
class Gap:
    """What reaching `target` efficiency at `learners` takes, for one fit."""

    now: float  # efficiency at `learners` as measured and modelled
    max_all_reduces: float  # per batch, of `steps_per_batch`, that still reach the target
    one_per_batch: float  # efficiency with one all-reduce per batch
    overlap: float  # share of each all-reduce to hide behind compute (0 if none needed)
    overlap_possible: bool  # whether that much fits behind the step's compute


def gap(fitted: Fit, step: float, steps_per_batch: int, target: float, learners: int = 8) -> Gap:
    t = fitted.seconds(learners)
    batch = steps_per_batch * step
    overlap = max(0.0, 1 - step * (1 - target) / (target * t))
    return Gap(
        now=efficiency(step, t),
        max_all_reduces=batch * (1 - target) / (target * t),
        one_per_batch=efficiency(batch, t),
        overlap=overlap,
        overlap_possible=overlap * t <= step,
    )


@dataclasses.dataclass(frozen=True)
class StepCompute:
    """The train step alone: seconds per optimisation step, and steps per batch."""

    seconds: float
    steps_per_batch: int


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def gbit(bytes_per_second: float) -> str:
    return f"{bytes_per_second * 8 / 1e9:.2f} Gbit/s"


def table_lines(fits: list[Fit], step: StepCompute) -> list[str]:
    learners = ", ".join(str(n) for n in LEARNERS)
    header = (
        f"{'link':<9} {'compression':<11} {'2-learner all-reduce, median (p90)':<35} "
        f"{'sent / received':>16} {'rate fitted':>12} {'alpha':>7}   efficiency at {learners}"
    )
    lines = [header, "-" * len(header)]
    for fitted in fits:
        measured = f"{ms(fitted.median)} ({ms(fitted.p90)})"
        moved = f"{fitted.sent / 1e6:.2f} / {fitted.received / 1e6:.2f} MB"
        efficiencies = " ".join(
            f"{efficiency(step.seconds, fitted.seconds(n)):>5.0%}" for n in LEARNERS
        )
        lines.append(
            f"{fitted.link:<9} {fitted.compression:<11} {measured:<35} {moved:>16} "
            f"{gbit(fitted.rate):>12} {ms(fitted.alpha):>7}   {efficiencies}"
        )
    return lines


def gap_lines(fits: list[Fit], step: StepCompute) -> list[str]:
    lines = []
    for rate, target in TARGETS:
        rows = [fitted for fitted in fits if fitted.link == rate]
        if not rows:
            continue
        lines.append(f"To reach {target:.0%} at 8 learners on {rate}:")
        for fitted in rows:
            need = gap(fitted, step.seconds, step.steps_per_batch, target)
            t8 = fitted.seconds(8)
            reached = "reached" if need.now >= target else "not reached"
            fewer = min(need.max_all_reduces, float(step.steps_per_batch))
            overlap = (
                f"overlap {need.overlap:.0%} of each all-reduce ({ms(need.overlap * t8)} of "
                f"{ms(t8)} hidden behind a {ms(step.seconds)} step: "
                f"{'possible' if need.overlap_possible else 'more than the step computes'})"
            )
            lines.append(
                f"  {fitted.compression:<5} now {need.now:.0%} ({reached}); or at most "
                f"{fewer:.2f} all-reduces per batch of {step.steps_per_batch} steps (one per "
                f"batch: {need.one_per_batch:.0%}); or {overlap}"
            )
    return lines


def model_lines(ready: dict, compressions: list[str]) -> list[str]:
    payload = ", ".join(f"{name} {ready['payload'][name] / 1e6:.2f} MB" for name in compressions)
    return [
        "Model: t(N) = 2(N-1) alpha + 2(N-1)/N x bytes / rate (a ring all-reduce),",
        "  alpha = the one-float vote's median / 2, rate = bytes / (median - 2 alpha), so that",
        f"  t(2) = the median; bytes = what each rank contributes ({payload});",
        "  efficiency = step / (step + t(N)), the all-reduce not overlapped with compute.",
        "  'sent / received': bytes through rank 0's end of the link per all-reduce (with TCP/IP",
        "  headers and Horovod's own messages).",
    ]


SCHEMES = ("synchronous", "asynchronous")


def learner_config(job, batch_reuse: int | None):
    """`job`'s learner hyperparameters (a `configs.LearnerJobConfig`'s), with `batch_reuse`
    optimisation steps on each batch where given."""
    if not batch_reuse:
        return job.learner
    return dataclasses.replace(job.learner, batch_reuse=batch_reuse)


def train_key(scheme: str, compression: str) -> str:
    """The name of one train-step measurement in the ranks' results."""
    return f"{scheme} {compression}"


def train_lines(measured: dict, links: list[str], compressions: list[str]) -> list[str]:
    """The two ranks' train steps under each gradient scheme (`--grad_workers_communication`),
    per link and compression: the median seconds per batch, and what asynchronous gradients
    gain. Empty when the ranks timed none."""
    if not any("train" in measured[link] for link in links):
        return []
    header = (
        f"{'link':<9} {'compression':<11} {'synchronous gradients':>22} "
        f"{'asynchronous gradients':>23}   asynchronous against synchronous"
    )
    lines = [
        "Both ranks training (the learner's Trainer on a batch of random Pong frames, each rank",
        "a learner sharing this machine's cores with the other), seconds per batch, median:",
        header,
        "-" * len(header),
    ]
    for link in links:
        train = measured[link].get("train", {})
        for compression in compressions:
            synchronous, asynchronous = (
                statistics.median(train[train_key(scheme, compression)]["seconds"])
                for scheme in SCHEMES
            )
            lines.append(
                f"{link:<9} {compression:<11} {synchronous:>20.3f} s {asynchronous:>21.3f} s   "
                f"{synchronous / asynchronous:.2f}x as fast"
            )
    return lines
