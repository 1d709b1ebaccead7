"""The workers CSV: typed rows, and an error naming file, line and field for each bad input."""

import getpass

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
