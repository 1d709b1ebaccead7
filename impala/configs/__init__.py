"""Every setting of a run, declared once, and the configs each role is built from.

A setting is a field of one of these frozen dataclasses (`declare.setting`): its name, type,
default, allowed values and help. `impala/flags.py` makes experiment.py's flags from the fields,
experiment.py builds the configs from the flags, and each config checks its values in
`__post_init__` with one-line errors naming the flag. To add a hyperparameter, add a field to
`LearnerConfig` and use it.

  game.py       GameConfig: how the games are played (every role holds one)
  learner.py    LearnerConfig: the hyperparameters; PRESETS (the paper's values)
  pbt.py        PbtConfig: population-based training (Sample Factory's flag names)
  roles.py      LearnerJobConfig, ActorJobConfig, LocalConfig
  evaluation.py EvalConfig: --mode=test
  addresses.py  the learners' host:port
  declare.py    `setting` and the checks the declarations share

TensorFlow-free: launchers and the frontend check a run's flags with these before starting
anything.
"""

from impala.configs.addresses import check_learner_hosts, parse_address
from impala.configs.evaluation import POLICIES, EvalConfig
from impala.configs.game import (
    ATARI_FRAME_SKIP,
    FRAME_POOLING_CHOICES,
    MAX_ACTION_REPEATS,
    MIN_FRAME_SKIP,
    GameConfig,
    check_frame_pooling,
    check_frame_skip,
    check_repeat_action_probability,
)
from impala.configs.learner import (
    OPTIMIZER_CHOICES,
    POLICY_CLIP_CENTER_CHOICES,
    PRESETS,
    REWARD_CLIPPING_CHOICES,
    LearnerConfig,
    preset_config,
)
from impala.configs.pbt import PbtConfig
from impala.configs.roles import (
    COMPUTE_DTYPES,
    DEFAULT_AGENT_NAME,
    GRADIENT_COMPRESSIONS,
    IMPLIED_FLAGS,
    MAX_ACTOR_THREADS,
    ActorJobConfig,
    LearnerJobConfig,
    LocalConfig,
    implied_defaults,
    implied_to_keep,
)

# The configs whose declared fields are experiment.py's flags, in the order --help lists them.
DECLARING = (GameConfig, LearnerConfig, PbtConfig, LearnerJobConfig, ActorJobConfig, EvalConfig)

__all__ = [
    "ATARI_FRAME_SKIP",
    "COMPUTE_DTYPES",
    "DECLARING",
    "DEFAULT_AGENT_NAME",
    "FRAME_POOLING_CHOICES",
    "GRADIENT_COMPRESSIONS",
    "IMPLIED_FLAGS",
    "MAX_ACTION_REPEATS",
    "MAX_ACTOR_THREADS",
    "MIN_FRAME_SKIP",
    "OPTIMIZER_CHOICES",
    "POLICIES",
    "POLICY_CLIP_CENTER_CHOICES",
    "PRESETS",
    "REWARD_CLIPPING_CHOICES",
    "ActorJobConfig",
    "EvalConfig",
    "GameConfig",
    "LearnerConfig",
    "LearnerJobConfig",
    "LocalConfig",
    "PbtConfig",
    "check_frame_pooling",
    "check_frame_skip",
    "check_learner_hosts",
    "check_repeat_action_probability",
    "implied_defaults",
    "implied_to_keep",
    "parse_address",
    "preset_config",
]
