"""Every setting is declared once, in `impala/configs/`: the flags, the role configs, their checks
and the presets all come from that declaration."""

import dataclasses
import re

import pytest
from absl.testing import flagsaver

import experiment
from impala import configs, flags
from impala.configs.declare import declared, flag_name

FLAGS = experiment.FLAGS
# The flags that choose what a process does rather than set anything of the run.
_PROCESS_FLAGS = {"mode", "job_name", "actor_hosts", "preset"}
_ROLES = (configs.LearnerJobConfig, configs.ActorJobConfig, configs.LocalConfig, configs.EvalConfig)


def _declarations():
    """(flag name, field) of every declared setting, once each."""
    found = {}
    for config_class in configs.DECLARING:
        for field in declared(config_class):
            found.setdefault(flag_name(field), field)
    return sorted(found.items())


def _own_flags():
    return {flag.name: flag for flag in FLAGS.get_flags_for_module(flags)}


@pytest.mark.parametrize("name, field", _declarations())
def test_each_declared_setting_is_a_flag_with_its_default_and_help(name, field):
    flag = _own_flags()[name]
    default = list(field.default) if isinstance(field.default, tuple) else field.default
    assert flag.default == default and type(flag.default) is type(
        float(default) if field.metadata["frames"] else default
    )
    assert flag.help.endswith(field.metadata["help"])  # an enum's begins with its choices
    if field.metadata["choices"]:
        assert flag.parser.enum_values == list(field.metadata["choices"])


def test_every_flag_but_the_process_ones_is_a_declared_setting():
    assert set(_own_flags()) == _PROCESS_FLAGS | {name for name, _ in _declarations()}


def test_the_configs_defaults_are_the_flags_defaults():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py"])
        experiment.apply_preset()
        assert experiment.learner_config_from_flags() == configs.LearnerConfig()
        assert experiment.game_config_from_flags() == configs.GameConfig()
        learner = experiment.learner_job_config_from_flags()
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--job_name=local"])
        experiment.apply_preset(single_process=True)
        local = experiment.local_config_from_flags()
    assert dataclasses.replace(learner, flag_values={}) == configs.LearnerJobConfig()
    # One process has no replay: 6 passes over each batch of fresh trajectories, not 3.
    assert local == configs.LocalConfig() and local.learner.batch_reuse == 6


def test_the_paper_preset_is_the_paper_config_and_only_there():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--preset=paper"])
        experiment.apply_preset()
        assert experiment.learner_config_from_flags() == configs.preset_config("paper")
    assert configs.preset_config("paper") != configs.LearnerConfig()
    assert configs.preset_config("paper", batch_size=8).batch_size == 8


def test_every_role_holds_the_game_as_one_config():
    game_settings = {field.name for field in dataclasses.fields(configs.GameConfig)}
    for role in _ROLES:
        fields = {field.name: field for field in dataclasses.fields(role)}
        assert fields["game"].type == "GameConfig", role.__name__
        assert not game_settings & set(fields), role.__name__


@pytest.mark.parametrize("name, field", _declarations())
def test_help_says_what_a_flag_does_today_briefly(name, field):
    help_text = field.metadata["help"]
    # No history: dates, what a default used to be.
    assert not re.search(r"\b20\d\d-\d\d|default was|used to be|\bno longer\b", help_text), name
    assert len(help_text) <= 400, name


@pytest.mark.parametrize(
    "config_class, field, value, message",
    [
        (configs.GameConfig, "seed", -1, "--seed=-1: must be >= 0"),
        (configs.GameConfig, "level_name", " ", "--level_name= : must be a Gymnasium id"),
        (configs.LearnerConfig, "batch_size", 0, "--batch_size=0: must be at least 1"),
        (configs.EvalConfig, "num_episodes", 0, "--test_num_episodes=0: must be at least 1"),
        (configs.EvalConfig, "policy", "best", "--test_policy='best': must be 'sample' or"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_its_flag(config_class, field, value, message):
    required = {"checkpoint": "c"} if config_class is configs.EvalConfig else {}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}") as raised:
        config_class(**required, **{field: value})
    assert "\n" not in str(raised.value)


def test_a_frame_count_flag_takes_a_float_into_an_int_field():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--total_environment_frames=10e6"])
        config = experiment.learner_config_from_flags()
    assert config.total_environment_frames == 10_000_000
    assert type(config.total_environment_frames) is int
