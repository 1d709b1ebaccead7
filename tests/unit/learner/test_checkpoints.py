"""Checkpoints: round trip, crash-safe and durable "latest", falling back from a damaged one or
one that is not finite (and setting it aside), refusing another run's checkpoint, clearing what
interrupted saves left, weight versions that only grow (a real learner stopped and resumed is
in tests/e2e/test_resume.py)."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

import networks
from impala import configs, trajectory
from impala.learner import checkpoints, optimise
from impala.trajectory import Steps

IDENTITY = {"level_name": "CartPole-v1", "agent_name": "MLPAgent", "num_actions": 2}


def _trainer(seed):
    tf.random.set_seed(seed)
    agent = networks.make_agent("MLPAgent", 2)
    networks.build_variables(agent, (4,), np.float32)
    trainer = optimise.Trainer(agent, configs.LearnerConfig())
    trainer.create_optimizer_slots()
    return agent, trainer


def _values(variables):
    return [v.numpy().copy() for v in variables]


def _train_a_little(agent, trainer):
    rng = np.random.default_rng(0)
    batch = trajectory.Batch(
        agent_state=(),
        steps=Steps(
            prev_action=np.zeros((4, 3), np.int32),
            reward=rng.normal(size=(4, 3)).astype(np.float32),
            done=np.zeros((4, 3), bool),
            observation=rng.normal(size=(4, 3, 4)).astype(np.float32),
            action=rng.integers(0, 2, (4, 3)).astype(np.int32),
            policy_logits=np.zeros((4, 3, 2), np.float32),
        ),
    )
    trainer.step(batch, frames=0)


def test_round_trip_restores_weights_optimizer_state_and_counters(tmp_path):
    agent, trainer = _trainer(seed=0)
    _train_a_little(agent, trainer)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2)
    path = saver.save(frames=12_345, version=7)
    saved = _values(agent.variables), _values(trainer.optimizer.variables)

    fresh_agent, fresh_trainer = _trainer(seed=1)
    assert not np.allclose(_values(fresh_agent.variables)[0], saved[0][0])
    loader = checkpoints.Checkpointer(
        str(tmp_path), fresh_agent, fresh_trainer.optimizer, IDENTITY, keep=2
    )
    assert loader.restore_latest() == path
    for restored, original in zip(_values(fresh_agent.variables), saved[0], strict=True):
        np.testing.assert_array_equal(restored, original)
    for restored, original in zip(
        _values(fresh_trainer.optimizer.variables), saved[1], strict=True
    ):
        np.testing.assert_array_equal(restored, original)
    assert (int(loader.frames), int(loader.version)) == (12_345, 7)


def test_keeps_only_the_last_checkpoints(tmp_path):
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2)
    for version in range(1, 5):
        saver.save(frames=version * 100, version=version)
    indexes = sorted(name for name in os.listdir(tmp_path) if name.endswith(".index"))
    assert indexes == ["ckpt-3.index", "ckpt-4.index"]


def _kept(directory):
    found, problem = checkpoints.listed(str(directory))
    assert problem is None
    on_disk = sorted(name for name in os.listdir(directory) if name.endswith(".index"))
    assert on_disk == sorted(os.path.basename(path) + ".index" for path in found)
    return [int(path.rsplit("-", 1)[1]) for path in found]


def test_keeps_the_first_checkpoint_of_each_multiple_of_frames_too(tmp_path):
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(
        str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2, keep_every_frames=1000
    )
    for version in range(1, 11):  # frames 300, 600, ..., 3000
        saver.save(frames=version * 300, version=version)
    # The first at or after 0, 1000, 2000 and 3000 frames, and the last two.
    assert _kept(tmp_path) == [1, 4, 7, 9, 10]
    # A resumed run (a new Checkpointer) keeps them and goes on: 3300 and 3600 frames are no
    # milestones, 3000's is.
    resumed = checkpoints.Checkpointer(
        str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2, keep_every_frames=1000
    )
    assert resumed.restore_latest() == str(tmp_path / "ckpt-10")
    resumed.save(frames=3300, version=11)
    resumed.save(frames=3600, version=12)
    assert _kept(tmp_path) == [1, 4, 7, 10, 11, 12]
    # One whose frames cannot be read (now) is not deleted on a guess.
    with open(tmp_path / "ckpt-11.index", "r+b") as f:
        f.write(b"garbage")
    resumed.save(frames=3800, version=14)
    assert _kept(tmp_path) == [1, 4, 7, 10, 11, 12, 14]
    # Without the flag the same run keeps only its last ones.
    checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2).save(
        frames=3900, version=15
    )
    assert _kept(tmp_path) == [14, 15]


def test_a_write_interrupted_before_it_completes_never_becomes_latest(tmp_path, monkeypatch):
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    good = saver.save(frames=100, version=1)
    good_weights = _values(agent.variables)

    _train_a_little(agent, trainer)

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash while writing a checkpoint")

    # The data files of checkpoint 2 get written; the process dies before "latest" moves.
    monkeypatch.setattr(checkpoints, "write_state", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        saver.save(frames=200, version=2)
    monkeypatch.undo()
    assert any(name.startswith("ckpt-2") for name in os.listdir(tmp_path))

    fresh_agent, fresh_trainer = _trainer(seed=1)
    loader = checkpoints.Checkpointer(
        str(tmp_path), fresh_agent, fresh_trainer.optimizer, IDENTITY, keep=3
    )
    assert loader.restore_latest() == good
    assert int(loader.frames) == 100
    for restored, original in zip(_values(fresh_agent.variables), good_weights, strict=True):
        np.testing.assert_array_equal(restored, original)


def test_refuses_a_checkpoint_from_another_environment_naming_both(tmp_path):
    agent, trainer = _trainer(seed=0)
    checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=1).save(1, 1)
    other = dict(IDENTITY, level_name="Acrobot-v1")
    loader = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, other, keep=1)
    with pytest.raises(
        checkpoints.CheckpointMismatchError,
        match="level_name: the checkpoint has 'CartPole-v1', this run has 'Acrobot-v1'",
    ):
        loader.restore_latest()


PONG_IDENTITY = {"level_name": "PongNoFrameskip-v4", "agent_name": "MLPAgent", "num_actions": 6}


def _resume(tmp_path, saved: dict, run: dict, refusal: str | None) -> None:
    """Saves a checkpoint of identity `saved` and resumes a run of identity `run` from it:
    refused with `refusal` in the error, or (None) restored."""
    agent, trainer = _trainer(seed=0)
    checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, saved, keep=1).save(1, 1)
    loader = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, run, keep=1)
    if refusal:
        with pytest.raises(checkpoints.CheckpointMismatchError, match=re.escape(refusal)):
            loader.restore_latest()
    else:
        assert loader.restore_latest()


@pytest.mark.parametrize(
    "saved_frames_per_step, run_frames_per_step, refused",
    [
        (4, 4, None),
        (4, 3, 4),  # Another frame skip is another game for the network.
        (None, 8, None),  # From before frames per step were kept: the default skip, 4 x 2.
        (None, 6, 8),  # ... which is not 3 x 2.
    ],
)
def test_a_resume_keeps_the_frame_skip(
    tmp_path, saved_frames_per_step, run_frames_per_step, refused
):
    """`refused`: None, or the checkpoint's frames per step the refusal names."""
    repeats = 1 if saved_frames_per_step else 2
    saved = dict(PONG_IDENTITY, num_action_repeats=repeats)
    if saved_frames_per_step:
        saved["frames_per_step"] = saved_frames_per_step
    run = dict(PONG_IDENTITY, num_action_repeats=repeats, frames_per_step=run_frames_per_step)
    refusal = refused and (
        f"frames_per_step (--frame_skip x --num_action_repeats): the checkpoint has "
        f"{refused}, this run has {run_frames_per_step}"
    )
    _resume(tmp_path, saved, run, refusal)


@pytest.mark.parametrize(
    "saved_pooling, run_pooling, refused",
    [
        ("last", "last", None),
        ("max", "last", "max"),  # Another frame shown for a step is another game too.
        (None, "max", None),  # From before the pooling was kept: the maximum of two frames.
        (None, "last", "max"),
    ],
)
def test_a_resume_keeps_the_frame_pooling(tmp_path, saved_pooling, run_pooling, refused):
    """`refused`: None, or the checkpoint's frame pooling the refusal names."""
    saved = dict(PONG_IDENTITY, num_action_repeats=1, frames_per_step=4)
    if saved_pooling:
        saved["frame_pooling"] = saved_pooling
    run = dict(PONG_IDENTITY, num_action_repeats=1, frames_per_step=4, frame_pooling=run_pooling)
    refusal = refused and (
        f"frame_pooling (--frame_pooling): the checkpoint has '{refused}', this run has "
        f"'{run_pooling}'"
    )
    _resume(tmp_path, saved, run, refusal)


def _saved_run(tmp_path, versions=(1, 2, 3)):
    """Checkpoints at `versions` (100 frames each), with each version's weights."""
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    weights = {}
    for version in versions:
        _train_a_little(agent, trainer)
        saver.save(frames=100 * version, version=version)
        weights[version] = _values(agent.variables)
    return weights


def _loader(tmp_path):
    agent, trainer = _trainer(seed=1)
    return agent, checkpoints.Checkpointer(
        str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3
    )


def _data_file(tmp_path, version):
    (name,) = [n for n in os.listdir(tmp_path) if n.startswith(f"ckpt-{version}.data")]
    return tmp_path / name


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte], ids=["truncated", "corrupt"])
def test_a_damaged_latest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, damage):
    weights = _saved_run(tmp_path)
    damage(_data_file(tmp_path, 3))
    agent, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-2")
    assert int(loader.frames) == 200
    for restored, original in zip(_values(agent.variables), weights[2], strict=True):
        np.testing.assert_array_equal(restored, original)
    line, set_aside, versions = reports
    assert line.startswith(f"checkpoint {tmp_path / 'ckpt-3'} cannot be read (")
    assert line.endswith("; trying the one before") and "\n" not in line
    _check_set_aside(tmp_path, set_aside, versions)


def _check_set_aside(tmp_path, set_aside, versions):
    """ckpt-3 was passed over for ckpt-2: it is in unusable/, holds no kept place, and the
    versions go on above its."""
    assert set_aside == (
        f"set aside ckpt-3 in {tmp_path / 'unusable'}: no longer among the kept checkpoints"
    )
    assert sorted(os.listdir(tmp_path / "unusable")) == sorted(
        ["ckpt-3.index", _data_file(tmp_path / "unusable", 3).name]
    )
    assert _kept(tmp_path) == [1, 2]
    assert versions == (
        "weight versions up to 3 may have been published by an earlier start; going on from "
        "4, not from the checkpoint's 2"
    )
    # The resumed run's saves keep three again: the set-aside one takes no place.
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    saver.save(frames=300, version=4)
    assert _kept(tmp_path) == [1, 2, 4]


def test_the_unusable_folder_keeps_only_the_newest_set_aside_checkpoints(tmp_path):
    # Earlier starts set aside versions 0 and 1 (a file and a folder) and 2; a link of such a
    # name is not followed. Setting aside ckpt-3 now leaves the newest three: 1, 2 and 3.
    _saved_run(tmp_path)
    unusable = tmp_path / "unusable"
    unusable.mkdir()
    (unusable / "ckpt-0.index").write_bytes(b"old")
    (unusable / "ckpt-1_temp").mkdir()
    (unusable / "ckpt-1_temp" / "part").write_bytes(b"old")
    (unusable / "ckpt-2.index").write_bytes(b"old")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "kept").write_bytes(b"not ours")
    os.symlink(outside, unusable / "ckpt-0_temp")
    _truncate(_data_file(tmp_path, 3))
    _, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-2")
    assert (
        f"removed the set-aside checkpoints 0 from {unusable}: it keeps the newest 3"
    ) in reports
    names = sorted(os.listdir(unusable))
    assert "ckpt-0.index" not in names and "ckpt-0_temp" in names  # the link, left alone
    assert {"ckpt-1_temp", "ckpt-2.index", "ckpt-3.index"} <= set(names)
    assert (outside / "kept").read_bytes() == b"not ours"


def test_a_missing_latest_checkpoint_falls_back_too(tmp_path):
    _saved_run(tmp_path)
    for name in os.listdir(tmp_path):
        if name.startswith("ckpt-3."):
            os.remove(tmp_path / name)
    _, loader = _loader(tmp_path)
    assert loader.restore_latest(lambda line: None) == str(tmp_path / "ckpt-2")


def test_when_no_checkpoint_can_be_read_the_restore_refuses_to_start_afresh(tmp_path):
    _saved_run(tmp_path)
    for version in (1, 2, 3):
        _truncate(_data_file(tmp_path, version))
    before = sorted(os.listdir(tmp_path))
    _, loader = _loader(tmp_path)
    with pytest.raises(checkpoints.CheckpointReadError, match="no checkpoint can be used") as e:
        loader.restore_latest(lambda line: None)
    assert "ckpt-1: cannot be read (" in str(e.value)
    assert "refusing to start again from frame 0" in str(e.value)
    assert "\n" not in str(e.value)
    # Nothing is set aside: the run's checkpoints stay where they are, for someone to look at.
    assert sorted(os.listdir(tmp_path)) == before


def _save_as_before_the_check(monkeypatch, saver, frames, version):
    """Saves as learners did before checkpoints were checked for values that are not finite."""
    with monkeypatch.context() as patched:
        patched.setattr(checkpoints.Checkpointer, "_not_finite", lambda self: None)
        return saver.save(frames=frames, version=version)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_checkpoint_that_is_not_finite_is_refused_and_the_previous_one_used(
    tmp_path, monkeypatch, value
):
    """The issue's run: the weights went NaN, were saved as the latest checkpoint, and the
    restarted learner resumed them. Now the restore passes over them, as over a damaged one."""
    weights = _saved_run(tmp_path, versions=(1, 2))
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    agent.variables[0].assign(tf.fill(agent.variables[0].shape, value))
    _save_as_before_the_check(monkeypatch, saver, frames=300, version=3)

    restored_agent, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-2")
    assert int(loader.frames) == 200
    for restored, original in zip(_values(restored_agent.variables), weights[2], strict=True):
        np.testing.assert_array_equal(restored, original)
    line, set_aside, versions = reports
    assert re.fullmatch(
        rf"checkpoint {re.escape(str(tmp_path / 'ckpt-3'))} holds values that are not finite "
        rf"\(1 of \d+ variables, such as {re.escape(agent.variables[0].name)}\); trying the one "
        "before",
        line,
    )
    _check_set_aside(tmp_path, set_aside, versions)


def test_optimizer_state_that_is_not_finite_is_refused_too(tmp_path, monkeypatch):
    _saved_run(tmp_path, versions=(1,))
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    slot = trainer.optimizer.v[0]  # Adam's second moment: a gradient whose square overflowed
    slot.assign(tf.fill(slot.shape, np.inf))
    _save_as_before_the_check(monkeypatch, saver, frames=200, version=2)
    reports = []
    assert _loader(tmp_path)[1].restore_latest(reports.append) == str(tmp_path / "ckpt-1")
    assert "ckpt-2 holds values that are not finite (1 of " in reports[0]


@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_save_refuses_a_state_that_is_not_finite_and_writes_nothing(tmp_path, value):
    _saved_run(tmp_path, versions=(1,))
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    variable = agent.variables[-1]
    one_value_off = variable.numpy()
    one_value_off.flat[0] = value
    variable.assign(one_value_off)
    with pytest.raises(
        checkpoints.NotFiniteError,
        match=(
            r"^refusing to checkpoint weight version 2: its state holds values that are not "
            rf"finite \(1 of \d+ variables, such as {re.escape(variable.name)}\)$"
        ),
    ):
        saver.save(frames=200, version=2)
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before


def test_what_interrupted_saves_left_is_removed_at_the_next_start(tmp_path):
    """A save killed in the middle leaves TensorFlow's `ckpt-<N>_temp/` folder of shards (17 MB
    for the issue's network) and temporary files; the next start removes exactly those, and
    follows no link."""
    weights = _saved_run(tmp_path, versions=(1, 2))
    outside = tmp_path.parent / f"{tmp_path.name}_outside"
    outside.mkdir()
    (outside / "precious").write_text("not the learner's")
    # Left by interrupted saves, as TensorFlow and this module name them.
    interrupted = tmp_path / "ckpt-3_temp"
    interrupted.mkdir()
    (interrupted / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 4096)
    (interrupted / "part-00000-of-00001.index").write_bytes(b"\0" * 64)
    (interrupted / "a_link").symlink_to(outside / "precious")
    (interrupted / "a_folder_link").symlink_to(outside, target_is_directory=True)
    new_style = [".checkpoint.ab1_x9zq.tmp", ".pbt_state.json.k3j4h5g6.tmp"]
    new_style.append(".published_version.q1w2e3r4.tmp")
    for name in ("checkpoint.4242.tmp", "published_version.77.tmp", "ckpt-3.index.tempstate123"):
        (tmp_path / name).write_text("half")
    for name in new_style:
        (tmp_path / name).write_text("half")
    # Of other names or kinds: kept.
    (tmp_path / "ckpt-4_temp").symlink_to(outside, target_is_directory=True)
    (tmp_path / "ckpt-5_temp").write_text("a file, not a save's folder")
    (tmp_path / "ckpt-x_temp").mkdir()
    (tmp_path / "mine_temp").mkdir()
    (tmp_path / "checkpoint.tmp").write_text("not a save's")
    (tmp_path / "notes.txt").write_text("kept")
    (tmp_path / ".notes.txt.k3j4h5g6.tmp").write_text("not a save's")

    agent, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-2")
    for restored, original in zip(_values(agent.variables), weights[2], strict=True):
        np.testing.assert_array_equal(restored, original)
    removed = [*new_style, "checkpoint.4242.tmp", "ckpt-3.index.tempstate123", "ckpt-3_temp"]
    removed.append("published_version.77.tmp")
    assert reports[: len(removed)] == [
        f"removed {tmp_path / name}, left by an interrupted save" for name in removed
    ]
    left = set(os.listdir(tmp_path)) - set(removed)
    assert not set(removed) & set(os.listdir(tmp_path)) and left <= set(os.listdir(tmp_path))
    assert {"ckpt-4_temp", "ckpt-5_temp", "ckpt-x_temp", "mine_temp", "checkpoint.tmp"} <= left
    assert ".notes.txt.k3j4h5g6.tmp" in left
    assert (outside / "precious").read_text() == "not the learner's"
    assert sorted(os.listdir(outside)) == ["precious"]
    assert _kept(tmp_path) == [1, 2]


def _publish(saver, versions):
    for version in versions:
        saver.record_publishing(version)


def test_weight_versions_go_on_above_those_published_after_the_last_checkpoint(tmp_path):
    """A learner killed after its last save had published more versions (with other weights,
    which actors hold): its next start must not publish those numbers again."""
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    assert saver.restore_latest(lambda line: None) is None and int(saver.version) == 0
    _publish(saver, range(1, 6))
    saver.save(frames=500, version=5)
    _publish(saver, range(6, 13))  # then killed

    _, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-5")
    assert int(loader.frames) == 500
    going_on = int(loader.version)
    assert going_on > 12 + 1  # learners step together: one may have published 13 already
    assert reports == [
        f"weight versions up to {going_on - 1} may have been published by an earlier start; "
        f"going on from {going_on}, not from the checkpoint's 5"
    ]
    # Recorded again before the first version of this start is published.
    assert int((tmp_path / "published_version").read_text()) > going_on


def test_after_a_clean_stop_the_weight_versions_go_on_from_the_checkpoints(tmp_path):
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    saver.restore_latest(lambda line: None)
    _publish(saver, range(1, 6))
    saver.save(frames=500, version=5)
    saver.record_stopped(5)
    _, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-5")
    assert (int(loader.version), reports) == (5, [])


def test_a_start_without_checkpoints_goes_on_above_an_earlier_starts_versions(tmp_path):
    """A first start killed before its first save had published versions too."""
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=3)
    saver.restore_latest(lambda line: None)
    _publish(saver, range(1, 41))
    _, loader = _loader(tmp_path)
    assert loader.restore_latest(lambda line: None) is None
    assert int(loader.version) > 41


@pytest.mark.parametrize(
    "state", [b"garbage\x00\xff", b'model_checkpoint_path: "ckpt-3', b""], ids=str
)
def test_a_state_file_that_cannot_be_read_is_reported_and_the_folder_used(tmp_path, state):
    weights = _saved_run(tmp_path)
    (tmp_path / "checkpoint").write_bytes(state)
    agent, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-3")
    np.testing.assert_array_equal(_values(agent.variables)[0], weights[3][0])
    (line,) = reports
    assert line.startswith(f"{tmp_path / 'checkpoint'} cannot be read (")
    assert line.endswith(f"using the 3 checkpoint(s) in {tmp_path}")


def test_tensorflow_state_files_of_earlier_runs_are_read(tmp_path):
    _saved_run(tmp_path, versions=(1, 2))
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-2"\n'
        'all_model_checkpoint_paths: "ckpt-1"\n'
        'all_model_checkpoint_paths: "ckpt-2"\n'
        "all_model_checkpoint_timestamps: 1795487501.30789\n"
        "all_model_checkpoint_timestamps: 1795489277.9666288\n"
        "last_preserved_timestamp: 1795485056.717792\n"
    )
    _, loader = _loader(tmp_path)
    reports = []
    assert loader.restore_latest(reports.append) == str(tmp_path / "ckpt-2")
    assert reports == []
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-2")


def test_a_checkpoint_is_on_disk_before_it_becomes_latest(tmp_path, monkeypatch):
    """Every file of the checkpoint and the folder are fsynced before the state file is
    renamed into place, and the state file itself before and the folder after."""
    agent, trainer = _trainer(seed=0)
    saver = checkpoints.Checkpointer(str(tmp_path), agent, trainer.optimizer, IDENTITY, keep=2)
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(source, target):
        events.append(("replace", str(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    saver.save(frames=100, version=1)
    monkeypatch.undo()

    state = str(tmp_path / "checkpoint")
    rename = events.index(("replace", state))
    synced_before = {path for kind, path in events[:rename] if kind == "fsync"}
    checkpoint_files = {str(tmp_path / n) for n in os.listdir(tmp_path) if n.startswith("ckpt-1.")}
    assert checkpoint_files and checkpoint_files <= synced_before
    assert str(tmp_path) in synced_before
    temporary = str(tmp_path / ".checkpoint.")  # the temporary state file
    assert any(path.startswith(temporary) for path in synced_before)
    assert ("fsync", str(tmp_path)) in events[rename + 1 :]
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-1")
