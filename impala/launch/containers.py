"""Every process of a run in a container of the project's image (docker/Dockerfile), as pure
functions: the shell lines that run, signal and remove the run's containers, and check a host
can run them.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from impala.launch.planning import fail_with, shell_line

# Inside the image (docker/Dockerfile): the project's folder, and its interpreter on PATH.
IMAGE_WORKDIR = "/opt/impala"
IMAGE_PYTHON = "/opt/impala/.venv/bin/python"
# Every container of a run carries this label, with the run's session name: stop finds them by it.
CONTAINER_LABEL = "impala.run"
# What the sshd container of a learner host (`learner_plan.py`) needs when the host user, and so
# the container's, is root: it chroots its pre-login process and switches users. A container of
# any other user gets no use of them.
SSHD_CAPABILITIES = ("SYS_CHROOT", "SETGID", "SETUID")
# The run's SSH keys for mpirun between learner containers on several hosts, made by the
# frontend when it starts the run, each in the `MPI_SSH_DIR` folder of the run folder of the
# host that needs it (owner-only): name -> what.
MPI_SSH_DIR = "mpi_ssh"
MPI_SSH_FILES = {
    "id_ed25519": "the run's SSH key, for mpirun's ssh",
    "known_hosts": "the host key of the learner hosts' sshd containers",
    "host_key": "the sshd container's host key",
    "authorized_keys": "the public half of the run's SSH key, which the sshd container lets in",
}

_IMAGE_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_RUNTIME_WORD = re.compile(r"[A-Za-z0-9/-][A-Za-z0-9._/=:-]{0,254}")


@dataclasses.dataclass(frozen=True)
class Containers:
    """Every process of the run in a container of `image` (docker/Dockerfile) instead of the
    CSV's python: host networking, the host's run folder mounted at its own path, the host
    user's uid, no capabilities and no way to gain any, started by `runtime` (`docker`, or
    `podman`, with its options).

    Raises:
      ValueError: an image reference or runtime word that is not one (they go on command lines).
    """

    image: str
    runtime: tuple[str, ...] = ("docker",)
    sshd_port: int = 2222

    def __post_init__(self):
        if not 1 <= self.sshd_port <= 65535:
            raise ValueError(f"--container_sshd_port={self.sshd_port}: not a port in 1-65535")
        if not _IMAGE_REFERENCE.fullmatch(self.image):
            raise ValueError(f"--docker_image={self.image!r}: not an image reference")
        words = self.runtime
        if not words or words[0].startswith("-") or not all(map(_RUNTIME_WORD.fullmatch, words)):
            raise ValueError(
                f"--container_runtime={' '.join(self.runtime)!r}: give a command such as docker "
                "or 'podman --runtime runc' (letters, digits and ._/=:- only)"
            )

    def name(self, session: str, window: str) -> str:
        """The container of `window`: named, so that a restart can remove a leftover one."""
        return f"{session}-{window}"

    def run_line(self, session, window, mounts, env, argv, gpus=False, capabilities=()) -> str:
        """The shell line that runs `argv` in a container of the window, removing a container
        of the same name left by a process that was killed first. The container has none of
        the runtime's default capabilities but `capabilities`, and cannot gain any."""
        name = self.name(session, window)
        for path in mounts:
            if ":" in path or not path.isprintable():
                raise ValueError(
                    f"{path}: a run folder of a run in containers cannot hold ':' or control "
                    "characters (it is mounted with -v path:path)"
                )
        before = [*self.runtime, "run", "--rm", "--init", "--name", name]
        before += ["--label", f"{CONTAINER_LABEL}={session}", "--network=host"]
        # The processes run as the host user and need no privilege: none to keep, none to gain
        # (a setuid binary in the image cannot raise them).
        before += ["--cap-drop=ALL", *(f"--cap-add={name}" for name in capabilities)]
        before += ["--security-opt=no-new-privileges"]
        after = [arg for path in dict.fromkeys(mounts) for arg in ("-v", f"{path}:{path}")]
        after += [arg for item in env for arg in ("-e", item)]
        after += [*(["--gpus", "all"] if gpus else []), self.image, *argv]
        return (
            f"{shell_line([*self.runtime, 'rm', '-f', name])} >/dev/null 2>&1; "
            f'{shell_line(before)} --user "$(id -u):$(id -g)" {shell_line(after)}'
        )

    def signal_command(self, session: str, window: str, signal: str) -> str:
        return shell_line([*self.runtime, "kill", "--signal", signal, self.name(session, window)])

    def remove_command(self, session: str) -> str:
        """Removes every container of the run on a host, running or not."""
        runtime = shell_line(self.runtime)
        label = shlex.quote(f"label={CONTAINER_LABEL}={session}")
        return f"{runtime} ps -aq --filter {label} | xargs -r {runtime} rm -f >/dev/null"

    def check_command(self) -> str:
        """Shell: fails with one line unless the runtime runs and has the image."""
        runtime, image = shell_line(self.runtime), shlex.quote(self.image)
        return (
            f"command -v {shlex.quote(self.runtime[0])} >/dev/null || "
            + fail_with(f"{self.runtime[0]} not found (--container_runtime)")
            + f" && {{ {runtime} image inspect {image} >/dev/null 2>&1 || "
            + fail_with(
                f"{self.runtime[0]} has no image {self.image} (or cannot reach its engine): "
                "build or load it there (docker/README.md)"
            )
            + "; }"
        )
