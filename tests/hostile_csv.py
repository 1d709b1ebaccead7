"""A workers CSV from an attacker: values that run a command if anything pastes them into a shell
or an ssh config unquoted, and a stand-in project folder that records where its processes ran."""

import csv
import json
import os
import sys

from impala.launch import workers_csv

COLUMNS = workers_csv.REQUIRED_COLUMNS + workers_csv.OPTIONAL_COLUMNS

# Each (but the last) creates `marker` if it ever runs: in a shell, in ssh's config or as an
# option.
INJECTIONS = {
    "dollar": "$(touch {marker})",
    "backticks": "`touch {marker}`",
    "semicolon": "x; touch {marker}",
    "quotes": "'; touch {marker}; '",
    "newline": "x\nProxyCommand touch {marker}",
    "option": "-oProxyCommand=touch {marker}",
    # Runs nothing itself, but has neither a space nor a '/' for a weaker check to catch.
    "bare_option": "-oProxyCommand=true",
}
# Those that are legitimate in a path once it is absolute, and a plain space.
SHELL_INJECTIONS = ("dollar", "backticks", "semicolon", "quotes")
PATH_NAMES = (*SHELL_INJECTIONS, "space")


def injection(name: str, marker) -> str:
    return INJECTIONS[name].format(marker=marker)


def hostile_path(directory, name: str, marker) -> str:
    """An absolute path under `directory` whose last part is injection `name` (or has a space)."""
    return os.path.join(str(directory), "a b" if name == "space" else injection(name, marker))


def write_csv(path, rows: list[dict]) -> str:
    """Writes `rows` (column -> value; missing columns empty) as a workers CSV, quoting as the
    csv module does (a line break stays inside its field)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row.get(column, "") for column in COLUMNS])
    return str(path)


# What every process of the run starts in its workdir instead of the project's experiment.py:
# one line saying where it ran and as what, then it exits (its tmux window stays, dead).
_RECORDER = """\
import json, os, sys
role = [a for a in sys.argv if a.startswith(("--job_name=", "--task="))]
rank = os.environ.get("OMPI_COMM_WORLD_RANK")
print("RAN " + json.dumps({"cwd": os.getcwd(), "role": role, "rank": rank}), flush=True)
"""


def records(text: str) -> list[dict]:
    """Every "RAN {...}" record in a log. mpirun forwards its ranks' output in chunks that need
    not end at a line's end, so two records may share a line."""
    decoder, found = json.JSONDecoder(), []
    start = text.find("RAN ")
    while start >= 0:
        try:
            record, end = decoder.raw_decode(text, start + len("RAN "))
        except json.JSONDecodeError:  # one still being written
            break
        found.append(record)
        start = text.find("RAN ", end)
    return found


def recording_project(workdir: str, python: str) -> None:
    """Makes `workdir` a project folder whose experiment.py records where it ran, and `python`
    a link to this interpreter (both paths may hold anything a path can)."""
    os.makedirs(workdir)
    with open(os.path.join(workdir, "experiment.py"), "w") as f:
        f.write(_RECORDER)
    os.makedirs(os.path.dirname(python), exist_ok=True)
    os.symlink(os.path.realpath(sys.executable), python)
