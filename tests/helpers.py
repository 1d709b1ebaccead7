"""What several test modules share: the repository root, real processes started and stopped
cleanly, polling for a condition, the frontend's command line, checking what still runs."""

import os
import signal
import subprocess
import sys
import time

import pytest

from impala import run_secret

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Processes:
    """Starts processes in their own process groups; whatever is left is killed at teardown."""

    def __init__(self, log_dir):
        self._log_dir = log_dir
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self._log_dir, f"{name}.log"), "w")  # noqa: SIM115
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        process.name = name
        process.log_path = log.name
        self.started.append(process)
        return process

    def experiment(self, name: str, *flags: str) -> subprocess.Popen:
        # Run folders go under the test's folder unless a test chooses its own; every process
        # of a test shares one run secret unless the test names its own.
        if not any(flag.startswith("--logdir=") for flag in flags):
            flags = (*flags, f"--logdir={os.path.join(self._log_dir, 'runs')}")
        if not any(flag.startswith("--secret_file=") for flag in flags):
            flags = (*flags, f"--secret_file={self.secret_file}")
        return self.start(name, [sys.executable, "-u", "experiment.py", *flags])

    @property
    def secret_file(self) -> str:
        """The test's run secret, created (owner-only) on first use."""
        path = os.path.join(self._log_dir, "secret")
        if not os.path.exists(path):
            run_secret.create(path)
        return path

    def log(self, process: subprocess.Popen) -> str:
        with open(process.log_path) as f:
            return f.read()

    def wait(self, process: subprocess.Popen, timeout: float) -> int:
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{process.name} still running after {timeout} s:\n{self.log(process)}")

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


# A small, fast run of the CSV frontend on the counter environment.
SMALL_RUN_FLAGS = (
    "--level_name=impala/Counter-v0",
    "--agent_name=MLPAgent",
    "--unroll_length=5",
    "--batch_size=4",
    "--num_envs_per_actor=2",
    "--total_environment_frames=1e9",
    "--log_every_secs=1",  # progress lines, which tests wait for, every second (5 s by default)
)


def run_frontend(*flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs run_experiment_mm_raw.py with `flags`, capturing its output."""
    return subprocess.run(
        [sys.executable, "run_experiment_mm_raw.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_without_ml_stack(script: str, *args: str, timeout: float = 60):
    """Runs a launcher script as a laptop driving a run would, with TensorFlow, Horovod and the
    rest made unimportable (`tests.without_ml_stack`), capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "tests.without_ml_stack", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(condition, timeout: float, message) -> None:
    """Polls `condition`; fails with `message` (a string, or a callable made when failing)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(message() if callable(message) else message)
        time.sleep(0.1)


def processes_with(text: str) -> list[str]:
    """Full command lines of the running processes that contain `text`, tmux's server aside (its
    command line is that of the first session it served, whether or not that still exists)."""
    # -ww: untruncated; without it ps cuts lines at 80 columns when not writing to a terminal.
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()[1:]
        if text in line and os.path.basename(line.split(maxsplit=1)[0]) != "tmux"
    ]


def pids_with(*texts: str) -> list[int]:
    """Process ids of the running processes whose full command line contains every one of
    `texts`."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    pids = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if all(text in args for text in texts) and "ps -ww" not in args:
            pids.append(int(pid))
    return pids


def read_text(path) -> str:
    """The file's text, or '' if it does not exist yet."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def run_local_argv(runs, *flags) -> list[str]:
    """run_local.py with these flags and its run folders in `runs`, itself without the ML stack
    (only the processes it starts need it)."""
    return [
        sys.executable,
        "-u",
        "-m",
        "tests.without_ml_stack",
        "run_local.py",
        f"--logdir={runs}",
        *flags,
    ]
