"""tmux: the windows of a run, the tmux command lists, and the parsing of tmux's answers, as pure
functions.

A run is one tmux session per host (`session_name`), one window per process (`Window`), whose
shell runs the process in its workdir, logs it and starts it again when it dies
(`window_command`). Local hosts (libtmux) and SSH hosts (the `tmux` command) in `hosts.py` run
the same lists, so that tests can compare them as strings.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

from impala import run_folder
from impala.launch.planning import shell_line
from impala.printable import printable

# The tmux window of a run's learners (the learner alone, or the mpirun of several), on the first
# learner host (a policy's: `policy_<k>_learners` on its first learner host, in a run of several
# policies).
LEARNERS_WINDOW = "learners"
# The window of the SSH server (a container of the image) through which mpirun in the learners'
# container on the first learner host starts the ranks of another learner host.
SSHD_WINDOW = "sshd"
# Printable separators: tmux replaces control characters such as a tab when the client has no
# UTF-8 locale (as over a plain SSH command).
_STATUS_FORMAT = "#{window_name}|#{pane_dead}|#{pane_dead_status}"
# The session option that says which run, on which host, a session was started for
# (`session_label`): session names keep only letters, digits, '-' and '_', so runs `a.b` and
# `a_b` get one name, and status and stop must not take one run's session for the other's.
RUN_OPTION = "@impala_run"


@dataclasses.dataclass(frozen=True)
class Window:
    """One tmux window: a process of the run (or the mpirun that starts several learners)."""

    name: str
    command: str


def session_name(run_name: str, host: str) -> str:
    """The run's tmux session on `host`: status and stop find the run by it. The host is part
    of the name because several host names may reach one machine (and one tmux server)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in f"impala_{run_name}_{host}")


def session_label(run_name: str, host: str) -> str:
    """What the session of run `run_name` on `host` keeps in `RUN_OPTION`: both names as they
    are, which `session_name` may not tell apart."""
    return json.dumps([run_name, host])


def label_names(label: str) -> str:
    """The run a session's label names, for a message: `'<run>' (on <host>)`."""
    try:
        run_name, host = json.loads(label)
        return f"{printable(str(run_name)[:100])!r} (on {printable(str(host)[:100])})"
    except (ValueError, TypeError, RecursionError):  # a host's answer: anything at all
        return repr(printable(label[:100]))


@dataclasses.dataclass(frozen=True)
class Restarts:
    """How a window starts its process again when it dies, as run_local.py does: after 1, 2,
    4 ... s (at most `max_delay_secs`), at most so many times, never after exit code 0 (done),
    2 (refused flags or files) or 130 (stopped)."""

    max_actor_restarts: int = 100
    max_learner_restarts: int = 3
    max_delay_secs: int = 30


def window_command(
    workdir: str,
    log_dir: str,
    line: str,
    name: str,
    max_restarts: int,
    max_delay: int,
    private: bool = True,
    log_name: str = "",
) -> str:
    """Runs `line` in `workdir`, logging to `<log_name or name>.log` in `log_dir` (the run's
    folder, or a policy's), keeping its exit status, and starts it again when it dies (see
    `Restarts`); with `private`, the folder and log it makes are owner-only (umask 077, which
    the process inherits)."""
    log = shlex.quote(f"{log_dir}/{log_name or name}.log")
    say = f"[frontend] {name} exited with code $code;"
    final = "|".join(str(code) for code in run_folder.FINAL_EXIT_CODES)
    script = (
        ("umask 077; " if private else "")
        + f"cd {shlex.quote(workdir)} && mkdir -p {shlex.quote(log_dir)} || exit 1; "
        f"restarts=0; delay=1; while true; do {line} 2>&1 | tee -a {log}; code=$?; "
        f"case $code in {final}) exit $code;; esac; "
        f"if [ $restarts -ge {int(max_restarts)} ]; then "
        f'echo "{say} not restarting it after $restarts restarts" | tee -a {log}; exit $code; fi; '
        "restarts=$((restarts + 1)); "
        f'echo "{say} restarting it in $delay s (restart $restarts of at most '
        f'{int(max_restarts)})" | tee -a {log}; '
        f"sleep $delay; delay=$((delay * 2 > {int(max_delay)} ? {int(max_delay)} : delay * 2)); "
        "done"
    )
    return shell_line(["bash", "-o", "pipefail", "-c", script])


def tmux_new_window(session: str, window: Window, first: bool, label: str = "") -> list[str]:
    """Creates the session (first window, labelled with the run's `session_label` in
    `RUN_OPTION`) or a window in it, keeping the pane after its process exits so that status
    can show how it ended. One tmux command list: nothing can exit between the window's
    creation and the options being set.

    Raises:
      ValueError: if the command ends with ';', which tmux would read as the end of its own
        command, running the rest as further tmux commands.
    """
    if window.command.endswith(";"):
        raise ValueError(f"window {window.name}: its command may not end with ';' (tmux)")
    # tmux runs the command with its default shell (the user's $SHELL), which need not exec a
    # single command (dash does not): with `exec`, the pane's process is the window's own,
    # whose children are what it runs (`stop_learners_command` finds the learners so).
    create = (
        ["new-session", "-d", "-s", session, "-n", window.name]
        if first
        else ["new-window", "-d", "-t", f"{session}:", "-n", window.name]
    )
    return [
        *create,
        f"exec {window.command}",
        ";",
        "set-option",
        "-w",
        "-t",
        f"{session}:{window.name}",
        "remain-on-exit",
        "on",
        *([";", "set-option", "-t", f"{session}:", RUN_OPTION, label] if first and label else []),
    ]


def tmux_session_label(session: str) -> list[str]:
    """Prints the session's `RUN_OPTION` (nothing for a session started without it)."""
    return ["show-options", "-q", "-v", "-t", f"={session}:", RUN_OPTION]


def tmux_has_session(session: str) -> list[str]:
    # "=" makes tmux match the name exactly, not as a prefix of another session's name.
    return ["has-session", "-t", f"={session}"]


def tmux_list_windows(session: str) -> list[str]:
    return ["list-panes", "-s", "-t", f"={session}", "-F", _STATUS_FORMAT]


def tmux_last_lines(session: str, window: str) -> list[str]:
    # -J joins lines the pane wrapped, so a long progress line comes back whole.
    return ["capture-pane", "-p", "-J", "-t", f"={session}:{window}"]


def tmux_interrupt(session: str, window: str) -> list[str]:
    return ["send-keys", "-t", f"={session}:{window}", "C-c"]


def is_learners_window(name: str) -> bool:
    """Whether the window `name` runs learners (alone, or their mpirun): `learners`, or a
    policy's `policy_<k>_learners` in a run of several policies."""
    pattern = rf"{run_folder.POLICY_PREFIX}[0-9]+_{LEARNERS_WINDOW}"
    return name == LEARNERS_WINDOW or re.fullmatch(pattern, name) is not None


# The names of the processes a learners' window runs its learners with (the learner alone, a
# Python interpreter whose file is named python*, or Open MPI's launcher: mpirun, which Open MPI
# 4 names orterun and 5 execs as prterun), which its other children (tee, the sleep between
# restarts, a shell forked for the pipeline before it execs) are not. Only the pane's own
# children are candidates.
_LEARNER_PROCESS = "mpirun|mpiexec|orterun|prterun|python.*"


def stop_learners_command(session: str, window: str = LEARNERS_WINDOW) -> str:
    """Shell command sending SIGUSR1 to the process the learners' `window` runs them with: the
    learner alone, or the mpirun of several, which passes it on to every learner. They finish
    their step, save a checkpoint and exit. (Ctrl-C would make mpirun kill them a moment later,
    saved or not, and would end the window's tee under a learner alone, which still writes.)
    Exits 1 if no learner runs in the window, or if the interpreter's file is not named python*:
    the caller then sends Ctrl-C."""
    pane = shlex.quote(f"={session}:{window}")
    return (
        f"pkill -USR1 -x -P \"$(tmux display-message -p -t {pane} '#{{pane_pid}}')\" "
        f"-- {shlex.quote(_LEARNER_PROCESS)}"
    )


def tmux_kill_session(session: str) -> list[str]:
    return ["kill-session", "-t", f"={session}"]


def parse_status(listing: str) -> list[tuple[str, bool, str]]:
    """(window, alive, exit status) from `tmux_list_windows` output; the status made printable."""
    rows = []
    for line in listing.splitlines():
        name, dead, status = line.rsplit("|", 2) if line.count("|") >= 2 else (line, "", "")
        rows.append((name, dead != "1", printable(status)))
    return rows


def summary_line(screen: str) -> str:
    """The line that best says how a process is doing: its last progress line (frames), else
    its last line, made printable."""
    lines = [printable(line.strip()) for line in screen.splitlines() if line.strip()]
    progress = [line for line in lines if " frames " in f" {line} "]
    return (progress or lines or [""])[-1]
