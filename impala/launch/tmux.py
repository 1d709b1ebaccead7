"""tmux command lists and the parsing of tmux's answers, as pure functions.

Local hosts (libtmux) and SSH hosts (the `tmux` command) in `hosts.py` run the same lists, so that
tests can compare them as strings.
"""

from __future__ import annotations

import shlex

from impala.launch import planning

# Printable separators: tmux replaces control characters such as a tab when the client has no
# UTF-8 locale (as over a plain SSH command).
_STATUS_FORMAT = "#{window_name}|#{pane_dead}|#{pane_dead_status}"


def tmux_new_window(session: str, window: planning.Window, first: bool) -> list[str]:
    """Creates the session (first window) or a window in it, keeping the pane after its process
    exits so that status can show how it ended. One tmux command list: nothing can exit between
    the window's creation and the option being set.

    Raises:
      ValueError: if the command ends with ';', which tmux would read as the end of its own
        command, running the rest as further tmux commands.
    """
    if window.command.endswith(";"):
        raise ValueError(f"window {window.name}: its command may not end with ';' (tmux)")
    create = (
        ["new-session", "-d", "-s", session, "-n", window.name]
        if first
        else ["new-window", "-d", "-t", f"{session}:", "-n", window.name]
    )
    return [
        *create,
        window.command,
        ";",
        "set-option",
        "-w",
        "-t",
        f"{session}:{window.name}",
        "remain-on-exit",
        "on",
    ]


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


def stop_learners_command(session: str) -> str:
    """Shell command sending SIGUSR1 to the run's mpirun, which passes it on to every learner:
    they finish their step, save a checkpoint and exit. (Ctrl-C would make mpirun kill them a
    moment later, saved or not.) Exits 1 if no mpirun runs in the window."""
    pane = shlex.quote(f"={session}:{planning.LEARNERS_WINDOW}")
    return f"pkill -USR1 -x mpirun -P \"$(tmux display-message -p -t {pane} '#{{pane_pid}}')\""


def tmux_kill_session(session: str) -> list[str]:
    return ["kill-session", "-t", f"={session}"]


def printable(text: str) -> str:
    """`text` with every character a terminal could act on (escape sequences, carriage returns,
    other control and format characters) replaced by '?'. A worker host's answers are printed on
    the user's terminal, and a hostile host could otherwise rewrite or hide what it shows."""
    return "".join(char if char.isprintable() else "?" for char in text)


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
