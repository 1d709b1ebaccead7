"""The run secret's file: created owner-only and whole, read only when nobody else can read it."""

import os
import stat
import subprocess
import sys

import pytest

from impala import run_secret
from tests.helpers import ROOT


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_secret_is_owner_only_random_and_reads_back(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    token = run_secret.create(str(first))
    assert _mode(first) == 0o600
    assert run_secret.load(str(first)) == token
    assert len(token) == run_secret.LENGTH and int(token, 16) >= 0
    assert run_secret.create(str(second)) != token
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]  # no temporary file left behind


def test_creating_never_overwrites_but_rotating_does(tmp_path):
    path = str(tmp_path / "secret")
    token = run_secret.create(path)
    with pytest.raises(run_secret.SecretError, match="a secret exists already"):
        run_secret.create(path)
    assert run_secret.load(path) == token
    rotated = run_secret.create(path, overwrite=True)
    assert rotated != token and run_secret.load(path) == rotated and _mode(path) == 0o600


def test_ensure_creates_once_then_reads(tmp_path):
    path = str(tmp_path / "secret")
    token, created = run_secret.ensure(path)
    assert created
    assert run_secret.ensure(path) == (token, False)


def test_a_secret_others_can_read_is_refused(tmp_path):
    path = tmp_path / "secret"
    run_secret.create(str(path))
    os.chmod(path, 0o640)
    with pytest.raises(run_secret.SecretError, match=r"open to other users \(mode 0640\)"):
        run_secret.load(str(path))


@pytest.mark.parametrize(
    "content",
    [b"", b"abc\n", b"g" * 64, b"ab" * 33, ("\u00e9" * 64).encode()],
    ids=["empty", "short", "not-hex", "long", "not-ascii"],
)
def test_a_file_that_holds_no_secret_is_refused(tmp_path, content):
    path = tmp_path / "secret"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(run_secret.SecretError, match="not a run secret"):
        run_secret.load(str(path))


def test_a_missing_file_a_folder_and_a_link_are_refused(tmp_path):
    with pytest.raises(run_secret.SecretError, match="no run secret here"):
        run_secret.load(str(tmp_path / "missing"))
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    with pytest.raises(run_secret.SecretError, match="regular file"):
        run_secret.load(str(folder))
    target = tmp_path / "target"
    run_secret.create(str(target))
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(run_secret.SecretError, match="the run secret is a link"):
        run_secret.load(str(tmp_path / "link"))


def test_the_command_line_creates_checks_and_rotates(tmp_path):
    path = str(tmp_path / "secret")

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "impala.run_secret", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run("new", path).returncode == 0
    token = run_secret.load(path)
    assert token not in run("check", path).stdout  # never printed
    again = run("new", path)
    assert again.returncode == 1 and "exists already" in again.stderr
    assert run("new", path, "--force").returncode == 0 and run_secret.load(path) != token
    assert run("check", str(tmp_path / "none")).returncode == 1
    assert run("rotate").returncode == 2
