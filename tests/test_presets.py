"""experiment.py's --preset: named hyperparameters for the flags not given explicitly."""

import pytest
from absl.testing import flagsaver

import experiment
import learner

FLAGS = experiment.FLAGS


def _config_from(*argv):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", *argv])
        experiment.apply_preset()
        return experiment.learner_config_from_flags(), experiment.flag_values()


def test_paper_preset_gives_the_papers_values_and_given_flags_win():
    config, values = _config_from("--preset=paper", "--batch_size=8")
    paper = experiment.PRESETS["paper"]
    assert config.optimizer == "rmsprop" and config.epsilon == paper["epsilon"] == 0.01
    assert config.batch_reuse == 1 and config.vtrace_lambda == 1.0
    assert config.batch_size == 8  # given on the command line
    # What a run folder's flags.json records: the values used, the preset among them.
    assert values["preset"] == "paper" and values["decay"] == 0.99 and values["batch_size"] == 8


def test_without_a_preset_the_flag_defaults_apply():
    config, values = _config_from()
    assert values["preset"] == ""
    for name, value in values.items():
        assert value == FLAGS[name].default, name
    assert config.batch_size == FLAGS["batch_size"].default


@pytest.mark.parametrize("name", sorted(experiment.PRESETS["paper"]))
def test_every_preset_flag_is_an_experiment_flag_of_the_right_type(name):
    value = experiment.PRESETS["paper"][name]
    assert name in FLAGS
    assert isinstance(value, type(FLAGS[name].default)), name
    assert hasattr(learner.LearnerConfig(), name)
