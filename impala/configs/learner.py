"""The learner's hyperparameters, `LearnerConfig`, with today's defaults, and the presets: named
sets of values for them (the IMPALA paper's)."""

from __future__ import annotations

import dataclasses

from impala.configs.declare import (
    at_least,
    check_settings,
    config,
    finite,
    non_negative,
    rule,
    setting,
    within,
)

REWARD_CLIPPING_CHOICES = ("abs_one", "soft_asymmetric", "none")
OPTIMIZER_CHOICES = ("rmsprop", "adam")
POLICY_CLIP_CENTER_CHOICES = ("behaviour", "learner")
# --batch_reuse's defaults: passes over a batch that mixes in replayed trajectories (half of it,
# by default), and over a batch of fresh ones only (roles.implied_defaults chooses).
BATCH_REUSE_REPLAYING = 3
BATCH_REUSE_FRESH = 6


@config
class LearnerConfig:
    """The hyperparameters of the loss, its optimiser and their schedules: the same for every
    learner of a run. The defaults are PPO's Atari settings on V-trace's targets; the paper's
    are `PRESETS["paper"]`. `learning_rate` and `entropy_cost` are the base values the
    schedules start from, which the learner may change while a run goes
    (`Trainer.set_hyperparameters`)."""

    batch_size: int = setting(16, "Trajectories per learner batch.", check=at_least(1))
    unroll_length: int = setting(20, "Agent steps per trajectory.", check=at_least(1))
    batch_reuse: int = setting(
        BATCH_REUSE_REPLAYING,
        "Passes (epochs) the learner makes over each batch, each of --num_batches_per_epoch "
        "optimisation steps (V-trace corrects for the policy having moved); Sample Factory's "
        "--num_epochs, which is accepted too. Default 3 when batches mix in replayed "
        f"trajectories (--replay_parameters' default), {BATCH_REUSE_FRESH} when every "
        "trajectory is fresh: either way each fresh trajectory is trained on about 6 times.",
        check=at_least(1),
        aliases=("num_epochs",),
    )
    num_batches_per_epoch: int = setting(
        1,
        "Minibatches each pass over a batch is split into, by trajectory, shuffled every pass: "
        "one optimisation step each (a minibatch's share of --gradients_clipping). "
        "--batch_size must be a multiple of it. Sample Factory's name.",
        check=at_least(1),
    )
    discounting: float = setting(0.99, "Discount factor.", check=within(0, 1))
    vtrace_lambda: float = setting(
        0.95,
        "V-trace's trace decay in [0, 1], like GAE's lambda: lower bootstraps sooner, with less "
        "variance and more bias.",
        check=within(0, 1),
    )
    normalize_advantages: bool = setting(
        True,
        "Scale each batch's policy-gradient advantages to mean 0 and standard deviation 1, as "
        "PPO does.",
    )
    policy_clip: float = setting(
        0.1,
        "0: IMPALA's V-trace policy gradient. In (0, 1): PPO's clipped surrogate objective with "
        "this epsilon, its advantages from the V-trace targets (as Sample Factory's APPO), which "
        "bounds how far several steps on one batch (--batch_reuse) move the policy.",
        check=within(0, 1, include_high=False),
    )
    policy_clip_center: str = setting(
        "behaviour",
        "With --policy_clip: the policy whose ratio the surrogate clips. behaviour: the policy "
        "that acted (pi / mu). learner: the learner's own when the batch arrived (pi / pi_prox, "
        "weighted by min(1, pi_prox / mu)), PPO's objective decoupled from the behaviour policy "
        "(Hilton et al. 2021).",
        choices=POLICY_CLIP_CENTER_CHOICES,
    )
    baseline_cost: float = setting(0.5, "Weight of the baseline loss.", check=finite())
    entropy_cost: float = setting(
        0.01,
        "Weight of the entropy bonus (where --entropy_cost_anneal_frames starts).",
        check=finite(),
    )
    entropy_cost_anneal_frames: int = setting(
        0,
        "Emulator frames over which the entropy bonus's weight moves linearly from "
        "--entropy_cost to --entropy_cost_final, staying there after (0: --entropy_cost "
        "throughout).",
        check=non_negative(" (0: --entropy_cost throughout)"),
        frames=True,
    )
    entropy_cost_final: float = setting(
        0.0,
        "The entropy bonus's weight at the end of --entropy_cost_anneal_frames and after.",
        check=finite(),
    )
    reward_clipping: str = setting(
        "abs_one", "How rewards are clipped in the loss.", choices=REWARD_CLIPPING_CHOICES
    )
    gradients_clipping: float = setting(
        160.0,
        "Clip gradients to this global norm; 0 or less turns clipping off. The loss is a sum "
        "over the batch's steps: 160 over 16 x 20 steps is PPO's 0.5 on a mean. A minibatch "
        "(--num_batches_per_epoch) clips at its share of it.",
        check=rule(lambda value: value == value, "must be a number (<= 0 turns clipping off)"),
    )
    optimizer: str = setting(
        "adam",
        "adam: Adam (epsilon outside the square root). rmsprop: TensorFlow 1's RMSProp (epsilon "
        "inside the square root), as in the IMPALA paper.",
        choices=OPTIMIZER_CHOICES,
    )
    learning_rate: float = setting(
        2.5e-4,
        "Learning rate: held, then annealed linearly to 0 (see --learning_rate_cooldown_fraction).",
        check=finite(positive=True),
    )
    decay: float = setting(
        0.999,
        "RMSProp's decay; Adam's second-moment decay (beta2).",
        check=within(0, 1, include_high=False),
    )
    momentum: float = setting(
        0.0,
        "RMSProp's momentum (Adam's beta1 is 0.9).",
        check=within(0, 1, include_high=False),
    )
    epsilon: float = setting(1e-5, "The optimiser's epsilon.", check=finite(positive=True))
    total_environment_frames: int = setting(
        200_000_000,
        "Training budget in emulator frames (agent steps x frame skip x repeats).",
        check=at_least(1),
        frames=True,
    )
    learning_rate_anneal_frames: int = setting(
        0,
        "The learning-rate schedule's horizon in emulator frames, where it reaches 0; the "
        "frame budget if that is longer, so that the rate never reaches 0 before the run ends "
        "(0: the budget).",
        check=non_negative(" (0: the frame budget)"),
        frames=True,
    )
    learning_rate_cooldown_frames: int = setting(
        0,
        "The learning rate holds at --learning_rate until this many emulator frames before the "
        "horizon's end, then falls linearly to 0 over them. 0: --learning_rate_cooldown_fraction "
        "decides. A cooldown that would begin after the budget is refused.",
        check=non_negative(" (0: the rate falls from the start)"),
        frames=True,
    )
    learning_rate_cooldown_fraction: float = setting(
        0.15,
        "The cooldown as a share of the schedule's horizon, unless "
        "--learning_rate_cooldown_frames is set: 0.15 holds the rate for the first 85% and lets "
        "it fall over the last 15% (0 or 1: it falls from the start).",
        check=within(0, 1),
    )

    def __post_init__(self):
        check_settings(self)
        if self.optimizer != "rmsprop" and self.momentum != 0.0:
            raise ValueError(
                f"--momentum={self.momentum}: is RMSProp's; --optimizer=adam has its own (beta1 "
                "0.9): leave --momentum at 0"
            )
        if self.batch_size % self.num_batches_per_epoch:
            raise ValueError(
                f"--num_batches_per_epoch={self.num_batches_per_epoch}: must divide "
                f"--batch_size={self.batch_size} (minibatches of whole trajectories, all the "
                "same size)"
            )
        self._check_cooldown_begins_within_the_budget()

    def _check_cooldown_begins_within_the_budget(self) -> None:
        """A cooldown that would begin after the run ends is a schedule that never falls: most
        likely one meant for the budget, on a longer horizon given in frames."""
        horizon, cooldown = self.learning_rate_horizon, self.learning_rate_cooldown
        if not 0 < cooldown < horizon or horizon - cooldown < self.total_environment_frames:
            return
        if self.learning_rate_cooldown_frames:
            given = f"--learning_rate_cooldown_frames={self.learning_rate_cooldown_frames}"
        else:
            given = f"--learning_rate_cooldown_fraction={self.learning_rate_cooldown_fraction}"
        raise ValueError(
            f"{given}: the learning rate would begin to fall at {horizon - cooldown} frames, "
            f"after the --total_environment_frames={self.total_environment_frames} budget "
            f"(--learning_rate_anneal_frames={self.learning_rate_anneal_frames}); give "
            "--learning_rate_anneal_frames=0 for a cooldown that ends with the budget, or "
            "--learning_rate_cooldown_fraction=0 to anneal over the whole horizon"
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


# Named sets of flag values, for the flags not given on the command line (--preset). "paper": the
# IMPALA paper's Atari hyperparameters (Espeholt et al. 2018, appendix D.3, and the public
# scalable_agent code) and its shallow network. The defaults differ (docs/learning-history.md):
# with 2 actors and 10M frames the paper's settings leave Pong's policy at random.
PRESETS: dict[str, dict[str, object]] = {
    "paper": {
        "agent_name": "ShallowConvNetAgent",
        "optimizer": "rmsprop",
        "learning_rate": 0.0006,
        "decay": 0.99,
        "momentum": 0.0,
        "epsilon": 0.01,
        "batch_size": 32,
        "unroll_length": 20,
        "batch_reuse": 1,
        "num_batches_per_epoch": 1,
        "replay_parameters": "",
        "vtrace_lambda": 1.0,
        "normalize_advantages": False,
        "policy_clip": 0.0,
        "policy_clip_center": "behaviour",
        "learning_rate_anneal_frames": 0.0,
        "learning_rate_cooldown_frames": 0.0,
        "learning_rate_cooldown_fraction": 0.0,
        "discounting": 0.99,
        "entropy_cost": 0.01,
        "entropy_cost_anneal_frames": 0.0,
        "entropy_cost_final": 0.0,
        "baseline_cost": 0.5,
        "gradients_clipping": 40.0,
        "reward_clipping": "abs_one",
    },
}


def preset_config(name: str, **changes) -> LearnerConfig:
    """The `LearnerConfig` of preset `name`, with `changes`: what its flags give a learner."""
    fields = {field.name for field in dataclasses.fields(LearnerConfig)}
    values = {key: value for key, value in PRESETS[name].items() if key in fields}
    for key, value in values.items():
        if key.endswith("_frames"):
            values[key] = int(value)  # a frame-count flag's float
    return LearnerConfig(**{**values, **changes})
