"""experiment.py's --preset: named hyperparameters for the flags not given explicitly."""

import pytest
from absl.testing import flagsaver

import experiment
import networks
from impala import configs
from impala import flags as impala_flags
from impala.learner import optimise

FLAGS = experiment.FLAGS


# Values unlike every default, so that a preset that is not applied shows.
_TEST_PRESET = {"optimizer": "rmsprop", "epsilon": 1e-8, "batch_reuse": 3, "batch_size": 7}


@pytest.fixture
def test_preset(monkeypatch):
    monkeypatch.setitem(experiment.PRESETS, "paper", _TEST_PRESET)


def _config_from(*argv):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", *argv])
        experiment.apply_preset()
        return (
            experiment.learner_config_from_flags(),
            experiment.flag_values(),
            experiment.flag_values(only_given=True),
        )


def test_a_preset_sets_the_flags_not_given_and_only_given_flags_are_forwarded(test_preset):
    config, values, given = _config_from("--preset=paper", "--batch_size=8")
    assert (config.optimizer, config.epsilon, config.batch_reuse) == ("rmsprop", 1e-8, 3)
    assert config.batch_size == 8  # given on the command line: it wins
    # What a run folder's flags.json records: the values used, the preset among them.
    assert values["preset"] == "paper" and values["batch_reuse"] == 3
    # What launchers forward: the preset itself, which every process applies again.
    assert given == {"preset": "paper", "batch_size": 8}
    assert not FLAGS["batch_reuse"].present


def test_the_paper_preset_holds_the_papers_values():
    paper = experiment.PRESETS["paper"]
    assert (paper["optimizer"], paper["learning_rate"], paper["epsilon"]) == ("rmsprop", 6e-4, 0.01)
    assert (paper["batch_size"], paper["unroll_length"], paper["batch_reuse"]) == (32, 20, 1)
    assert (paper["vtrace_lambda"], paper["gradients_clipping"]) == (1.0, 40.0)
    assert (paper["policy_clip"], paper["normalize_advantages"]) == (0.0, False)
    # The defaults are not the paper's (README, "Learning results"): the preset must change them.
    assert all(
        FLAGS[name].default != paper[name]
        for name in (
            "optimizer",
            "batch_size",
            "batch_reuse",
            "policy_clip",
            "epsilon",
            "learning_rate_cooldown_fraction",
        )
    )


def test_the_default_learning_rate_holds_then_falls_to_0_over_the_budgets_last_15_percent():
    # The command, `make train ARGS="--total_environment_frames=10000000"`, which the
    # learning benchmark measures: the rate held to 8.5M, then falling to 0 at 10M.
    short, _, _ = _config_from("--total_environment_frames=10000000")

    def rate(config, frames):
        return float(optimise.annealed_learning_rate(config, frames)) / config.learning_rate

    for frames, expected in [(0, 1.0), (8_500_000, 1.0), (9_250_000, 0.5), (10_000_000, 0.0)]:
        assert rate(short, frames) == pytest.approx(expected), frames
    # The default budget scales the schedule with it; the paper's preset falls from the start.
    default, _, _ = _config_from()
    assert rate(default, 170_000_000) == pytest.approx(1.0)
    assert rate(default, 185_000_000) == pytest.approx(0.5)
    paper, _, _ = _config_from("--preset=paper", "--total_environment_frames=10000000")
    assert rate(paper, 5_000_000) == pytest.approx(0.5)
    # The schedule before 2026-12-04, the first 10M frames of a 200M-frame anneal, is two flags
    # away; one alone is refused in one line, since the default cooldown would never begin.
    before = ("--total_environment_frames=10000000", "--learning_rate_anneal_frames=200e6")
    old, _, _ = _config_from(*before, "--learning_rate_cooldown_fraction=0")
    assert rate(old, 10_000_000) == pytest.approx(0.95)
    with pytest.raises(ValueError, match=r"^--learning_rate_cooldown_fraction=0\.15: the learning"):
        _config_from(*before)


def test_without_a_preset_the_flag_defaults_apply():
    config, values, given = _config_from()
    assert values["preset"] == "" and given == {}
    for name, value in values.items():
        assert value == FLAGS[name].default, name
    assert config.batch_size == FLAGS["batch_size"].default


@pytest.mark.parametrize("name", sorted(experiment.PRESETS["paper"]))
def test_every_preset_flag_is_an_experiment_flag_of_the_right_type(name):
    value = experiment.PRESETS["paper"][name]
    assert name in FLAGS
    assert isinstance(value, type(FLAGS[name].default)), name
    # The network is every role's flag; the replays the learner job's; the rest are the
    # learner's hyperparameters.
    if name == "agent_name":
        assert value in networks.AGENTS
    elif name == "replay_parameters":
        assert configs.replay.parse(value) == ()  # the paper's: every trajectory fresh
    else:
        assert hasattr(configs.LearnerConfig(), name)


def test_the_paper_preset_trains_the_papers_shallow_network_and_a_given_network_wins():
    assert FLAGS["agent_name"].default == "SimpleConvNetAgent"
    _, values, _ = _config_from("--preset=paper")
    assert values["agent_name"] == "ShallowConvNetAgent"
    _, values, given = _config_from("--preset=paper", "--agent_name=ResNetAgent")
    assert values["agent_name"] == given["agent_name"] == "ResNetAgent"


@pytest.mark.parametrize(
    "flag",
    [
        "total_environment_frames",
        "learning_rate_anneal_frames",
        "learning_rate_cooldown_frames",
        "entropy_cost_anneal_frames",
    ],
)
@pytest.mark.parametrize("value", ["inf", "nan", "0.5", "-0.5"])
def test_a_frame_count_that_is_not_a_whole_number_is_a_one_line_error(flag, value):
    # Not truncated first: 0.5 would be refused as 0, and -0.5 taken as 0.
    with pytest.raises(
        ValueError, match=f"^--{flag}={value}: must be a finite, whole number of frames$"
    ):
        _config_from(f"--{flag}={value}")


# Defaults that follow other flags (configs.implied_defaults): half of each batch replayed and 3
# passes over it, unless nothing replays; then every trajectory fresh and 6 passes.
_MIX = configs.replay.DEFAULT
_ELITE = (
    '[{"type": "custom", "capacity": 100, "sample_ratio": 0.5, "dist_function": "ln_norm", '
    '"sample_strategy": "elite_sampling", "lambda_batch_multiplier": 2, '
    '"alfa_annealing_factor": 1.0}, {"type": "queue", "capacity": 1, "sample_ratio": 0.5}]'
)
_QUEUE_ALONE = '[{"type": "queue", "capacity": 2, "sample_ratio": 1.0}]'


@pytest.mark.parametrize(
    "argv, replay_parameters, batch_reuse",
    [
        ((), _MIX, 3),
        (("--col_workers_communication=synchronous",), "", 6),
        (("--queue_capacity=32",), "", 6),
        (("--replay_parameters=",), "", 6),
        ((f"--replay_parameters={_QUEUE_ALONE}",), _QUEUE_ALONE, 6),
        ((f"--replay_parameters={_ELITE}",), _ELITE, 3),
        (("--batch_reuse=5",), _MIX, 5),
        (("--num_epochs=2", "--replay_parameters="), "", 2),  # the alias is the flag given
        (("--col_workers_communication=synchronous", "--batch_reuse=4"), "", 4),
        (("--preset=paper",), "", 1),
        (("--batch_size=1",), "", 6),  # no half of the batch to replay
    ],
)
def test_the_replay_mix_and_the_passes_follow_what_replays(argv, replay_parameters, batch_reuse):
    config, values, given = _config_from(*argv)
    assert values["replay_parameters"] == replay_parameters
    assert values["batch_reuse"] == config.batch_reuse == batch_reuse
    # Implied, not given: launchers forward what the user gave, and each process implies again.
    assert "replay_parameters" not in given or "--replay_parameters" in " ".join(argv)


def test_a_process_that_trains_alone_trains_on_fresh_trajectories_six_times():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py"])
        experiment.apply_preset(single_process=True)
        assert (FLAGS.replay_parameters, FLAGS.batch_reuse) == ("", 6)


def test_synchronous_collection_refuses_a_replay_mix_it_is_given_in_one_line():
    with pytest.raises(ValueError, match=r"^--col_workers_communication=synchronous: cannot take"):
        _config_from_job("--col_workers_communication=synchronous", f"--replay_parameters={_MIX}")
    # Without the flag there is nothing to refuse: the default then replays nothing.
    _config_from_job("--col_workers_communication=synchronous")


def test_launchers_check_the_values_the_processes_will_imply():
    with impala_flags.as_forwarded({"col_workers_communication": "synchronous"}):
        assert (FLAGS.replay_parameters, FLAGS.batch_reuse) == ("", 6)
        experiment.check_run_flags(given=["col_workers_communication"])
    with impala_flags.as_forwarded({}):
        assert (FLAGS.replay_parameters, FLAGS.batch_reuse) == (_MIX, 3)
    with impala_flags.as_forwarded({"batch_reuse": 2, "queue_capacity": 16}):
        assert (FLAGS.replay_parameters, FLAGS.batch_reuse) == ("", 2)


def _config_from_job(*argv):
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", *argv])
        experiment.apply_preset()
        experiment.check_run_flags(given=experiment.flag_values(only_given=True))
