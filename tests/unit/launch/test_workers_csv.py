"""The workers CSV: typed rows, and an error naming file, line and field for each bad input."""

import csv
import getpass
import socket
import time

import pytest

from impala.launch import workers_csv
from impala.launch.workers_csv import WorkersCsvError

HEADER = "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices"


def _write(tmp_path, text, name="workers.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _read(tmp_path, text):
    return workers_csv.read_workers(_write(tmp_path, text), default_workdir="/srv/impala")


def test_parses_rows_with_defaults_and_task_numbers(tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("not really a key")
    workers = _read(
        tmp_path,
        f"{HEADER},workdir,python\n"
        "# learners first\n"
        "learner,h1,8001,2222,alice,,0,/opt/impala,/opt/venv/bin/python\n"
        "\n"
        f"actor,h2,,,,{key},,,\n"
        "actor,h3,,22,bob,,\n"
        "learner,h2,8001,,,,1\n",
    )
    assert [(w.job, w.task, w.host) for w in workers] == [
        ("learner", 0, "h1"),
        ("actor", 0, "h2"),
        ("actor", 1, "h3"),
        ("learner", 1, "h2"),
    ]
    first, actor, _, second = workers
    assert (first.tf_port, first.ssh_port, first.ssh_user) == (8001, 2222, "alice")
    assert (first.workdir, first.python, first.cuda_visible_devices) == (
        "/opt/impala",
        "/opt/venv/bin/python",
        "0",
    )
    assert first.line == 3 and first.name == "learner_0" and first.address == "h1:8001"
    assert actor.ssh_port == 22 and actor.ssh_user == getpass.getuser()
    assert actor.ssh_key == str(key) and actor.tf_port is None
    assert actor.workdir == "/srv/impala" and actor.python == "/srv/impala/.venv/bin/python"
    assert second.line == 7 and second.name == "learner_1"


def test_columns_may_come_in_any_order(tmp_path):
    (worker, _) = _read(
        tmp_path,
        "host,job,ssh_key,ssh_user,ssh_port,tf_port,cuda_visible_devices\n"
        "h1,learner,,,22,9000,\nh1,actor,,,22,,\n",
    )
    assert (worker.job, worker.host, worker.tf_port) == ("learner", "h1", 9000)


@pytest.mark.parametrize(
    "body,message",
    [
        ("", r"workers.csv: empty"),
        ("job,host,tf_port\n", r"workers.csv:1: header lacks column\(s\) ssh_port, ssh_user"),
        (f"{HEADER},password\n", r"workers.csv:1: unknown column\(s\) password .*passwords"),
        (f"{HEADER},host\n", r"workers.csv:1: column\(s\) host appear twice"),
        (f"{HEADER}\nlearnr,h1,8001,22,,,\n", r"workers.csv:2: job='learnr': must be one of"),
        (f"{HEADER}\nlearner,,8001,22,,,\n", r"workers.csv:2: host='': must be a host"),
        (f"{HEADER}\nlearner,h1,80x1,22,,,\n", r"workers.csv:2: tf_port='80x1': must be a port"),
        (f"{HEADER}\nlearner,h1,70000,22,,,\n", r"workers.csv:2: tf_port='70000': must be a port"),
        (f"{HEADER}\nlearner,h1,,22,,,\n", r"workers.csv:2: tf_port='': a learner needs"),
        (f"{HEADER}\nactor,h1,,0,,,\n", r"workers.csv:2: ssh_port='0': must be a port"),
        (f"{HEADER}\nactor,h1,,22,,/no/key,\n", r"workers.csv:2: ssh_key='/no/key': no such"),
        (f"{HEADER}\nactor,h1,,22,,,gpu0\n", r"workers.csv:2: cuda_visible_devices='gpu0'"),
        (f"{HEADER},workdir\nactor,h1,,22,,,,rel/dir\n", r"workers.csv:2: workdir='rel/dir'"),
        (f"{HEADER}\nactor,h1,,22,,,,extra\n", r"workers.csv:2: 8 fields but the header has 7"),
        (f"{HEADER}\nactor,h1,,22,,,\n", r"workers.csv: no learner row"),
        (f"{HEADER}\nlearner,h1,8001,22,,,\n", r"workers.csv: no actor row"),
        (
            f"{HEADER}\nlearner,h1,8001,22,,,\nlearner,h1,8001,22,,,\nactor,h2,,22,,,\n",
            r"workers.csv:3: tf_port=8001: h1:8001 is already used on line 2",
        ),
    ],
)
def test_malformed_csv_names_file_line_and_field(tmp_path, body, message):
    with pytest.raises(WorkersCsvError, match=message):
        _read(tmp_path, body)


def test_missing_file(tmp_path):
    with pytest.raises(WorkersCsvError, match=r"nope.csv: cannot read the workers CSV"):
        workers_csv.read_workers(str(tmp_path / "nope.csv"), default_workdir="/srv")


def test_example_csvs_in_sandbox_parse():
    for name in ("local_workers_example.csv", "multi_host_workers_example.csv"):
        workers = workers_csv.read_workers(f"sandbox/{name}", default_workdir="/srv/impala")
        assert {w.job for w in workers} == {"learner", "actor"}


# ---- A CSV from someone else: every field holds only what it may -----------------------------

FIELDS = [*HEADER.split(","), "workdir", "python", "policy"]
LEGAL = {
    "job": "learner",
    "host": "h1",
    "tf_port": "8001",
    "ssh_port": "22",
    "ssh_user": "alice",
    "ssh_key": "",
    "cuda_visible_devices": "0",
    "workdir": "/srv/impala",
    "python": "/srv/impala/.venv/bin/python",
    "policy": "0",
}


def _refused(tmp_path, **values):
    """The one-line error for a CSV whose line 2 is a learner with `values` (line 3 an actor)."""
    path = tmp_path / "hostile.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        writer.writerow([values.get(name, LEGAL[name]) for name in FIELDS])
        writer.writerow(["actor", "h2", "", "22", "", "", "", "", "", "0"])
    with pytest.raises(WorkersCsvError) as raised:
        workers_csv.read_workers(str(path), default_workdir="/srv/impala")
    message = str(raised.value)
    assert "\n" not in message and "\r" not in message, message
    return str(path), message


HOSTILE = [
    "$(touch /tmp/PWNED)",
    "`touch /tmp/PWNED`",
    "x; touch /tmp/PWNED",
    "'; touch /tmp/PWNED; '",
    "-oProxyCommand=touch /tmp/PWNED",
    "a b",
    'a"b',
    "a|b",
    "a&b",
    "a>b",
    "a*",
    "a/b",
    "a\\b",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_host_is_a_host_name_or_address_only(tmp_path, value):
    path, message = _refused(tmp_path, host=value)
    assert message == (
        f"{path}:2: host={value!r}: must be a host name (letters, digits, '-' and '.') or an IP "
        "address"
    )


@pytest.mark.parametrize(
    "value",
    [
        "-h1",
        "h1-",
        "a..b",
        ".h1",
        "h1.",
        "h_1",
        "a" * 64,
        ".".join(["a" * 63] * 4) + "a" * 2,
        "fe80::1%eth0",
        "1.2.3.4:22",
        "[::1]",
        "héte",
    ],
)
def test_a_host_follows_rfc_1123(tmp_path, value):
    path, message = _refused(tmp_path, host=value)
    assert message.startswith(f"{path}:2: host={value!r}: must be a host name")


def test_host_names_and_addresses_that_are_accepted(tmp_path):
    path = tmp_path / "hosts.csv"
    hosts = ["node-1.example.lan", "10.0.0.2", "::1", "fe80::1", "localhost", "1host", "A" * 63]
    path.write_text(
        f"{HEADER}\n"
        + "".join(f"learner,{host},8001,22,,,\n" for host in hosts)
        + "actor,h2,,22,,,\n"
    )
    workers = workers_csv.read_workers(str(path), default_workdir="/srv")
    assert [w.host for w in workers[:-1]] == hosts
    # An IPv6 learner's --learner_hosts entry takes brackets: "::1:8001" would be ambiguous.
    assert [w.address for w in workers[2:4]] == ["[::1]:8001", "[fe80::1]:8001"]


@pytest.mark.parametrize(
    "value", [*HOSTILE, "-alice", "al ice", "al'ice", "a$b", "a" * 33, "élodie", "a:b", "a@b"]
)
def test_an_ssh_user_is_a_posix_user_name(tmp_path, value):
    path, message = _refused(tmp_path, ssh_user=value)
    assert message.startswith(f"{path}:2: ssh_user={value!r}: must be a user name: letters")


def test_an_empty_ssh_user_is_your_user_name_if_it_is_one(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGNAME", "me\nProxyCommand touch /tmp/PWNED")
    path = tmp_path / "users.csv"
    path.write_text(f"{HEADER}\nlearner,h1,8001,22,,,\nactor,h2,,22,,,\n")
    with pytest.raises(WorkersCsvError) as raised:
        workers_csv.read_workers(str(path), default_workdir="/srv")
    assert str(raised.value).startswith(
        f"{path}:2: ssh_user='': your user name here, 'me\\nProxyCommand touch /tmp/PWNED', is "
        "not a user name"
    )


def test_user_names_that_are_accepted(tmp_path):
    path = tmp_path / "users.csv"
    users = ["alice", "Alice_1", "svc.user-2", "_daemon", "machine$", "a" * 32]
    path.write_text(
        f"{HEADER}\n"
        + "".join(f"learner,h1,{8001 + i},22,{user},,\n" for i, user in enumerate(users))
        + "actor,h2,,22,,,\n"
    )
    workers = workers_csv.read_workers(str(path), default_workdir="/srv")
    assert [w.ssh_user for w in workers[:-1]] == users


@pytest.mark.parametrize("name", workers_csv.REQUIRED_COLUMNS + workers_csv.OPTIONAL_COLUMNS)
@pytest.mark.parametrize(
    "character", ["\n", "\r", "\0", "\t", "\x1b", "\x7f", "\x85", "\u2028", "\u202e"]
)
def test_a_control_character_in_any_field_is_refused(tmp_path, name, character):
    value = f"{LEGAL[name] or '/k'}{character}ProxyCommand touch /tmp/PWNED"
    path, message = _refused(tmp_path, **{name: value})
    assert message == (
        f"{path}:2: {name}={value!r}: contains {character!r} (U+{ord(character):04X}), a "
        "control or other non-printable character"
    )


def test_a_control_character_in_the_header_is_refused(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text(f'{HEADER},"workdir\nProxyCommand x"\n')
    with pytest.raises(WorkersCsvError, match=r"header.csv:1: header='workdir\\nProxyCommand x'"):
        workers_csv.read_workers(str(path), default_workdir="/srv")


def test_paths_may_hold_spaces_quotes_and_shell_characters_and_stay_intact(tmp_path):
    workdir = "/srv/my project/it's #1 $(not run) `nor this`; & | > *"
    python = "/opt/py 3/'bin'/python"
    path = tmp_path / "paths.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        writer.writerow(["learner", "h1", "8001", "22", "alice", "", "", workdir, python, "0"])
        writer.writerow(["actor", "h1", "", "22", "alice", "", "", workdir, "", "0"])
    learner, actor = workers_csv.read_workers(str(path), default_workdir="/srv")
    assert (learner.policy, actor.policy) == (0, 0)
    assert (learner.workdir, learner.python) == (workdir, python)
    assert (actor.workdir, actor.python) == (workdir, f"{workdir}/.venv/bin/python")


@pytest.mark.parametrize("name", ["workdir", "python"])
@pytest.mark.parametrize("value", ["-oProxyCommand=touch /tmp/PWNED", "$(touch /tmp/x)", "py"])
def test_workdir_and_python_are_absolute_paths(tmp_path, name, value):
    path, message = _refused(tmp_path, **{name: value})
    assert message == f"{path}:2: {name}={value!r}: must be an absolute path"


@pytest.mark.parametrize("name", ["workdir", "python"])
@pytest.mark.parametrize("value", ["/tmp/e/L/../../home/me/proj", "/srv/./proj", "/srv/proj/.."])
def test_workdir_and_python_may_not_hold_dot_parts(tmp_path, name, value):
    # The kernel takes '..' after the link before it, a check of the text would not: a path
    # could pass as one file and run as another.
    path, message = _refused(tmp_path, **{name: value})
    assert message == f"{path}:2: {name}={value!r}: may not hold '.' or '..' as a part"


@pytest.mark.parametrize("character", ['"', "\\", "$"])
def test_an_ssh_key_path_mpiruns_ssh_config_cannot_hold_is_refused(tmp_path, character):
    key = tmp_path / f"id{character}key"
    key.write_text("not really a key")
    path, message = _refused(tmp_path, ssh_key=str(key))
    assert message.startswith(f"{path}:2: ssh_key={str(key)!r}: may not contain")


def test_an_ssh_key_must_be_a_file(tmp_path):
    path, message = _refused(tmp_path, ssh_key=str(tmp_path))
    assert message == f"{path}:2: ssh_key={str(tmp_path)!r}: no such private key file"


def test_an_ssh_key_larger_than_any_key_is_refused_before_anything_reads_it(tmp_path):
    # paramiko would read it whole into the frontend's memory: a CSV may name any file.
    key = tmp_path / "huge"
    with open(key, "wb") as f:
        f.truncate(workers_csv.MAX_KEY_BYTES + 1)
    path, message = _refused(tmp_path, ssh_key=str(key))
    assert message == f"{path}:2: ssh_key={str(key)!r}: over 64 KiB: not a private key file"


@pytest.mark.parametrize(
    "name,value",
    [
        ("tf_port", "²"),  # str.isdigit() says yes, int() says no: it was a traceback
        ("tf_port", "٨٠٠١"),  # Arabic-Indic digits: int() reads them, a port is ASCII
        ("tf_port", "-1"),
        ("ssh_port", "2 2"),
        ("cuda_visible_devices", "0;touch /tmp/PWNED"),
        ("cuda_visible_devices", "0,,1"),
        ("cuda_visible_devices", "²"),
    ],
)
def test_ports_and_devices_are_ascii_digits(tmp_path, name, value):
    path, message = _refused(tmp_path, **{name: value})
    assert message.startswith(f"{path}:2: {name}={value!r}: must be")


def test_a_field_over_the_csv_modules_limit_names_its_line(tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text(f"{HEADER}\nlearner,h1,8001,22,,,\nactor,{'h' * 200_000},,22,,,\n")
    with pytest.raises(WorkersCsvError) as raised:
        workers_csv.read_workers(str(path), default_workdir="/srv")
    assert str(raised.value) == (
        f"{path}:3: not a CSV row: field larger than field limit ({csv.field_size_limit()})"
    )


def test_a_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(f"{HEADER}\nlearner,h1,8001,22,,,\n".encode() + b"actor,h\xe9,,22,,,\n")
    with pytest.raises(WorkersCsvError) as raised:
        workers_csv.read_workers(str(path), default_workdir="/srv")
    assert str(raised.value) == f"{path}:3: not UTF-8 text (byte 0xe9)"


def test_a_file_far_larger_than_a_workers_csv_is_refused_unread(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text(f"{HEADER}\n" + "# padding\n" * 200_000)
    with pytest.raises(WorkersCsvError, match=r"big.csv: larger than 1048576 bytes"):
        workers_csv.read_workers(str(path), default_workdir="/srv")


def test_lines_are_counted_in_the_file_across_quoted_line_breaks(tmp_path):
    path = tmp_path / "multiline.csv"
    path.write_text(f'{HEADER}\n# a "comment\n\nlearner,h1,8001,22,,,\nactor,"h\n2",,22,,,\n')
    with pytest.raises(WorkersCsvError, match=r"multiline.csv:5: host='h\\n2': contains"):
        workers_csv.read_workers(str(path), default_workdir="/srv")


def test_a_spreadsheets_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(
        b"\xef\xbb\xbf" + f"{HEADER}\nlearner,h1,8001,22,,,\nactor,h2,,22,,,\n".encode()
    )
    assert [w.job for w in workers_csv.read_workers(str(path), default_workdir="/srv")] == [
        "learner",
        "actor",
    ]


@pytest.mark.parametrize(
    "first, second",
    [("localhost", "127.0.0.1"), ("127.0.0.1", "localhost"), ("::ffff:127.0.0.1", "127.0.0.1")],
)
def test_two_names_of_one_learner_endpoint_are_refused_naming_both_lines(tmp_path, first, second):
    path = _write(
        tmp_path,
        f"{HEADER}\nlearner,{first},8001,22,,,\nactor,h2,,22,,,\nlearner,{second},8001,22,,,\n",
    )
    with pytest.raises(WorkersCsvError) as raised:
        workers_csv.read_workers(path, default_workdir="/srv")
    first_address = f"[{first}]" if ":" in first else first
    assert str(raised.value) == (
        f"{path}: lines 2 and 4: {first_address}:8001 and {second}:8001 are one endpoint (both "
        "reach 127.0.0.1); name each learner once, with a port of its own"
    )


def test_a_name_and_its_address_are_one_host_too(tmp_path, monkeypatch):
    addresses = {"node1.lan": ["10.0.0.5"], "node2.lan": ["10.0.0.6"], "10.0.0.5": ["10.0.0.5"]}

    def getaddrinfo(host, port, type=0):
        if host not in addresses:
            raise socket.gaierror(-2, "Name or service not known")
        return [(2, 1, 6, "", (address, 0)) for address in addresses[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    rows = f"{HEADER}\nlearner,node1.lan,8001,22,,,\nlearner,node2.lan,8001,22,,,\nactor,h,,22,,,\n"
    assert len(_read(tmp_path, rows)) == 3  # two hosts: one port each
    other_port = rows + "learner,10.0.0.5,8002,22,,,\n"
    assert len(_read(tmp_path, other_port)) == 4  # one host, two ports
    with pytest.raises(WorkersCsvError, match=r"lines 2 and 5: node1.lan:8001 and 10.0.0.5:8001"):
        _read(tmp_path, rows + "learner,10.0.0.5,8001,22,,,\n")
    # A name that does not resolve is taken as it is, as before.
    assert len(_read(tmp_path, rows + "learner,node9.lan,8001,22,,,\n")) == 4


def test_a_resolver_that_hangs_holds_the_csv_up_for_a_bounded_time(tmp_path, monkeypatch):
    def getaddrinfo(host, port, type=0):
        time.sleep(30)  # long after the test: the answer, if it came, would not be waited for
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(workers_csv, "RESOLVE_TIMEOUT_SECS", 0.5)
    started = time.monotonic()
    workers = _read(
        tmp_path, f"{HEADER}\nlearner,h1,8001,22,,,\nlearner,h2,8001,22,,,\nactor,h1,,22,,,\n"
    )
    assert len(workers) == 3 and time.monotonic() - started < 5
