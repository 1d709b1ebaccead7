"""experiment.py's flags reach the job configs of the roles that use them."""

import os
import signal

import pytest
from absl import flags
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
    assert actor.game.repeat_action_probability == 0.25
    assert local.game.repeat_action_probability == 0.25


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
    assert [config.game.frame_skip for config in _roles("--frame_skip=3")] == [3, 3, 3, 3]


def test_the_frame_pooling_reaches_every_role_and_the_evaluation():
    *training, evaluation = _roles("--frame_pooling=last")
    assert [config.game.frame_pooling for config in training] == ["last"] * 3
    assert evaluation.game.frame_pooling == "last" and evaluation.given == ("frame_pooling",)
    # Not given, --mode=test plays with the checkpoint's, training with the default.
    *training, evaluation = _roles()
    assert [config.game.frame_pooling for config in training] == ["max"] * 3
    assert evaluation.given == ()


def test_every_role_holds_the_game_the_flags_give():
    argv = ("--level_name=CartPole-v1", "--num_action_repeats=2", "--seed=7", "--frame_skip=0")
    *training, evaluation = _roles(*argv)
    game = training[0].game
    assert (game.level_name, game.num_action_repeats, game.seed) == ("CartPole-v1", 2, 7)
    assert all(config.game == game for config in [*training, evaluation])
    # Given, they are checked against the checkpoint's (a --frame_skip of 0 says "its own").
    assert evaluation.given == ("level_name", "frame_skip")


def test_without_the_flag_there_are_no_sticky_actions():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py"])
        experiment.apply_preset()
        assert experiment.local_config_from_flags().game.repeat_action_probability == 0.0
        assert experiment.local_config_from_flags().game.frame_skip == 0  # Atari's 4


def test_sample_factorys_num_epochs_is_batch_reuse_under_its_name():
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--num_epochs=3", "--num_batches_per_epoch=2"])
        experiment.apply_preset()
        config = experiment.learner_config_from_flags()
        given = experiment.flag_values(only_given=True)
        saved = experiment.flag_values()
    assert (config.batch_reuse, config.num_batches_per_epoch) == (3, 2)
    # What launchers forward and a run's flags.json keep: the flag's own name only.
    assert given == {"batch_reuse": 3, "num_batches_per_epoch": 2}
    assert "num_epochs" not in saved and saved["batch_reuse"] == 3


def test_the_precision_and_the_gradient_compression_refuse_what_they_do_not_know():
    for flag in ("--compute_dtype=float16", "--gradient_compression=zip"):
        with flagsaver.flagsaver():
            FLAGS.unparse_flags()
            with pytest.raises(flags.IllegalFlagValueError, match="value should be one of"):
                FLAGS(["experiment.py", flag])
    # A learner built in Python is refused the same way.
    from impala.learner import allreduce

    with pytest.raises(ValueError, match=r"^--gradient_compression=zip: must be one of none, fp16"):
        allreduce.tape_wrapper("zip")


def test_the_progress_interval_reaches_the_learner_and_the_single_process_trainer():
    _, learner, local, _ = _roles("--log_every_secs=1")
    assert learner.log_every_secs == local.log_every_secs == 1.0
    _, learner, local, _ = _roles()
    assert learner.log_every_secs == local.log_every_secs == 5.0  # the default, as before
    for value in ("-1", "inf", "nan"):
        with pytest.raises(ValueError, match=rf"^--log_every_secs={value}.*: must be a finite"):
            _roles(f"--log_every_secs={value}")


def test_a_stop_signal_stops_once_and_a_second_one_does_not_cut_the_stop_short():
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    before = {signum: signal.getsignal(signum) for signum in stop_signals}
    try:
        signal.signal(signal.SIGTERM, experiment._interrupt)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        # While the process runs its clean-up, a launcher's SIGTERM after the terminal's
        # Ctrl-C: no second KeyboardInterrupt in the middle of it. (SIGTERM first: unhandled,
        # SIGUSR1 would end the test's process.)
        try:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                signal.raise_signal(signum)
        except KeyboardInterrupt:
            pytest.fail(f"{signal.Signals(signum).name} interrupted the stop a second time")
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _unset_for_the_test(monkeypatch, name):
    # Set first, so that what the test sets is removed after it too: this worker's later
    # subprocesses (learners of several) must not inherit it.
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


def _keras_switch_after(monkeypatch, *argv, world_size=None):
    """TF_USE_LEGACY_KERAS after experiment.py's choice for a process of these flags."""
    _unset_for_the_test(monkeypatch, "TF_USE_LEGACY_KERAS")
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE"):
        _unset_for_the_test(monkeypatch, name)
    if world_size:
        monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", world_size)
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", *argv])
        experiment._leave_out_keras()
    return os.environ.get("TF_USE_LEGACY_KERAS")


@pytest.mark.parametrize(
    "argv, keras",
    [
        (["--job_name=actor"], False),
        (["--job_name=local"], False),
        (["--mode=test", "--job_name=learner", "--learner_hosts=a:1,b:1"], False),
        (["--job_name=learner", "--learner_hosts=a:1"], False),
        # Horovod's module needs Keras: learners of several load it.
        (["--job_name=learner", "--learner_hosts=a:1,b:1"], True),
    ],
)
def test_only_learners_of_several_have_tensorflow_load_keras(monkeypatch, argv, keras):
    assert (_keras_switch_after(monkeypatch, *argv) is None) == keras


def test_a_learner_that_mpirun_started_among_several_has_keras_loaded(monkeypatch):
    # However many --learner_hosts say: its start refuses the mismatch after Horovod's import.
    switch = _keras_switch_after(
        monkeypatch, "--job_name=learner", "--learner_hosts=a:1", world_size="2"
    )
    assert switch is None


def test_the_users_keras_switch_is_kept(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["experiment.py", "--job_name=actor"])
        experiment._leave_out_keras()
    assert os.environ["TF_USE_LEGACY_KERAS"] == "0"
