"""Population-based training's settings, `PbtConfig`, under Sample Factory's flag names.

With --with_pbt, every --pbt_period_env_steps frames of its own (from --pbt_start_mutation on)
each policy's rank-0 learner ranks the run's policies on the mean return of their recent games
(`impala/learner/pbt.py` says the rule); one in the bottom --pbt_replace_fraction copies a
top policy's weights and optimiser state when the gap is real, and perturbs the
hyperparameters being tuned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from impala.configs.declare import (
    at_least,
    check_settings,
    config,
    declared,
    finite,
    flag_name,
    setting,
    within,
)

# The hyperparameters PBT tunes (`Trainer.set_hyperparameters` changes them between steps), and
# the range each is kept in after a perturbation.
TUNED = {"learning_rate": (1e-6, 1e-2), "entropy_cost": (1e-5, 0.1)}
# The most games a policy may be ranked on (Sample Factory's --stats_avg is 100). Each policy
# keeps them in pbt_state.json for its newest few checkpoints (`population.ENTRIES_WITH_RETURNS`),
# a file a resume reads only up to `population.MAX_STATE_FILE_BYTES` (64 MiB): at this bound
# they take at most about 320 KB each (a return written in full, one a line). A Pong policy
# played 1,425 games in 10M frames.
MAX_OBJECTIVE_GAMES = 10_000


def check_given(given: Iterable[str], with_pbt: bool) -> None:
    """Raises a one-line error for a PBT flag among the flags `given` (their names) without
    --with_pbt."""
    if with_pbt:
        return
    names = {flag_name(field) for field in declared(PbtConfig)} - {"with_pbt"}
    stray = sorted(names & set(given))
    if stray:
        raise ValueError(f"--{stray[0]}: given without --with_pbt, which it is a setting of")


def parse_initial(text: str) -> dict[int, dict[str, float]]:
    """--pbt_initial_hyperparameters read: policy -> tuned hyperparameter -> value ({} for '').

    Raises:
      ValueError: one line naming the flag and what is wrong.
    """
    if not text:
        return {}
    flag = "--pbt_initial_hyperparameters"
    try:
        by_policy = json.loads(text, object_pairs_hook=_without_repeats)
    except _RepeatedKeyError as repeated:
        raise ValueError(f"{flag}: {repeated} is given twice") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag}: not JSON ({error})") from None
    except (ValueError, RecursionError):  # an integer of over 4,300 digits; nesting too deep
        raise ValueError(f"{flag}: JSON nested too deeply, or with a too long number") from None
    if not isinstance(by_policy, dict):
        raise ValueError(f"{flag}: must be a JSON object by policy, such as '{{\"1\": {{...}}}}'")
    parsed = {}
    for key, values in by_policy.items():
        if not (key.isascii() and key.isdigit() and str(int(key)) == key):
            raise ValueError(f"{flag}: {key!r} is not a policy index")
        if not isinstance(values, dict) or not values:
            raise ValueError(f"{flag}: policy {key}: must be a JSON object of hyperparameters")
        for name, value in values.items():
            if name not in TUNED:
                raise ValueError(
                    f"{flag}: policy {key}: {name!r} is not one PBT tunes ({', '.join(TUNED)})"
                )
            low, high = TUNED[name]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{flag}: policy {key}: {name}={value!r} is not a number")
            if not low <= value <= high:  # NaN too
                raise ValueError(f"{flag}: policy {key}: {name}={value} is outside [{low}, {high}]")
        parsed[int(key)] = {name: float(value) for name, value in values.items()}
    return parsed


class _RepeatedKeyError(ValueError):
    pass


def _without_repeats(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; `_RepeatedKeyError` for a key given twice (which json would
    quietly take the last of)."""
    parsed = {}
    for key, value in pairs:
        if key in parsed:
            raise _RepeatedKeyError(repr(key))
        parsed[key] = value
    return parsed


def check_tuned(given: dict[str, float]) -> None:
    """Raises a one-line error for a hyperparameter PBT tunes whose flag value (`given`: name ->
    value) is outside the range PBT keeps it in: no policy could be ranked against it, nor
    resumed with it."""
    for name, value in given.items():
        low, high = TUNED[name]
        if not low <= value <= high:  # NaN too
            raise ValueError(
                f"--{name}={value}: --with_pbt tunes it within [{low}, {high}]; give a value "
                "in that range"
            )


def _fraction(name, value) -> None:
    if not 0 < value <= 0.5:  # NaN too
        raise ValueError(f"--{name}={value}: must be in (0, 0.5]")


@config
class PbtConfig:
    """What population-based training does, and how often (`--with_pbt` turns it on)."""

    with_pbt: bool = setting(
        False,
        "Population-based training of the run's --num_policies policies (Sample Factory's "
        "name): each period, a policy among the worst copies the weights and optimiser state of "
        "one among the best when the gap is real, and perturbs its learning rate and entropy "
        "cost, kept within [1e-6, 1e-2] and [1e-5, 0.1] (the flags' values must be too).",
    )
    period_frames: int = setting(
        1_000_000,
        "--with_pbt: frames of its own between a policy's looks at the population.",
        flag="pbt_period_env_steps",
        frames=True,
        check=at_least(1),
    )
    start_frames: int = setting(
        2_000_000,
        "--with_pbt: frames a policy trains before its first look at the population.",
        flag="pbt_start_mutation",
        frames=True,
        check=at_least(0),
    )
    replace_fraction: float = setting(
        0.3,
        "--with_pbt: the share of the population, rounded up, that counts as the best and as "
        "the worst.",
        flag="pbt_replace_fraction",
        check=_fraction,
    )
    mutation_rate: float = setting(
        0.15,
        "--with_pbt: the chance that each tuned hyperparameter is perturbed at a look.",
        flag="pbt_mutation_rate",
        check=within(0, 1),
    )
    replace_reward_gap: float = setting(
        0.1,
        "--with_pbt: a worst policy is replaced only if the best one's mean return exceeds its "
        "own by more than this share of the best one's (absolute) mean return...",
        flag="pbt_replace_reward_gap",
        check=finite(),
    )
    replace_reward_gap_absolute: float = setting(
        1.0,
        "--with_pbt: ...and by more than this much.",
        flag="pbt_replace_reward_gap_absolute",
        check=finite(),
    )
    perturb_min: float = setting(
        1.1,
        "--with_pbt: a perturbed hyperparameter is multiplied or divided (even odds) by a "
        "factor drawn uniformly from [--pbt_perturb_min, --pbt_perturb_max].",
        flag="pbt_perturb_min",
    )
    perturb_max: float = setting(1.5, "--with_pbt: see --pbt_perturb_min.", flag="pbt_perturb_max")
    objective_games: int = setting(
        50,
        "--with_pbt: a policy is ranked on the mean return of its last this many games (Sample "
        "Factory's --stats_avg), counted since it last copied another; with fewer than a "
        "quarter of them it sits a look out.",
        flag="pbt_objective_games",
        check=within(4, MAX_OBJECTIVE_GAMES),
    )

    initial_hyperparameters: str = setting(
        "",
        "--with_pbt: what some policies start with instead of the flags' values, a JSON object "
        'by policy: \'{"1": {"learning_rate": 1e-5}, "2": {"entropy_cost": 0.02}}\' (the tuned '
        "hyperparameters: learning_rate, entropy_cost). A resumed run goes on with its own.",
        flag="pbt_initial_hyperparameters",
        check=lambda name, value: parse_initial(value) and None,
    )

    def __post_init__(self):
        check_settings(self)
        if not 1 < self.perturb_min <= self.perturb_max < math.inf:  # NaN too
            raise ValueError(
                f"--pbt_perturb_min={self.perturb_min}, --pbt_perturb_max={self.perturb_max}: "
                "need 1 < min <= max (a factor that multiplies or divides, so around 1 both "
                "ways)"
            )

    def check_population(self, num_policies: int) -> None:
        """Raises a one-line error if PBT is on for fewer than two policies, or starts a policy
        the run does not have."""
        if self.with_pbt and num_policies < 2:
            raise ValueError(
                f"--with_pbt: needs --num_policies of at least 2 (a population), not {num_policies}"
            )
        beyond = sorted(k for k in parse_initial(self.initial_hyperparameters) if k >= num_policies)
        if beyond:
            raise ValueError(
                f"--pbt_initial_hyperparameters: policy {beyond[0]} is not one of the run's "
                f"--num_policies={num_policies}"
            )

    def initial(self, policy: int) -> dict[str, float]:
        """The hyperparameters `policy` starts with instead of the flags' ({}: none)."""
        return parse_initial(self.initial_hyperparameters).get(policy, {})

    def group_size(self, num_policies: int) -> int:
        """How many policies count as the best, and as the worst, of `num_policies`."""
        return math.ceil(self.replace_fraction * num_policies)
