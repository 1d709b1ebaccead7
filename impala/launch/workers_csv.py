"""The workers CSV: one row per process of a run, parsed into typed rows or a precise error.

Columns (header row required, any order; see sandbox/README.md):
  job                   learner | actor
  host                  where the process runs (name or address)
  tf_port               learners: the port actors reach it on; actors: unused (may be empty)
  ssh_port              SSH port of the host (default 22)
  ssh_user              SSH user (default: the current user)
  ssh_key               private key file; empty: the SSH agent and default keys
  cuda_visible_devices  GPUs for the process; empty: none
  workdir   (optional)  where the project lives on that host (default: where it lives here)
  python    (optional)  its interpreter (default: <workdir>/.venv/bin/python)

Passwords are never read from this file.
"""

from __future__ import annotations

import csv
import dataclasses
import getpass
import os

REQUIRED_COLUMNS = (
    "job",
    "host",
    "tf_port",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "cuda_visible_devices",
)
OPTIONAL_COLUMNS = ("workdir", "python")
JOBS = ("learner", "actor")


class WorkersCsvError(ValueError):
    """A problem in the workers CSV; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class Worker:
    """One process of the run, as the CSV describes it.

    Attributes:
      job: "learner" or "actor".
      task: index among the workers of the same job, in file order (learner rank, actor task).
      line: line number in the CSV, for messages.
    """

    job: str
    task: int
    host: str
    tf_port: int | None
    ssh_port: int
    ssh_user: str
    ssh_key: str
    cuda_visible_devices: str
    workdir: str
    python: str
    line: int

    @property
    def name(self) -> str:
        """The process's name in tmux and logs, e.g. `actor_3`, `learner_0`."""
        return f"{self.job}_{self.task}"

    @property
    def address(self) -> str:
        """`host:tf_port` (learners)."""
        return f"{self.host}:{self.tf_port}"


def read_workers(path: str, default_workdir: str) -> list[Worker]:
    """Parses and checks the CSV at `path`.

    Args:
      path: the CSV file.
      default_workdir: workdir for rows that leave it empty (the project's folder here).

    Raises:
      WorkersCsvError: naming the file, line and field of the first problem found.
    """
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as error:
        raise WorkersCsvError(f"{path}: cannot read the workers CSV: {error.strerror}") from None
    rows = [(number, row) for number, row in enumerate(rows, start=1) if _has_content(row)]
    if not rows:
        raise WorkersCsvError(f"{path}: empty; it needs a header row and one row per process")
    header_line, header = rows[0]
    columns = _check_header(path, header_line, header)
    counts = {job: 0 for job in JOBS}
    workers = []
    for number, row in rows[1:]:
        worker = _parse_row(path, number, row, columns, counts, default_workdir)
        counts[worker.job] += 1
        workers.append(worker)
    _check_run(path, workers)
    return workers


def _has_content(row: list[str]) -> bool:
    # Blank lines and lines whose first field starts with '#' are skipped.
    return any(field.strip() for field in row) and not row[0].lstrip().startswith("#")


def _check_header(path: str, line: int, header: list[str]) -> dict[str, int]:
    names = [name.strip().lower() for name in header]
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        raise WorkersCsvError(
            f"{path}:{line}: header lacks column(s) {', '.join(missing)} "
            f"(required: {', '.join(REQUIRED_COLUMNS)})"
        )
    unknown = [n for n in names if n not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    if unknown:
        raise WorkersCsvError(
            f"{path}:{line}: unknown column(s) {', '.join(unknown)} "
            f"(known: {', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)}; passwords are never "
            "read from this file)"
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise WorkersCsvError(f"{path}:{line}: column(s) {', '.join(duplicates)} appear twice")
    return {name: index for index, name in enumerate(names)}


def _parse_row(path, number, row, columns, counts, default_workdir) -> Worker:
    if len(row) > len(columns):
        raise WorkersCsvError(
            f"{path}:{number}: {len(row)} fields but the header has {len(columns)}"
        )

    def field(name: str) -> str:
        index = columns.get(name)
        return row[index].strip() if index is not None and index < len(row) else ""

    def fail(name: str, what: str):
        raise WorkersCsvError(f"{path}:{number}: {name}={field(name)!r}: {what}")

    job = field("job").lower()
    if job not in JOBS:
        fail("job", f"must be one of {', '.join(JOBS)}")
    host = field("host")
    if not host or any(c.isspace() for c in host) or "/" in host:
        fail("host", "must be a host name or address")
    tf_port = _port(field("tf_port")) if field("tf_port") else None
    if field("tf_port") and tf_port is None:
        fail("tf_port", "must be a port number in 1-65535")
    if job == "learner" and tf_port is None:
        fail("tf_port", "a learner needs the port its actors connect to")
    ssh_port = _port(field("ssh_port") or "22")
    if ssh_port is None:
        fail("ssh_port", "must be a port number in 1-65535")
    ssh_key = os.path.expanduser(field("ssh_key"))
    if ssh_key and not os.path.isfile(ssh_key):
        fail("ssh_key", "no such private key file")
    devices = field("cuda_visible_devices")
    if devices and not all(part.strip().isdigit() for part in devices.split(",")):
        fail("cuda_visible_devices", "must be empty or GPU indices like 0 or 0,1")
    workdir = field("workdir") or default_workdir
    if not os.path.isabs(workdir):
        fail("workdir", "must be an absolute path")
    return Worker(
        job=job,
        task=counts[job],
        host=host,
        tf_port=tf_port,
        ssh_port=ssh_port,
        ssh_user=field("ssh_user") or getpass.getuser(),
        ssh_key=ssh_key,
        cuda_visible_devices=devices,
        workdir=workdir,
        python=field("python") or os.path.join(workdir, ".venv", "bin", "python"),
        line=number,
    )


def _port(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


def _check_run(path: str, workers: list[Worker]) -> None:
    for job in JOBS:
        if not any(w.job == job for w in workers):
            raise WorkersCsvError(f"{path}: no {job} row; a run needs at least one {job}")
    seen: dict[tuple[str, int], Worker] = {}
    for worker in workers:
        if worker.tf_port is None:
            continue
        key = (worker.host, worker.tf_port)
        if key in seen:
            raise WorkersCsvError(
                f"{path}:{worker.line}: tf_port={worker.tf_port}: {worker.host}:{worker.tf_port} "
                f"is already used on line {seen[key].line}"
            )
        seen[key] = worker
