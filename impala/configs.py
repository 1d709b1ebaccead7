"""Hyperparameters shared by every process of a run, validated where they are built, and the
checks of each role's job-level flags (queue, checkpoints, timeouts...).

TensorFlow-free: launchers and the frontend check a run's flags with these before starting
anything, and each process's job config checks its own with the same functions.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Any

REWARD_CLIPPING_CHOICES = ("abs_one", "soft_asymmetric", "none")
OPTIMIZER_CHOICES = ("rmsprop", "adam")
POLICY_CLIP_CENTER_CHOICES = ("behaviour", "learner")
# The network a run trains unless told otherwise (`--agent_name`): the Nature DQN's, PPO's Atari
# network; `--preset=paper` takes the paper's shallow one.
DEFAULT_AGENT_NAME = "SimpleConvNetAgent"


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of the IMPALA loss and its optimiser; defaults are the paper's Atari ones."""

    batch_size: int = 32
    unroll_length: int = 20
    discounting: float = 0.99
    vtrace_lambda: float = 1.0  # V-trace's trace decay (the paper's remark 2)
    normalize_advantages: bool = False  # policy-gradient advantages to mean 0, std 1 per batch
    policy_clip: float = 0.0  # PPO's clipped surrogate around the behaviour policy; 0: V-trace's
    # Around which policy `policy_clip` clips: the behaviour policy that acted, or the learner's
    # own when the batch arrived (PPO's objective decoupled from the behaviour policy).
    policy_clip_center: str = "behaviour"
    baseline_cost: float = 0.5
    entropy_cost: float = 0.01
    # The entropy weight moves linearly from `entropy_cost` to `entropy_cost_final` over this
    # many frames and stays there; 0: `entropy_cost` throughout.
    entropy_cost_anneal_frames: int = 0
    entropy_cost_final: float = 0.0
    reward_clipping: str = "abs_one"
    gradients_clipping: float = 40.0  # global norm; negative (or 0) turns clipping off
    learning_rate: float = 0.0006
    optimizer: str = "rmsprop"
    decay: float = 0.99
    momentum: float = 0.0
    epsilon: float = 0.01
    total_environment_frames: int = 200_000_000  # the frame budget
    # The learning rate anneals linearly to 0 over this many frames, or over the frame budget if
    # that is longer (0: over the budget, the paper's schedule): the schedule's horizon.
    learning_rate_anneal_frames: int = 0
    # The rate holds at `learning_rate` until this many frames before the horizon's end, then
    # falls linearly to 0 over them; 0, or at least the horizon: it falls throughout.
    learning_rate_cooldown_frames: int = 0
    # The cooldown as a share of the horizon, unless `learning_rate_cooldown_frames` is set.
    learning_rate_cooldown_fraction: float = 0.0
    batch_reuse: int = 1  # optimisation steps on each batch (V-trace corrects the later ones)

    def __post_init__(self):
        _require(self.batch_size >= 1, "batch_size", self.batch_size, "must be at least 1")
        _require(self.unroll_length >= 1, "unroll_length", self.unroll_length, "must be at least 1")
        _require(
            0.0 <= self.discounting <= 1.0, "discounting", self.discounting, "must be in [0, 1]"
        )
        _require(
            0.0 <= self.vtrace_lambda <= 1.0,
            "vtrace_lambda",
            self.vtrace_lambda,
            "must be in [0, 1]",
        )
        _require(
            0.0 <= self.policy_clip < 1.0, "policy_clip", self.policy_clip, "must be in [0, 1)"
        )
        _require(
            self.policy_clip_center in POLICY_CLIP_CENTER_CHOICES,
            "policy_clip_center",
            self.policy_clip_center,
            f"must be one of {', '.join(POLICY_CLIP_CENTER_CHOICES)}",
        )
        _require(
            0 <= self.baseline_cost < math.inf,
            "baseline_cost",
            self.baseline_cost,
            "must be a finite number >= 0",
        )
        _require(
            0 <= self.entropy_cost < math.inf,
            "entropy_cost",
            self.entropy_cost,
            "must be a finite number >= 0",
        )
        _require(
            self.entropy_cost_anneal_frames >= 0,
            "entropy_cost_anneal_frames",
            self.entropy_cost_anneal_frames,
            "must be >= 0 (0: --entropy_cost throughout)",
        )
        _require(
            0 <= self.entropy_cost_final < math.inf,
            "entropy_cost_final",
            self.entropy_cost_final,
            "must be a finite number >= 0",
        )
        _require(
            not math.isnan(self.gradients_clipping),
            "gradients_clipping",
            self.gradients_clipping,
            "must be a number (<= 0 turns clipping off)",
        )
        _require(
            self.reward_clipping in REWARD_CLIPPING_CHOICES,
            "reward_clipping",
            self.reward_clipping,
            f"must be one of {', '.join(REWARD_CLIPPING_CHOICES)}",
        )
        _require(self.batch_reuse >= 1, "batch_reuse", self.batch_reuse, "must be at least 1")
        _require(
            0 < self.learning_rate < math.inf,
            "learning_rate",
            self.learning_rate,
            "must be a finite number > 0",
        )
        _require(
            self.optimizer in OPTIMIZER_CHOICES,
            "optimizer",
            self.optimizer,
            f"must be one of {', '.join(OPTIMIZER_CHOICES)}",
        )
        _require(0.0 <= self.decay < 1.0, "decay", self.decay, "must be in [0, 1)")
        _require(0.0 <= self.momentum < 1.0, "momentum", self.momentum, "must be in [0, 1)")
        _require(
            self.optimizer == "rmsprop" or self.momentum == 0.0,
            "momentum",
            self.momentum,
            "is RMSProp's; --optimizer=adam has its own (beta1 0.9): leave --momentum at 0",
        )
        _require(
            0 < self.epsilon < math.inf, "epsilon", self.epsilon, "must be a finite number > 0"
        )
        _require(
            self.total_environment_frames >= 1,
            "total_environment_frames",
            self.total_environment_frames,
            "must be at least 1",
        )
        _require(
            self.learning_rate_anneal_frames >= 0,
            "learning_rate_anneal_frames",
            self.learning_rate_anneal_frames,
            "must be >= 0 (0: the frame budget)",
        )
        _require(
            self.learning_rate_cooldown_frames >= 0,
            "learning_rate_cooldown_frames",
            self.learning_rate_cooldown_frames,
            "must be >= 0 (0: the rate falls from the start)",
        )
        _require(
            0.0 <= self.learning_rate_cooldown_fraction <= 1.0,
            "learning_rate_cooldown_fraction",
            self.learning_rate_cooldown_fraction,
            "must be in [0, 1]",
        )
        # A cooldown that would begin after the run ends is a schedule that never falls: most
        # likely one meant for the budget (the default 15% of it), on a longer horizon given in
        # frames (as the default of 200M frames was before 2026-12-04).
        horizon, cooldown = self.learning_rate_horizon, self.learning_rate_cooldown
        by_frames = self.learning_rate_cooldown_frames != 0
        _require(
            not 0 < cooldown < horizon or horizon - cooldown < self.total_environment_frames,
            "learning_rate_cooldown_frames" if by_frames else "learning_rate_cooldown_fraction",
            self.learning_rate_cooldown_frames
            if by_frames
            else self.learning_rate_cooldown_fraction,
            f"the learning rate would begin to fall at {horizon - cooldown} frames, after the "
            f"--total_environment_frames={self.total_environment_frames} budget "
            f"(--learning_rate_anneal_frames={self.learning_rate_anneal_frames}); give "
            "--learning_rate_anneal_frames=0 for a cooldown that ends with the budget, or "
            "--learning_rate_cooldown_fraction=0 to anneal over the whole horizon",
        )

    @property
    def learning_rate_horizon(self) -> int:
        """Frames at which the learning rate reaches 0: the anneal's, or the budget if later."""
        return max(self.learning_rate_anneal_frames, self.total_environment_frames)

    @property
    def learning_rate_cooldown(self) -> int:
        """Frames before the horizon's end over which the rate falls (0: from the start)."""
        return self.learning_rate_cooldown_frames or round(
            self.learning_rate_cooldown_fraction * self.learning_rate_horizon
        )


def _require(ok: bool, flag: str, value: Any, what: str) -> None:
    if not ok:
        raise ValueError(f"--{flag}={value}: {what}")


# ---- Job-level flags: checked by each process's job config, and by launchers before starting.

# Emulator frames per agent step in the DeepMind Atari setup, unless --frame_skip says otherwise
# (`impala.envs` uses it; here, the checks and run identities need no environments).
ATARI_FRAME_SKIP = 4
MAX_ACTION_REPEATS = (2**31 - 1) // ATARI_FRAME_SKIP
# Atari frame skips: at least 2, since each step max-pools its last two frames; at most as many
# as keep `frame_skip * num_action_repeats` within ALE's 32-bit frame counts.
MIN_FRAME_SKIP = 2
# TensorFlow makes the threads it is given: a typo must not ask it for millions.
MAX_ACTOR_THREADS = 256


def check_repeat_action_probability(value: Any) -> None:
    """Raises the one-line error of a bad --repeat_action_probability (Atari's sticky actions)."""
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    _require(
        is_number and 0 <= value < 1,  # 1 would repeat the first action for ever
        "repeat_action_probability",
        value if is_number else repr(value),
        "must be a number in [0, 1) (0: no sticky actions; 0.25: Gymnasium v5's)",
    )


# How an Atari step's observed frame is made from the emulator frames it ran: "max", DeepMind's,
# the pixel-wise maximum of its last two (against sprites drawn on alternate frames); "last",
# its last frame alone.
FRAME_POOLING_CHOICES = ("max", "last")


def check_frame_pooling(value: Any) -> None:
    """Raises the one-line error of a bad --frame_pooling (Atari's; "max": DeepMind's)."""
    _require(
        value in FRAME_POOLING_CHOICES,
        "frame_pooling",
        repr(value),
        f"must be one of {', '.join(FRAME_POOLING_CHOICES)} (max: the maximum of a step's last "
        "two frames, DeepMind's; last: its last frame)",
    )


def check_frame_skip(frame_skip: Any, num_action_repeats: int = 1) -> None:
    """Raises the one-line error of a bad --frame_skip (Atari's; 0: the default, 4)."""
    is_int = isinstance(frame_skip, numbers.Integral) and not isinstance(frame_skip, bool)
    _require(
        is_int and (frame_skip == 0 or frame_skip >= MIN_FRAME_SKIP),
        "frame_skip",
        frame_skip if is_int else repr(frame_skip),
        f"must be 0 (the default: 4, DeepMind's) or an integer of at least {MIN_FRAME_SKIP} "
        "(each step max-pools its last two frames)",
    )
    _require(
        frame_skip * num_action_repeats <= 2**31 - 1,
        "frame_skip",
        frame_skip,
        f"times --num_action_repeats={num_action_repeats} exceeds 2**31 - 1, the largest frame "
        "count ALE keeps",
    )


def check_playing_flags(
    num_action_repeats: int,
    seed: int,
    repeat_action_probability: float,
    frame_skip: int,
    frame_pooling: str = "max",
) -> None:
    """Raises the one-line error of a bad --num_action_repeats, --seed,
    --repeat_action_probability, --frame_skip or --frame_pooling (every training role)."""
    _require(
        num_action_repeats >= 1,
        "num_action_repeats",
        num_action_repeats,
        "must be at least 1 (1: no repeat beyond the Atari frame skip)",
    )
    _require(
        num_action_repeats <= MAX_ACTION_REPEATS,
        "num_action_repeats",
        num_action_repeats,
        f"must be at most {MAX_ACTION_REPEATS} (x 4, Atari's frame skip is a 32-bit integer)",
    )
    _require(seed >= 0, "seed", seed, "must be >= 0")
    check_repeat_action_probability(repeat_action_probability)
    check_frame_skip(frame_skip, num_action_repeats)
    check_frame_pooling(frame_pooling)


def check_learner_job_flags(
    queue_capacity: int,
    batch_size: int,
    keep_checkpoints: int,
    save_every_secs: float,
    keep_checkpoint_every_frames: float = 0,
) -> None:
    """Raises the one-line error of a learner flag out of range."""
    _require(queue_capacity >= 0, "queue_capacity", queue_capacity, "must be >= 0")
    _require(
        queue_capacity == 0 or queue_capacity >= batch_size,
        "queue_capacity",
        queue_capacity,
        f"must be 0 or at least --batch_size={batch_size}, or no batch ever fills",
    )
    _require(keep_checkpoints >= 1, "keep_checkpoints", keep_checkpoints, "must be at least 1")
    _require(
        keep_checkpoint_every_frames == 0 or 1 <= keep_checkpoint_every_frames < math.inf,
        "keep_checkpoint_every_frames",
        keep_checkpoint_every_frames,
        "must be 0 (none) or a finite number of frames >= 1",
    )
    _require(
        0 < save_every_secs < math.inf,
        "save_every_secs",
        save_every_secs,
        "must be a finite number > 0",
    )


def check_actor_job_flags(
    num_envs_per_actor: int, connect_timeout_secs: float, actor_threads: int
) -> None:
    """Raises the one-line error of an actor flag out of range."""
    _require(
        num_envs_per_actor >= 1, "num_envs_per_actor", num_envs_per_actor, "must be at least 1"
    )
    _require(
        1 <= actor_threads <= MAX_ACTOR_THREADS,
        "actor_threads",
        actor_threads,
        f"must be from 1 to {MAX_ACTOR_THREADS}",
    )
    _require(
        0 < connect_timeout_secs < math.inf,
        "connect_timeout_secs",
        connect_timeout_secs,
        "must be a finite number > 0",
    )


def check_test_flags(test_num_episodes: int) -> None:
    """Raises the one-line error of a --mode=test flag out of range."""
    _require(test_num_episodes >= 1, "test_num_episodes", test_num_episodes, "must be at least 1")


def check_learner_hosts(learner_hosts: tuple[str, ...]) -> None:
    """Raises a one-line error unless `--learner_hosts` is a non-empty list of host:port."""
    if not learner_hosts:
        raise ValueError("--learner_hosts is empty: give one host:port per learner")
    for address in learner_hosts:
        parse_address(address, "--learner_hosts")
    repeated = sorted({a for a in learner_hosts if learner_hosts.count(a) > 1})
    if repeated:
        raise ValueError(f"--learner_hosts: {', '.join(repeated)} named twice; one per learner")


def parse_address(address: str, flag: str) -> tuple[str, int]:
    """Splits "host:port" ("[v6 address]:port" too), raising a one-line error naming `flag`.

    The host is a name or address: no spaces, control characters or a leading '-'.
    """
    host, _, port = address.rpartition(":")
    if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise ValueError(f"{flag}: {address!r} is not host:port with a port in 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or "[" in host or "]" in host:
            raise ValueError(f"{flag}: {address!r}: the brackets hold one IPv6 address")
    elif "[" in host or "]" in host:
        raise ValueError(f"{flag}: {address!r}: the brackets hold one IPv6 address")
    elif ":" in host:
        # "::1:8000" could be port 8000 of ::1 or the address ::1:8000 with no port.
        raise ValueError(
            f"{flag}: {address!r}: an IPv6 address takes brackets, as in [{host}]:{port}"
        )
    if not host or host.startswith("-") or not all(c.isprintable() and c not in " /" for c in host):
        raise ValueError(f"{flag}: {address!r}: {host!r} is not a host name or address")
    return host, int(port)
