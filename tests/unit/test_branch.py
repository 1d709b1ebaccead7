"""A branch of a run (benchmarks/branch.py): a new run folder holding one of the run's
checkpoints, its flags and its learning curve to that checkpoint, which resumes as a run does."""

import os

import numpy as np
import pytest
import tensorflow as tf

import networks
from benchmarks import branch
from impala import configs, curves, run_folder, run_secret
from impala.learner import checkpoints, optimise
from impala.learner.summaries import Summaries
from tests.fake_runs import save_checkpoints

FLAGS = {"level_name": "CartPole-v1", "agent_name": "MLPAgent", "entropy_cost": 0.01}


def _episodes(run_dir, frames):
    summaries = Summaries(str(run_dir))
    for step in frames:
        summaries.episodes(step, np.array([step / 100.0]), np.array([50.0]))
    summaries.close()


@pytest.fixture
def run(tmp_path):
    """A run that trained to 700 frames, stopped at 500 and was resumed from its checkpoint at
    300 (so its second event file overlaps the first), with checkpoints at 300 and 700."""
    run_dir = tmp_path / "run"
    weights = save_checkpoints(str(run_dir), versions=(3, 7))
    run_folder.write_flags(str(run_dir), FLAGS)
    run_secret.create(run_secret.path_in(str(run_dir)))
    _episodes(run_dir, [100, 200, 300, 400, 500])
    _episodes(run_dir, [350, 450, 550, 650, 700])
    return run_dir, weights


def _returns(run_dir):
    steps, values = curves.events.read_scalars(str(run_dir))[curves.events.RETURN_TAG]
    return list(steps), list(values)


def _restored_weights(run_dir):
    agent = networks.make_agent("MLPAgent", 2)
    networks.build_variables(agent, (4,), "float32")
    trainer = optimise.Trainer(agent, configs.LearnerConfig())
    trainer.create_optimizer_slots()
    identity = checkpoints.read_identity(str(run_dir / "checkpoints" / "ckpt-3"))
    saver = checkpoints.Checkpointer(
        str(run_dir / "checkpoints"), agent, trainer.optimizer, identity, keep=3
    )
    path = saver.restore_latest()
    return path, int(saver.frames.numpy()), [v.numpy() for v in agent.variables]


def test_a_branch_holds_the_checkpoint_the_flags_and_the_curve_to_it(run, tmp_path):
    run_dir, weights = run
    before = sorted(os.listdir(run_dir)), sorted(os.listdir(run_dir / "checkpoints"))
    start = branch.source(str(run_dir / "checkpoints" / "ckpt-3"))
    assert (start.run_dir, start.frames, start.flags) == (str(run_dir), 300, FLAGS)

    branch.branch(start, str(tmp_path / "b"))

    new = tmp_path / "b"
    assert run_folder.read_flags(str(new)) == FLAGS
    # No secret (its launcher makes one) and no summary of a finished or stopped run.
    assert not os.path.exists(run_secret.path_in(str(new)))
    assert not list(new.glob("learner_*.json"))
    path, frames, restored = _restored_weights(new)
    assert (path, frames) == (str(new / "checkpoints" / "ckpt-3"), 300)
    for got, saved in zip(restored, weights[0], strict=True):
        np.testing.assert_array_equal(got, saved)
    assert checkpoints.listed(str(new / "checkpoints")) == ([path], None)
    given = str(run_dir / "checkpoints" / "ckpt-3")
    assert run_folder.read_branch(str(new)) == {"checkpoint": given, "frames": 300, "given": given}
    assert run_folder.read_branch(str(run_dir)) is None
    # The curve as plot.py reads the run's, to the checkpoint's frames: the resumed start's
    # events from 350 replace the first start's from 400 on.
    assert _returns(new) == ([100, 200, 300], [1.0, 2.0, 3.0])
    assert _returns(run_dir)[0] == [100, 200, 300, 350, 450, 550, 650, 700]
    # The run is only read; no staging folder is left beside the branch.
    assert (sorted(os.listdir(run_dir)), sorted(os.listdir(run_dir / "checkpoints"))) == before
    assert sorted(os.listdir(tmp_path)) == ["b", "run"]


def test_a_branch_from_a_run_folder_takes_its_latest_checkpoint(run, tmp_path):
    run_dir, _ = run
    start = branch.source(str(run_dir))
    assert (start.checkpoint, start.frames) == (str(run_dir / "checkpoints" / "ckpt-7"), 700)
    branch.branch(start, str(tmp_path / "b"))
    assert _returns(tmp_path / "b")[0] == [100, 200, 300, 350, 450, 550, 650, 700]
    assert run_folder.read_branch(str(tmp_path / "b"))["given"] == str(run_dir)


def test_an_existing_folder_is_refused_and_left_alone(run, tmp_path):
    run_dir, _ = run
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"/b exists; a branch starts a new run folder"):
        branch.branch(branch.source(str(run_dir)), str(tmp_path / "b"))
    assert os.listdir(tmp_path / "b") == ["notes.txt"]


def test_a_failed_copy_leaves_nothing_behind(run, tmp_path):
    run_dir, _ = run
    start = branch.source(str(run_dir / "checkpoints" / "ckpt-3"))
    os.remove(str(run_dir / "checkpoints" / "ckpt-3.index"))
    with pytest.raises(ValueError, match=r"ckpt-3: no such checkpoint \(no ckpt-3.index\)"):
        branch.branch(start, str(tmp_path / "b"))
    assert sorted(os.listdir(tmp_path)) == ["run"]


@pytest.mark.parametrize(
    "where, message",
    [
        ("missing", r"missing: no such run folder, checkpoints folder or checkpoint"),
        ("no_flags", r"no_flags/checkpoints/ckpt-3: its folder .*no_flags has no flags.json"),
        ("not_ours", r"not_ours/checkpoints/ckpt-1: not a checkpoint of this project"),
    ],
)
def test_what_is_not_a_runs_checkpoint_is_a_one_line_error(tmp_path, where, message):
    save_checkpoints(str(tmp_path / "no_flags"), versions=(3,))
    (tmp_path / "not_ours").mkdir()
    run_folder.write_flags(str(tmp_path / "not_ours"), FLAGS)
    other = tf.train.Checkpoint(weights=tf.Variable([1.0]))
    other.write(str(tmp_path / "not_ours" / "checkpoints" / "ckpt-1"))
    target = {
        "missing": tmp_path / "missing",
        "no_flags": tmp_path / "no_flags" / "checkpoints" / "ckpt-3",
        "not_ours": tmp_path / "not_ours" / "checkpoints" / "ckpt-1",
    }[where]
    with pytest.raises(ValueError, match=message) as raised:
        branch.source(str(target))
    assert "\n" not in str(raised.value)


def test_events_after_a_damaged_record_are_not_copied(tmp_path):
    _episodes(tmp_path, [100, 200, 300])
    (events,) = curves.events.event_files(str(tmp_path))
    with open(events, "rb") as f:
        data = f.read()
    with open(events, "wb") as f:
        f.write(data[:-5])  # the last record cut short, as by a learner killed mid-write
    out = tmp_path / "copy"
    out.mkdir()
    kept = branch.copy_events(events, str(out / os.path.basename(events)), 10**9)
    assert kept >= 1
    assert _returns(out) == _returns(tmp_path)


def test_symlinks_in_the_run_are_refused_not_followed(run, tmp_path):
    run_dir, _ = run
    secret = tmp_path / "private_key"
    secret.write_text("not for the branch")
    # A file that is no part of a checkpoint is not copied, whatever its name.
    os.symlink(secret, run_dir / "checkpoints" / "ckpt-3.notes")
    start = branch.source(str(run_dir / "checkpoints" / "ckpt-3"))
    branch.branch(start, str(tmp_path / "b"))
    assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == [
        "checkpoint",
        "ckpt-3.data-00000-of-00001",
        "ckpt-3.index",
    ]
    # One that is, or the run's flags, is refused.
    for name in ("flags.json", "checkpoints/ckpt-3.data-00000-of-00001"):
        target = run_dir / name
        os.replace(target, tmp_path / "moved")
        os.symlink(secret, target)
        with pytest.raises(ValueError, match=f"{name}: (not a regular file|cannot be read)"):
            branch.branch(start, str(tmp_path / "c"))
        os.replace(tmp_path / "moved", target)
    assert sorted(os.listdir(tmp_path)) == ["b", "private_key", "run"]


def test_an_event_file_that_cannot_be_read_is_named_and_nothing_made(run, tmp_path):
    run_dir, _ = run
    (run_dir / "events.out.tfevents.9999999999.x").mkdir()
    with pytest.raises(ValueError, match=r"events.out.tfevents.9999999999.x: not a regular file"):
        branch.branch(branch.source(str(run_dir)), str(tmp_path / "b"))
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_a_branch_inside_the_run_it_branches_is_refused(run):
    run_dir, _ = run
    with pytest.raises(ValueError, match="is inside the run it branches"):
        branch.branch(branch.source(str(run_dir)), str(run_dir / "b"))
    assert not (run_dir / "b").exists()
