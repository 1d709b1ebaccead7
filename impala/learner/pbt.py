"""Population-based training's rule: how a policy ranks itself among the run's policies, whom it
copies, and how it perturbs its hyperparameters. Pure functions on plain values (no TensorFlow,
no network): `population.py` gathers the statuses and applies the decision.

The rule, at each look (every --pbt_period_env_steps of a policy's own frames, from
--pbt_start_mutation on):
- A policy is ranked on its objective: the mean return of its last --pbt_objective_games games,
  counted since it last copied another. A policy with fewer than a quarter of them, or that did
  not answer, is left out of the ranking; if the policy looking is left out, it sits the look
  out (nothing changes).
- The ranked policies are sorted by objective, best first (ties: the lower index first); the
  first ceil(--pbt_replace_fraction x n) are the best, the last as many the worst.
- One of the best keeps its weights and hyperparameters.
- One of the worst draws a donor among the best. It copies the donor's weights, optimiser state
  and hyperparameters if the donor's objective exceeds its own by more than
  max(--pbt_replace_reward_gap_absolute, --pbt_replace_reward_gap x |the donor's objective|)
  (a gap that holds for negative returns too, unlike a ratio), and then perturbs the copied
  hyperparameters; otherwise it perturbs its own.
- Any other policy perturbs its own.
- Perturbing: each tuned hyperparameter (`configs.pbt.TUNED`), with probability
  --pbt_mutation_rate, is multiplied or divided (even odds) by a factor drawn uniformly from
  [--pbt_perturb_min, --pbt_perturb_max], then kept within its range.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Mapping, Sequence

from impala.configs.pbt import TUNED, PbtConfig

KEEP, MUTATE, REPLACE, SIT_OUT = "keep", "mutate", "replace", "sit out"


@dataclasses.dataclass(frozen=True)
class Status:
    """What a policy tells the others for ranking (`PolicyStatus`)."""

    policy: int
    frames: int
    games: int  # in its objective's window
    objective: float | None  # None: too few games to be ranked
    hyperparameters: Mapping[str, float]
    generation: int  # how many times it has copied another policy

    def encode(self) -> bytes:
        return json.dumps(
            dataclasses.asdict(self) | {"hyperparameters": dict(self.hyperparameters)}
        ).encode()

    @classmethod
    def decode(cls, data: bytes, policy: int) -> Status | None:
        """The status in `data` if it is a well-formed one of `policy`, else None: a peer is
        another process, which may send anything."""
        try:
            fields = json.loads(data.decode())
            status = cls(
                policy=fields["policy"],
                frames=fields["frames"],
                games=fields["games"],
                objective=fields["objective"],
                hyperparameters=fields["hyperparameters"],
                generation=fields["generation"],
            )
            sound = status.policy == policy and status.is_sound()
        # RecursionError: JSON nested deeper than the parser goes, which fits in a status.
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, RecursionError):
            return None
        return status if sound else None

    def is_sound(self) -> bool:
        return (
            all(
                is_count(getattr(self, name))
                for name in ("policy", "frames", "games", "generation")
            )
            and (self.objective is None or is_finite(self.objective))
            and hyperparameters_are_sound(self.hyperparameters)
        )


def hyperparameters_are_sound(hyperparameters: object) -> bool:
    """Whether `hyperparameters` holds every tuned one, within its range, and nothing else."""
    return (
        isinstance(hyperparameters, Mapping)
        and set(hyperparameters) == set(TUNED)
        and all(
            is_finite(hyperparameters[name]) and low <= hyperparameters[name] <= high
            for name, (low, high) in TUNED.items()
        )
    )


# The largest integer JSON from another process may give for a count or a number: float64 holds
# every integer up to it exactly (a 400-digit one would overflow float() and math.isfinite).
MAX_JSON_INT = 2**53


def is_count(value: object) -> bool:
    """Whether `value` (read from JSON another process wrote) is an int in [0, 2^53], not a
    bool."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_JSON_INT


def is_finite(value: object) -> bool:
    """Whether `value` is a finite float, or an int (not a bool) within +-2^53."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_JSON_INT
    return isinstance(value, float) and math.isfinite(value)


def objective(returns: Sequence[float], window: int) -> float | None:
    """The mean of the last `window` of `returns`, or None with fewer than a quarter of them."""
    recent = list(returns)[-window:]
    if len(recent) < max(1, window // 4):
        return None
    return float(sum(recent) / len(recent))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a policy does at a look: `action` (KEEP, MUTATE, REPLACE or SIT_OUT), the donor it
    copies (REPLACE), the ranking it decided on (policy indices, best first) and why."""

    action: str
    why: str
    donor: int | None = None
    ranking: tuple[int, ...] = ()


def decide(me: Status, others: Sequence[Status], config: PbtConfig, rng: random.Random) -> Decision:
    """The module docstring's rule, for policy `me` among the statuses of the `others` that
    answered."""
    if me.objective is None:
        return Decision(
            SIT_OUT, f"{me.games} games since its start or last copy: too few to be ranked"
        )
    ranked = sorted(
        [status for status in (me, *others) if status.objective is not None],
        key=lambda status: (-status.objective, status.policy),
    )
    ranking = tuple(status.policy for status in ranked)
    if len(ranked) < 2:
        return Decision(SIT_OUT, "no other policy could be ranked", ranking=ranking)
    size = config.group_size(len(ranked))
    best, worst = ranked[:size], ranked[-size:]
    if me.policy in {status.policy for status in best}:
        return Decision(KEEP, f"among the best {size} of {len(ranked)}", ranking=ranking)
    if me.policy not in {status.policy for status in worst}:
        return Decision(MUTATE, f"neither among the best nor the worst {size}", ranking=ranking)
    donor = rng.choice(best)
    gap = donor.objective - me.objective
    needed = max(
        config.replace_reward_gap_absolute, config.replace_reward_gap * abs(donor.objective)
    )
    if gap > needed:
        return Decision(
            REPLACE,
            f"among the worst {size}: policy {donor.policy}'s mean return {donor.objective:.2f} "
            f"exceeds its {me.objective:.2f} by {gap:.2f} > {needed:.2f}",
            donor=donor.policy,
            ranking=ranking,
        )
    return Decision(
        MUTATE,
        f"among the worst {size}, but policy {donor.policy}'s mean return {donor.objective:.2f} "
        f"exceeds its {me.objective:.2f} by only {gap:.2f} <= {needed:.2f}",
        ranking=ranking,
    )


def perturb(
    hyperparameters: Mapping[str, float], config: PbtConfig, rng: random.Random
) -> dict[str, float]:
    """`hyperparameters` with each tuned one perturbed as the module docstring says."""
    perturbed = dict(hyperparameters)
    for name, (low, high) in TUNED.items():
        if rng.random() >= config.mutation_rate:
            continue
        factor = rng.uniform(config.perturb_min, config.perturb_max)
        value = perturbed[name] * factor if rng.random() < 0.5 else perturbed[name] / factor
        perturbed[name] = min(high, max(low, value))
    return perturbed
