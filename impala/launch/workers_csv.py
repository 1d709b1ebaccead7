"""The workers CSV: one row per process of a run, parsed into typed rows or a precise error.

Columns (header row required, any order; see sandbox/README.md):
  job                   learner | actor
  host                  where the process runs: a DNS host name or an IPv4/IPv6 address
  tf_port               learners: the port actors reach it on; actors: unused (may be empty)
  ssh_port              SSH port of the host (default 22)
  ssh_user              SSH user, a POSIX user name (default: the current user)
  ssh_key               private key file; empty: the SSH agent and default keys
  cuda_visible_devices  GPUs for the process, e.g. 0 or 0,1; empty: none
  workdir   (optional)  absolute path of the project on that host (default: where it lives here)
  python    (optional)  absolute path of its interpreter (default: <workdir>/.venv/bin/python)
  policy    (optional)  with --num_policies: which policy the process trains or plays for (0,
                        1, ...); if one row names one, every row does. Without (the column
                        absent or empty), learners are split into contiguous blocks in rank
                        order and actor i plays for policy i mod --num_policies
                        (`run_layout.policy_layouts`).

Each learner endpoint (host and tf_port) appears once: two rows of one port whose hosts resolve to
a shared address (`localhost` and `127.0.0.1`, a name and its address) are refused too.

Passwords are never read from this file. The file comes from others: every field is checked
against what it may hold before anything uses it (no control characters anywhere; host and user
only in their usual syntax), and every command built from the rows quotes what it interpolates.
"""

from __future__ import annotations

import csv
import dataclasses
import getpass
import io
import ipaddress
import os
import posixpath
import re

from impala.configs import addresses

REQUIRED_COLUMNS = (
    "job",
    "host",
    "tf_port",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "cuda_visible_devices",
)
OPTIONAL_COLUMNS = ("workdir", "python", "policy")
JOBS = ("learner", "actor")

# How long the hosts of rows that share a port may take to resolve, all together, before each
# name that has not is taken as it is (`resolve`).
RESOLVE_TIMEOUT_SECS = 5.0
# A workers CSV has one short row per process; anything much larger is not one.
MAX_BYTES = 1 << 20
# A private key file is a few KiB (an RSA key of 16,384 bits, about 12); paramiko reads one whole.
MAX_KEY_BYTES = 64 << 10
# RFC 1123 host names: labels of letters, digits and hyphens (not first or last), dots between.
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
# POSIX user names (as useradd accepts them, upper case too): never an option, never two words.
_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*[$]?")
_DEVICES = re.compile(r"[0-9]+(,[0-9]+)*")
# Characters a path cannot hold if it is written into the ssh config mpirun uses: OpenSSH's
# parsers disagree on backslashes inside quotes, and expand ${...} with no way to escape it.
SSH_CONFIG_UNSAFE = frozenset({'"', "\\", "$"})


class WorkersCsvError(ValueError):
    """A problem in the workers CSV; the message names the file, line and field."""


@dataclasses.dataclass(frozen=True)
class Worker:
    """One process of the run, as the CSV describes it.

    Attributes:
      job: "learner" or "actor".
      task: index among the workers of the same job, in file order (learner rank, actor task).
      line: line number in the CSV, for messages.
      policy: the policy the CSV's `policy` column gives it; None without the column.
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
    policy: int | None = None

    @property
    def name(self) -> str:
        """The process's name in tmux and logs, e.g. `actor_3`, `learner_0`."""
        return f"{self.job}_{self.task}"

    @property
    def address(self) -> str:
        """`host:tf_port` (learners); `[v6 address]:tf_port` for an IPv6 address."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.tf_port}"


def read_workers(path: str, default_workdir: str) -> list[Worker]:
    """Parses and checks the CSV at `path`.

    Args:
      path: the CSV file.
      default_workdir: workdir for rows that leave it empty (the project's folder here).

    Raises:
      WorkersCsvError: naming the file, line and field of the first problem found.
    """
    rows = [(number, row) for number, row in _read_rows(path) if _has_content(row)]
    if not rows:
        raise WorkersCsvError(f"{path}: empty; it needs a header row and one row per process")
    header_line, header = rows[0]
    for value in header:
        _check_printable(path, header_line, "header", value)
    columns = _check_header(path, header_line, header)
    counts = {job: 0 for job in JOBS}
    workers = []
    for number, row in rows[1:]:
        worker = _parse_row(path, number, row, columns, counts, default_workdir)
        counts[worker.job] += 1
        workers.append(worker)
    _check_run(path, workers)
    return workers


def _read_rows(path: str) -> list[tuple[int, list[str]]]:
    """(line where the row starts, fields) for every row; one-line errors for a file that is not
    UTF-8 text or not CSV."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as error:
        raise WorkersCsvError(f"{path}: cannot read the workers CSV: {error.strerror}") from None
    if len(data) > MAX_BYTES:
        raise WorkersCsvError(
            f"{path}: larger than {MAX_BYTES} bytes: not a workers CSV (one short row per process)"
        )
    try:
        text = data.decode("utf-8-sig")  # a byte order mark (as spreadsheets write) is skipped
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise WorkersCsvError(
            f"{path}:{line}: not UTF-8 text (byte {data[error.start]:#04x})"
        ) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = []
    start = 1
    try:
        for row in reader:
            rows.append((start, row))
            start = reader.line_num + 1
    except csv.Error as error:
        raise WorkersCsvError(f"{path}:{start}: not a CSV row: {error}") from None
    return rows


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
    for name, index in columns.items():
        if index < len(row):
            _check_printable(path, number, name, row[index])

    def field(name: str) -> str:
        index = columns.get(name)
        return row[index].strip() if index is not None and index < len(row) else ""

    def fail(name: str, what: str):
        raise WorkersCsvError(f"{path}:{number}: {name}={field(name)!r}: {what}")

    job = field("job").lower()
    if job not in JOBS:
        fail("job", f"must be one of {', '.join(JOBS)}")
    host = field("host")
    if not is_host(host):
        fail("host", "must be a host name (letters, digits, '-' and '.') or an IP address")
    tf_port = _port(field("tf_port")) if field("tf_port") else None
    if field("tf_port") and tf_port is None:
        fail("tf_port", "must be a port number in 1-65535")
    if job == "learner" and tf_port is None:
        fail("tf_port", "a learner needs the port its actors connect to")
    ssh_port = _port(field("ssh_port") or "22")
    if ssh_port is None:
        fail("ssh_port", "must be a port number in 1-65535")
    ssh_user = field("ssh_user")
    if ssh_user and not is_user_name(ssh_user):
        fail(
            "ssh_user",
            "must be a user name: letters, digits, '_', '.', '-' (not first) and a final '$', "
            "at most 32 characters",
        )
    ssh_key = os.path.expanduser(field("ssh_key"))
    if ssh_key and not os.path.isfile(ssh_key):
        fail("ssh_key", "no such private key file")
    if ssh_key and os.path.getsize(ssh_key) > MAX_KEY_BYTES:
        # paramiko reads a key file whole, and a CSV may name any file.
        fail("ssh_key", f"over {MAX_KEY_BYTES // 1024} KiB: not a private key file")
    if any(c in SSH_CONFIG_UNSAFE for c in ssh_key):
        fail("ssh_key", "may not contain \", \\ or $ (they cannot go into mpirun's ssh config)")
    devices = "".join(field("cuda_visible_devices").split())
    if devices and not _DEVICES.fullmatch(devices):
        fail("cuda_visible_devices", "must be empty or GPU indices like 0 or 0,1")
    workdir = field("workdir") or default_workdir
    if not posixpath.isabs(workdir):
        fail("workdir", "must be an absolute path")
    python = field("python") or posixpath.join(workdir, ".venv", "bin", "python")
    if not posixpath.isabs(python):
        fail("python", "must be an absolute path")
    # The kernel takes '..' after the link before it, the shell and the checks by its text: a
    # path could be checked as one file and run as another.
    for name, value in (("workdir", workdir), ("python", python)):
        if {".", ".."} & set(value.split("/")):
            fail(name, "may not hold '.' or '..' as a part")
    policy = None
    if field("policy"):
        if not re.fullmatch(r"[0-9]{1,3}", field("policy")):
            fail("policy", "must be a policy number: 0, 1, ...")
        policy = int(field("policy"))
    return Worker(
        job=job,
        task=counts[job],
        host=host,
        tf_port=tf_port,
        ssh_port=ssh_port,
        ssh_user=ssh_user or _current_user(path, number),
        ssh_key=ssh_key,
        cuda_visible_devices=devices,
        workdir=workdir,
        python=python,
        line=number,
        policy=policy,
    )


def is_host(text: str) -> bool:
    """Whether `text` is an IPv4 or IPv6 address (no zone) or an RFC 1123 host name: never an
    option (`-...`), never anything a shell or an ssh config reads as more than a name."""
    try:
        ipaddress.ip_address(text)
        return "%" not in text
    except ValueError:
        pass
    labels = text.split(".")
    return 0 < len(text) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def is_user_name(text: str) -> bool:
    """Whether `text` is a POSIX user name: no option, whitespace, quote or control character."""
    return len(text) <= 32 and _USER_NAME.fullmatch(text) is not None


def _current_user(path: str, number: int) -> str:
    user = getpass.getuser()
    if not is_user_name(user):
        raise WorkersCsvError(
            f"{path}:{number}: ssh_user='': your user name here, {user!r}, is not a user name "
            "SSH can be given safely; name the user"
        )
    return user


def _check_printable(path: str, number: int, name: str, value: str) -> None:
    """Refuses control characters (newline, carriage return, NUL, escape, ...) and other
    characters that do not print, in any field: they would end or change a command line, an
    ssh config line or a message."""
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise WorkersCsvError(
            f"{path}:{number}: {name}={value!r}: contains {bad!r} (U+{ord(bad):04X}), "
            "a control or other non-printable character"
        )


def _port(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[0-9]{1,5}", text) and 0 < int(text) < 65536 else None


def _check_run(path: str, workers: list[Worker]) -> None:
    for job in JOBS:
        if not any(w.job == job for w in workers):
            raise WorkersCsvError(f"{path}: no {job} row; a run needs at least one {job}")
    named = next((w for w in workers if w.policy is not None), None)
    unnamed = next((w for w in workers if w.policy is None), None)
    if named and unnamed:
        raise WorkersCsvError(
            f"{path}:{unnamed.line}: policy='': names no policy, but line {named.line} names "
            f"policy {named.policy}: give every row its policy, or none"
        )
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
    _check_endpoints(path, list(seen.values()))


def _check_endpoints(path: str, workers: list[Worker]) -> None:
    """Refuses two rows of one port whose hosts resolve to a shared address: one endpoint
    under two names (`localhost` and `127.0.0.1`, a name and its address). A name that does not
    resolve in time is left as it is."""
    by_port: dict[int, list[Worker]] = {}
    for worker in workers:
        by_port.setdefault(worker.tf_port, []).append(worker)
    shared = [group for group in by_port.values() if len(group) > 1]
    if not shared:
        return
    addresses = resolve({worker.host for group in shared for worker in group})
    for group in shared:
        for index, worker in enumerate(group):
            for other in group[:index]:
                common = addresses.get(other.host, set()) & addresses.get(worker.host, set())
                if common:
                    raise WorkersCsvError(
                        f"{path}: lines {other.line} and {worker.line}: {other.address} and "
                        f"{worker.address} are one endpoint (both reach {min(common)}); name "
                        "each learner once, with a port of its own"
                    )


def resolve(hosts: set[str], timeout: float | None = None) -> dict[str, set[str]]:
    """`addresses.resolve` within `timeout` seconds (default `RESOLVE_TIMEOUT_SECS`)."""
    return addresses.resolve(hosts, RESOLVE_TIMEOUT_SECS if timeout is None else timeout)
