"""`--replay_parameters`: the replays a learner mixes its batches from, as users of the PyTorch
IMPALA platforms write them (one JSON list, one object per replay):

    [{"type": "queue", "capacity": 1, "sample_ratio": 0.5},
     {"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]

Types and their keys:
  queue     `capacity`, `sample_ratio`: first in, first out, each trajectory taken once (the
            store of an all-fresh batch). Its capacity counts batches of its share: capacity 1
            holds one batch's share, which is plain on-policy pass-through.
  standard  `capacity`, `sample_ratio`: uniform replay of stored trajectories; its capacity
            counts trajectories (unrolls), the oldest evicted first.
  custom    `capacity` (trajectories), `sample_ratio`, `dist_function` (ln_norm, cos_dist or
            kl_div), `sample_strategy` elite_sampling with `lambda_batch_multiplier` (an integer
            >= 1) and `alfa_annealing_factor` (> 0), and optionally `elite_sampling_strategy`
            (strategy1 to strategy4, default strategy3) and `p` (ln_norm's order, default 2).

The ratios are positive and sum to 1. A batch of B trajectories takes `batch_shares`: each
replay's ratio x B rounded down, and the trajectories left over one each to the replays with
the largest remainders (the earlier replay on a tie), so the batch keeps its size; a replay
whose share would be 0 trajectories is refused.

The list above is the default (`DEFAULT`); '' (or a queue alone) trains on fresh trajectories
only, as IMPALA does, and is the default with synchronous collection or a --queue_capacity
(`roles.implied_defaults`).

TensorFlow-free: the launchers check it before anything starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

FLAG = "--replay_parameters"
TYPES = ("queue", "standard", "custom")
DIST_FUNCTIONS = ("ln_norm", "cos_dist", "kl_div")
SAMPLE_STRATEGIES = ("elite_sampling",)
ELITE_SAMPLING_STRATEGIES = ("strategy1", "strategy2", "strategy3", "strategy4")
_COMMON_KEYS = ("type", "capacity", "sample_ratio")
_CUSTOM_KEYS = (
    "dist_function",
    "p",
    "sample_strategy",
    "lambda_batch_multiplier",
    "alfa_annealing_factor",
    "elite_sampling_strategy",
)
# Far above any machine's memory in trajectories of Atari frames (each about 600 KB).
MAX_CAPACITY = 10_000_000
# The default mix: half of each batch fresh, half replayed uniformly from the last 1,000
# trajectories (566 MiB of Atari frames). On Pong it reached +18 sooner than all-fresh
# batches on each of seeds 0, 1 and 2, at 0.97 of their frames/s (docs/learning-history.md).
DEFAULT = (
    '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
    '{"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]'
)
# Far above any flag a user types.
MAX_TEXT = 64 << 10


@dataclasses.dataclass(frozen=True)
class Replay:
    """One replay of `--replay_parameters`; the elite fields are set for `custom` only."""

    type: str
    capacity: int
    sample_ratio: float
    dist_function: str = ""
    p: int = 2
    sample_strategy: str = ""
    lambda_batch_multiplier: int = 1
    alfa_annealing_factor: float = 1.0
    elite_sampling_strategy: str = ""


def parse(text: str) -> tuple[Replay, ...]:
    """The replays `text` lists; () for an empty text (every trajectory fresh, from one queue).

    Raises:
      ValueError: one line naming the flag, the replay (its place in the list and type) and
        the key that is wrong.
    """
    if not text.strip():
        return ()
    if len(text) > MAX_TEXT:
        raise ValueError(f"{FLAG}: {len(text)} characters, more than a list of replays needs")
    try:
        items = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{FLAG}: not JSON ({error.msg} at character {error.pos + 1}); give a list such as "
            '\'[{"type": "queue", "capacity": 1, "sample_ratio": 1.0}]\''
        ) from None
    except (ValueError, RecursionError):  # an integer of over 4,300 digits; nesting too deep
        raise ValueError(
            f"{FLAG}: JSON nested too deeply, or with a number too long, to be a list of replays"
        ) from None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{FLAG}: must be a JSON list of at least one replay (an object each)")
    replays = tuple(_replay(index, item) for index, item in enumerate(items, start=1))
    total = math.fsum(replay.sample_ratio for replay in replays)
    if abs(total - 1.0) > 1e-6:
        ratios = " + ".join(f"{replay.sample_ratio:g}" for replay in replays)
        raise ValueError(f"{FLAG}: the sample_ratios must sum to 1, not {ratios} = {total:g}")
    return replays


def _replay(index: int, item: Any) -> Replay:
    where = f"{FLAG}: replay {index}"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be an object with type, capacity and sample_ratio")
    kind = item.get("type")
    if not isinstance(kind, str) or kind.lower() not in TYPES:
        raise ValueError(f"{where}: type must be one of {', '.join(TYPES)}, not {_shown(kind)}")
    kind = kind.lower()
    where = f"{where} ({kind})"
    allowed = _COMMON_KEYS + (_CUSTOM_KEYS if kind == "custom" else ())
    for key in item:
        if key not in allowed:
            raise ValueError(
                f"{where}: unknown key {_shown(key)}; a {kind} replay takes {', '.join(allowed)}"
            )
    for key in ("capacity", "sample_ratio"):
        if key not in item:
            raise ValueError(f"{where}: {key} is missing")
    capacity = _integer(where, "capacity", item["capacity"], 1, MAX_CAPACITY)
    ratio = item["sample_ratio"]
    if _not_number(ratio) or not 0 < ratio <= 1:
        raise ValueError(f"{where}: sample_ratio must be a number in (0, 1], not {_shown(ratio)}")
    if kind != "custom":
        return Replay(kind, capacity, float(ratio))
    return _custom(where, item, capacity, float(ratio))


def _custom(where: str, item: dict, capacity: int, ratio: float) -> Replay:
    dist = _choice(where, "dist_function", item.get("dist_function"), DIST_FUNCTIONS)
    strategy = _choice(where, "sample_strategy", item.get("sample_strategy"), SAMPLE_STRATEGIES)
    for key in ("lambda_batch_multiplier", "alfa_annealing_factor"):
        if key not in item:
            raise ValueError(f"{where}: {strategy} needs {key}")
    multiplier = _integer(
        where, "lambda_batch_multiplier", item["lambda_batch_multiplier"], 1, 1000
    )
    alfa = item["alfa_annealing_factor"]
    if _not_number(alfa) or not 0 < alfa < math.inf:
        raise ValueError(f"{where}: alfa_annealing_factor must be a number > 0, not {_shown(alfa)}")
    elite = _choice(
        where,
        "elite_sampling_strategy",
        item.get("elite_sampling_strategy", "strategy3"),
        ELITE_SAMPLING_STRATEGIES,
    )
    if "p" in item and dist != "ln_norm":
        raise ValueError(f"{where}: p is the order of ln_norm, not of {dist}")
    p = _integer(where, "p", item.get("p", 2), 1, 16)
    return Replay(
        "custom",
        capacity,
        ratio,
        dist_function=dist,
        p=p,
        sample_strategy=strategy,
        lambda_batch_multiplier=multiplier,
        alfa_annealing_factor=float(alfa),
        elite_sampling_strategy=elite,
    )


def _not_number(value: Any) -> bool:
    """Whether `value` is not a number this list may give: a bool, NaN, or an integer beyond
    +-2^53 (which float() may not take) are not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return True
    return isinstance(value, int) and abs(value) > 2**53


def _shown(value: Any) -> str:
    """`value` as an error quotes it, at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(where: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{where}: {key} must be an integer in [{low}, {high}], not {_shown(value)}"
        )
    return value


def _choice(where: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value is None:
        raise ValueError(f"{where}: {key} is missing; one of {', '.join(choices)}")
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"{where}: {key} must be one of {', '.join(choices)}, not {_shown(value)}")
    return value.lower()


def replays_any(replays: tuple[Replay, ...]) -> bool:
    """Whether a batch of this mix holds replayed trajectories: () and a queue alone do not."""
    return any(replay.type != "queue" for replay in replays)


def check_buildable(replays: tuple[Replay, ...]) -> None:
    """Raises the one-line ValueError of a mix the learner cannot make: it needs exactly one
    queue, where the actors' trajectories come in."""
    queues = sum(replay.type == "queue" for replay in replays)
    if queues != 1:
        raise ValueError(
            f"{FLAG}: needs exactly one queue replay, where the actors' trajectories come in; "
            f"this list has {queues}"
        )


def batch_shares(replays: tuple[Replay, ...], batch_size: int) -> tuple[int, ...]:
    """Trajectories each replay gives a batch of `batch_size`: ratio x batch_size rounded
    down, then the rest one each to the largest remainders (the earlier replay on a tie).

    Raises:
      ValueError: a replay would give none (its ratio too small for the batch).
    """
    exact = [replay.sample_ratio * batch_size for replay in replays]
    shares = [math.floor(value + 1e-9) for value in exact]
    by_remainder = sorted(range(len(replays)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[: batch_size - sum(shares)]:
        shares[i] += 1
    for index, (replay, share) in enumerate(zip(replays, shares, strict=True), start=1):
        if share == 0:
            raise ValueError(
                f"{FLAG}: replay {index} ({replay.type}): a sample_ratio of "
                f"{replay.sample_ratio:g} gives no trajectory of a batch of {batch_size}; raise "
                "it or --batch_size"
            )
    return tuple(shares)
