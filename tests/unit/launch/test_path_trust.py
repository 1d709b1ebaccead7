"""The shell check of whose a path is (`path_trust`), as the preflight and the SSH write run it,
under dash and bash (a host's login shell may be either), on real trees."""

import os
import shutil
import subprocess

import pytest

from impala.launch.path_trust import TRUST_FUNCTIONS, untrusted_function

SHELLS = [shell for shell in ("/bin/sh", "/bin/bash") if os.path.exists(shell)]


def _trusted(shell, path, strict):
    """`trusted w PATH STRICT` run by `shell`: its exit status and what it said."""
    command = f'{untrusted_function("")} && {TRUST_FUNCTIONS} && trusted w "$1" {strict}'
    done = subprocess.run([shell, "-c", command, "sh", path], capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_path_with_a_part_that_does_not_exist_is_refused(shell, tmp_path):
    # Another user's folder on the way could be renamed away for the moment of the check (the
    # sticky bit does not stop its owner): what is not there cannot be vouched for.
    (tmp_path / "own").mkdir()
    assert _trusted(shell, str(tmp_path / "own"), 1) == (0, "")
    missing = tmp_path / "own" / "gone" / "proj"
    assert _trusted(shell, str(missing), 1) == (3, f"w: {missing} does not exist")
    assert _trusted(shell, str(missing), 0)[0] == 3


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a path to another user")
def test_every_folder_and_link_on_the_way_is_checked_through_links_and_dot_dots(shell, tmp_path):
    own, sticky = tmp_path / "own", tmp_path / "sticky"
    (own / "proj").mkdir(parents=True)
    (sticky / "theirs").mkdir(parents=True)
    sticky.chmod(0o1777)
    shutil.chown(sticky / "theirs", 65534, 65534)
    # A '..' in a link's target leaves a folder of another user's: they could make it a link
    # and the '..' would lead elsewhere.
    (own / "via_theirs").symlink_to("../sticky/theirs/../../own/proj")
    assert _trusted(shell, str(own / "via_theirs"), 1) == (
        3,
        f"w: {sticky}/theirs is another user's",
    )
    # Another user's link reached through a link of ours: the path as given and its real path
    # are both ours.
    (sticky / "their_link").symlink_to(own / "proj")
    os.lchown(sticky / "their_link", 65534, 65534)
    (own / "to_theirs").symlink_to(sticky / "their_link")
    assert _trusted(shell, str(own / "to_theirs"), 0) == (
        3,
        f"w: {sticky}/their_link is another user's",
    )
    # Links of ours, '..' through folders of ours: trusted; the real folder strict.
    (own / "mine").symlink_to("proj/../proj")
    assert _trusted(shell, str(own / "mine"), 1) == (0, "")
    (own / "proj").chmod(0o1777)
    assert _trusted(shell, str(own / "mine"), 1) == (
        3,
        f"w: {own}/proj is writable by others",
    )
    assert _trusted(shell, str(own / "mine"), 0) == (0, "")
