"""The run folder: its name, the flags saved in it, what a resumed run reports as changed, and
who may read it."""

import datetime
import json
import os
import stat
import subprocess
import sys

import pytest

from impala import run_folder
from tests.helpers import ROOT


def test_default_name_is_the_level_and_the_start_time_safe_for_a_path():
    now = datetime.datetime(2026, 11, 22, 10, 15, 0)
    name = run_folder.default_name("PongNoFrameskip-v4", now)
    assert name == "PongNoFrameskip-v4-20261122-101500"
    assert run_folder.default_name("ALE/Pong-v5", now) == "ALE_Pong-v5-20261122-101500"


@pytest.mark.parametrize("name", ["a/b", "..", ".", "x\\y"])
def test_an_experiment_name_must_be_a_plain_folder_name(name):
    with pytest.raises(ValueError, match="must be a folder name"):
        run_folder.check_name(name)
    run_folder.check_name("pong-seed1")  # fine


def test_flags_round_trip_and_replace_the_file_only_when_complete(tmp_path):
    assert run_folder.read_flags(str(tmp_path)) is None
    run_folder.write_flags(str(tmp_path / "run"), {"batch_size": 32, "learner_hosts": ["a:1"]})
    assert run_folder.read_flags(str(tmp_path / "run")) == {
        "batch_size": 32,
        "learner_hosts": ["a:1"],
    }
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["flags.json"]


def test_a_broken_flags_file_is_named(tmp_path):
    (tmp_path / "flags.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"flags.json: not valid JSON"):
        run_folder.read_flags(str(tmp_path))
    (tmp_path / "flags.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="expected a JSON object"):
        run_folder.read_flags(str(tmp_path))


def test_changed_flags_name_training_flags_only():
    saved = {"batch_size": 32, "learning_rate": 6e-4, "task": 0, "logdir": "runs", "old": 1}
    current = {"batch_size": 64, "learning_rate": 6e-4, "task": 3, "logdir": "/data", "new": 2}
    assert run_folder.changed_flags(saved, current) == ["--batch_size: 32 -> 64"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "branch.json: not valid JSON"),
        ('{"checkpoint": "a", "given": "a", "frames": "300"}', "expected checkpoint, given and"),
        ('["a", 300]', "expected checkpoint, given and frames"),
    ],
)
def test_a_broken_branch_record_is_named(tmp_path, text, message):
    assert run_folder.read_branch(str(tmp_path)) is None
    (tmp_path / "branch.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        run_folder.read_branch(str(tmp_path))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_partial_one(tmp_path, monkeypatch):
    path = tmp_path / "learning.json"
    run_folder.write_json(str(path), {"frames": 1})

    def fail(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_folder.os, "replace", fail)
    with pytest.raises(OSError, match="No space left on device"):
        run_folder.write_json(str(path), {"frames": 2})

    assert json.loads(path.read_text()) == {"frames": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learning.json"]


def _plant(tmp_path, kind):
    """What someone who can write in a run folder may put at a file's name."""
    path = tmp_path / "flags.json"
    if kind == "link":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open would wait for one for ever
    elif kind == "folder":
        path.mkdir()
    elif kind == "2 MiB":
        path.write_text(" " * (2 << 20) + "{}")
    elif kind == "deep":
        path.write_text("[" * 100_000)
    elif kind == "long number":
        path.write_text("1" * 5000)
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "kind, message",
    [
        ("link", "is a link; this file is never read through one"),
        ("link to /dev/zero", "is a link"),
        ("fifo", "not a regular file"),
        ("folder", "not a regular file"),
        ("2 MiB", "more than 1,048,576 bytes"),
        ("deep", "not valid JSON (nested too deeply, or a too long number)"),
        ("long number", "not valid JSON (nested too deeply, or a too long number)"),
    ],
)
def test_a_json_file_of_the_run_folder_is_read_only_as_a_small_regular_file(
    tmp_path, kind, message
):
    path = _plant(tmp_path, kind)
    with pytest.raises(ValueError, match=f"^{path}: ") as error:
        run_folder.read_flags(str(tmp_path))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_write_replaces_a_link_planted_at_its_name_or_its_old_temporary_name(tmp_path):
    """A link at the file's name, or at the `<name>.tmp` a write once went through, is never
    written through: the file is replaced by a new one of the umask's permissions."""
    outside = tmp_path / "outside"
    outside.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / "learning.json").symlink_to(outside)
    (run / "learning.json.tmp").symlink_to(outside)
    run_folder.write_json(str(run / "learning.json"), {"frames": 2})
    assert outside.read_text() == "precious"
    assert not (run / "learning.json").is_symlink()
    assert json.loads((run / "learning.json").read_text()) == {"frames": 2}
    mode = stat.S_IMODE((run / "learning.json").stat().st_mode)
    assert mode == 0o666 & ~run_folder.current_umask()
    assert sorted(p.name for p in run.iterdir()) == ["learning.json", "learning.json.tmp"]


def test_the_umask_is_read_without_being_changed(monkeypatch):
    """Setting it and setting it back would, for an instant, give other threads' new files no
    mask: it is read from /proc."""
    mask = os.umask(0o027)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(run_folder.os, "umask", lambda mask: pytest.fail("umask set"))
            assert run_folder.current_umask() == 0o027
    finally:
        os.umask(mask)


def test_only_folders_named_policy_and_ascii_digits_are_policies(tmp_path):
    for name in ("policy_0", "policy_2", "policy_\u00b2", "policy_01", "policy_x", "policy_"):
        (tmp_path / name).mkdir()
    assert run_folder.policies_in(str(tmp_path)) == [0, 2]


def test_a_run_folder_made_before_is_made_owner_only_and_only_it(tmp_path):
    folder, inside = tmp_path / "run", tmp_path / "run" / "flags.json"
    folder.mkdir()
    inside.write_text("{}")
    os.chmod(folder, 0o755)
    os.chmod(inside, 0o644)
    run_folder.make_private(str(folder))
    # No one else can reach what is inside any more: it is left as it was.
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(inside.stat().st_mode) == 0o644
    os.chmod(folder, 0o500)  # never adds a permission
    run_folder.make_private(str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o500
    os.chmod(folder, 0o700)


def test_keep_private_makes_what_the_process_creates_owner_only(tmp_path):
    # In a process of its own: a umask is the whole process's.
    script = (
        "import os, sys\n"
        "os.umask(0o002)\n"
        "from impala import run_folder\n"
        "run_folder.keep_private()\n"
        "os.makedirs(os.path.join(sys.argv[1], 'made', 'deeper'))\n"
        "run_folder.write_text(os.path.join(sys.argv[1], 'made', 'written'), 'x')\n"
        "open(os.path.join(sys.argv[1], 'made', 'opened'), 'w').close()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, check=True)
    made = tmp_path / "made"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE((made / "deeper").stat().st_mode) == 0o700
    assert stat.S_IMODE((made / "written").stat().st_mode) == 0o600
    assert stat.S_IMODE((made / "opened").stat().st_mode) == 0o600


@pytest.mark.skipif(os.getuid() != 0, reason="only root can make a folder another user's")
def test_a_run_folder_another_user_makes_between_the_check_and_its_making_is_refused(
    tmp_path, monkeypatch
):
    # Under a sticky folder open to all (as /tmp), another user makes the run folder first,
    # in the moment between the check of the folder above and the makedirs that accepts it.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    run_dir = shared / "run"
    makedirs = os.makedirs

    def theirs_first(path, *args, **kwargs):
        os.mkdir(run_dir)
        os.chown(run_dir, 65534, 65534)
        makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", theirs_first)
    with pytest.raises(ValueError, match=rf"{run_dir}: a folder owned by another user"):
        run_folder.make_checked(str(run_dir))


@pytest.mark.skipif(os.getuid() != 0, reason="only root can make a link another user's")
def test_a_link_of_another_user_reached_through_a_link_of_ours_is_refused(tmp_path):
    # runs (ours) -> sticky/runs (theirs, in a folder open to all) -> mine: the path as given
    # and the real path are both ours, but they could point their link at a folder of theirs
    # between the check and the read.
    mine, sticky = tmp_path / "mine", tmp_path / "sticky"
    mine.mkdir()
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = sticky / "runs"
    theirs.symlink_to(mine)
    os.lchown(theirs, 65534, 65534)
    ours = tmp_path / "runs"
    ours.symlink_to(theirs)
    assert run_folder.resolve(str(ours)) == ([str(ours), str(theirs)], str(mine))
    assert run_folder.unsafe_folder(str(ours)) == f"{theirs}: a symlink owned by another user"
    with pytest.raises(ValueError, match=f"{theirs}: a symlink owned by another user"):
        run_folder.make_checked(str(ours / "run"))
    assert list(mine.iterdir()) == []


def test_a_dot_dot_after_a_link_is_refused_where_text_and_kernel_part(tmp_path, monkeypatch):
    # --logdir=runs/link/../x: the run's processes read it as runs/x (os.path.abspath,
    # TensorFlow's paths), the kernel goes up from the link's target: one folder would be
    # checked and another written. Refused, nothing made; a '..' through plain folders is fine.
    ours, elsewhere = tmp_path / "ours", tmp_path / "elsewhere"
    (ours / "runs" / "sub").mkdir(parents=True)
    (elsewhere / "deep").mkdir(parents=True)
    (ours / "runs" / "link").symlink_to(elsewhere / "deep")
    monkeypatch.chdir(ours)
    with pytest.raises(
        ValueError,
        match=f"^run folder runs/link/../x: a '..' after a symlink leads to {elsewhere}/x, not "
        f"to {ours}/runs/x as the path reads",
    ):
        run_folder.make_checked(os.path.join("runs", "link", "..", "x"))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["deep"]
    assert sorted(p.name for p in (ours / "runs").iterdir()) == ["link", "sub"]
    run_folder.make_checked(os.path.join("runs", "sub", "..", "x"))
    assert (ours / "runs" / "x").is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can make a folder another user's")
def test_a_folder_of_another_user_left_by_a_dot_dot_in_a_link_is_refused(tmp_path):
    # runs -> ../sticky/theirs/../../mine: the real path is ours, but the owner of `theirs`
    # could make it a link, and the '..' after it would lead wherever they like.
    mine, sticky = tmp_path / "mine", tmp_path / "sticky"
    mine.mkdir()
    (sticky / "theirs").mkdir(parents=True)
    sticky.chmod(0o1777)
    os.chown(sticky / "theirs", 65534, 65534)
    (tmp_path / "runs").symlink_to("sticky/theirs/../../mine")
    assert run_folder.resolve(str(tmp_path / "runs")) == (
        [str(tmp_path / "runs"), str(sticky / "theirs"), str(sticky)],
        str(mine),
    )
    assert run_folder.unsafe_folder(str(tmp_path / "runs")) == (
        f"{sticky / 'theirs'}: a folder owned by another user"
    )
