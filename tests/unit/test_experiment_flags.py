"""experiment.py's flags reach the job configs of the roles that use them."""

from absl.testing import flagsaver

import experiment

FLAGS = experiment.FLAGS


def test_sticky_actions_reach_the_actors_and_the_single_process_trainer():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(
            [
                "experiment.py",
                "--repeat_action_probability=0.25",
                "--learner_hosts=localhost:8001",
                "--secret_file=secret",
            ]
        )
        experiment.apply_preset()
        actor = experiment.actor_job_config_from_flags()
        local = experiment.local_config_from_flags()
    assert actor.repeat_action_probability == 0.25
    assert local.repeat_action_probability == 0.25


def _roles(*argv):
    """The job configs of the actor, the learner, the single-process trainer and --mode=test
    for these flags."""
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(
            [
                "experiment.py",
                *argv,
                "--learner_hosts=localhost:8001",
                "--secret_file=secret",
                "--checkpoint=runs/x",
            ]
        )
        experiment.apply_preset()
        return (
            experiment.actor_job_config_from_flags(),
            experiment.learner_job_config_from_flags(),
            experiment.local_config_from_flags(),
            experiment.evaluation_config_from_flags(),
        )


def test_transport_tls_reaches_the_learners_and_the_actors():
    actor, learner, *_ = _roles("--transport_tls")
    assert actor.transport_tls and learner.transport_tls
    actor, learner, *_ = _roles()
    assert not (actor.transport_tls or learner.transport_tls)  # off by default


def test_private_run_files_reach_the_learners_and_are_the_default():
    _, learner, *_ = _roles()
    assert learner.private_files
    _, learner, *_ = _roles("--noprivate_run_files")
    assert not learner.private_files


def test_the_frame_skip_reaches_every_role_and_the_evaluation():
    assert [config.frame_skip for config in _roles("--frame_skip=3")] == [3, 3, 3, 3]


def test_the_frame_pooling_reaches_every_role_and_the_evaluation():
    given = _roles("--frame_pooling=last")
    assert [config.frame_pooling for config in given] == ["last"] * 4
    # Not given, --mode=test plays with the checkpoint's (None), training with the default.
    assert [config.frame_pooling for config in _roles()] == ["max", "max", "max", None]


def test_without_the_flag_there_are_no_sticky_actions():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py"])
        experiment.apply_preset()
        assert experiment.local_config_from_flags().repeat_action_probability == 0.0
        assert experiment.local_config_from_flags().frame_skip == 0  # Atari's 4
