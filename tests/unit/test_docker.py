"""The Docker packaging, without a container engine: the Dockerfile passes hadolint and installs
the stack with the set-up script `make test` runs, and the image's entry point works.

docker/check.sh builds the image and runs every role from containers (podman or Docker).
"""

import getpass
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from tests.helpers import ROOT, wait_until

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
ENTRYPOINT = os.path.join(ROOT, "docker", "entrypoint.sh")
HADOLINT = os.path.join(os.path.dirname(sys.executable), "hadolint")


def _instructions(path):
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments left out."""
    instructions, pending = [], ""
    with open(path) as f:
        for line in f:
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            line = line.rstrip("\n")
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            keyword, _, rest = (pending + line).strip().partition(" ")
            instructions.append((keyword.upper(), " ".join(rest.split())))
            pending = ""
    return instructions


def test_the_dockerfile_passes_hadolint():
    completed = subprocess.run(
        [HADOLINT, "--no-color", DOCKERFILE], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_image_installs_the_stack_with_the_set_up_script_before_copying_the_source():
    steps = _instructions(DOCKERFILE)
    copies = [i for i, (keyword, _) in enumerate(steps) if keyword == "COPY"]
    setup = [i for i, (keyword, args) in enumerate(steps) if "bash scripts/setup.sh" in args]
    assert len(setup) == 1 and steps[setup[0]][0] == "RUN"
    # requirements.txt and the script go in first; all of the source only after the set-up, so
    # that a change to the code reuses the installed stack.
    assert [steps[i][1] for i in copies] == [
        "requirements.txt ./",
        "scripts/setup.sh scripts/horovod-cycles.patch scripts/",
        ". .",
    ]
    assert copies[1] < setup[0] < copies[2]
    # The Makefile's set-up target (what CI runs) calls the same script.
    with open(os.path.join(ROOT, "Makefile")) as f:
        assert "bash scripts/setup.sh" in f.read()


def test_the_image_runs_as_a_user_runs_the_fast_tests_and_prints_help_by_default():
    steps = _instructions(DOCKERFILE)
    users = [args for keyword, args in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    tests = [i for i, (keyword, args) in enumerate(steps) if "pytest tests/unit" in args]
    assert tests and tests[0] > max(i for i, (k, _) in enumerate(steps) if k == "USER")
    assert ("ENTRYPOINT", '["/opt/impala/docker/entrypoint.sh"]') in steps
    assert steps[-1] == ("CMD", '["help"]')
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = f.read().split()
    assert {".git", ".venv", "runs"} <= set(ignored)  # never the user's runs or secrets


def test_the_entry_point_prints_help_and_runs_any_other_command():
    help_text = subprocess.run([ENTRYPOINT], capture_output=True, text=True, check=True).stdout
    assert "every role of a run" in help_text
    assert "experiment.py --job_name=actor" in help_text
    ran = subprocess.run([ENTRYPOINT, "echo", "a b"], capture_output=True, text=True, check=True)
    assert ran.stdout == "a b\n"


@pytest.mark.parametrize(
    "args, error",
    [
        (["sshd", "99999", "/nowhere"], "sshd: PORT=99999: not a port in 1-65535"),
        (["sshd", "2222", "/nowhere"], "sshd: /nowhere/host_key: no such file"),
    ],
)
def test_the_sshd_role_refuses_bad_arguments_in_one_line(args, error):
    completed = subprocess.run([ENTRYPOINT, *args], capture_output=True, text=True)
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [error]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A uid no account has, as a container run with --user "$(id -u):$(id -g)" on a host whose user
# the image does not know: the entry point names it u<uid> (nss_wrapper), on every host alike.
STRANGER_UID = 4242


@pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="make setup installs sshd")
@pytest.mark.parametrize("uid", [None, STRANGER_UID], ids=["this_user", "an_unknown_uid"])
def test_the_sshd_role_lets_in_the_key_it_was_given_and_no_other(tmp_path, request, uid):
    """What mpirun in the first learner container needs from the others: a real sshd, started
    as the image starts it, on a port of its own, with its own host key, letting in only the
    user it runs as."""
    if uid is not None:
        if os.geteuid() != 0:
            pytest.skip("running sshd as another uid needs root")
        # A folder that uid can reach (pytest's own are its user's only), removed afterwards.
        reachable = tempfile.mkdtemp(prefix="impala-sshd-")
        request.addfinalizer(lambda: shutil.rmtree(reachable, ignore_errors=True))
        tmp_path = pathlib.Path(reachable)
    for name in ("host_key", "client_key", "stranger_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True
        )
    shutil.copy(tmp_path / "client_key.pub", tmp_path / "authorized_keys")
    os.chmod(tmp_path / "authorized_keys", 0o600)
    port = _free_port()
    host_key = (tmp_path / "host_key.pub").read_text().split()[:2]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    as_user = []
    user = getpass.getuser()
    if uid is not None:
        os.chmod(tmp_path, 0o755)
        for name in ("host_key", "authorized_keys"):
            os.chown(tmp_path / name, uid, uid)
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        user = f"u{uid}"
    else:
        os.makedirs("/run/sshd", exist_ok=True)  # as the image makes it, for sshd run as root
    server = subprocess.Popen(
        [*as_user, ENTRYPOINT, "sshd", str(port), str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "sshd.log", "w"),  # noqa: SIM115
    )
    try:
        wait_until(lambda: _listening(port), 10, "the sshd role did not start")

        def ssh(key, login=user):
            return subprocess.run(
                [
                    *("ssh", "-p", str(port), "-i", str(tmp_path / key), "-F", "/dev/null"),
                    *("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"),
                    *("-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}"),
                    *("-o", "IdentitiesOnly=yes", f"{login}@127.0.0.1", "id -u"),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )

        allowed = ssh("client_key")
        assert allowed.returncode == 0, allowed.stderr + (tmp_path / "sshd.log").read_text()
        assert allowed.stdout == f"{os.geteuid() if uid is None else uid}\n"
        refused = ssh("stranger_key")
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        if uid is not None:  # the run's key logs in as the sshd's own user only
            as_root = ssh("client_key", login="root")
            assert as_root.returncode == 255 and "Permission denied" in as_root.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)


def _listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_gpu_variant_is_the_same_dockerfile_with_tensorflow_for_cuda():
    """docker/README.md builds the GPU image with a build argument, not a second Dockerfile that
    could drift: the argument reaches the set-up script, which installs that package."""
    steps = _instructions(DOCKERFILE)
    assert ("ARG", "TF_PACKAGE=tensorflow-cpu") in steps
    assert any(
        k == "RUN" and 'TF_PACKAGE="${TF_PACKAGE}" bash scripts/setup.sh' in a for k, a in steps
    )
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        assert re.search(r'echo "\$TF_PACKAGE==\$\(pin_of tensorflow-cpu\)"', f.read())
    with open(os.path.join(ROOT, "docker", "README.md")) as f:
        assert "--build-arg TF_PACKAGE='tensorflow[and-cuda]'" in f.read()
