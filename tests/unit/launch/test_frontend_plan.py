"""The CSV frontend's plan: which host runs what, with the exact command lines."""

import csv
import dataclasses
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile

import pytest

from impala import run_folder
from impala.launch import (
    learner_plan,
    planning,
    run_control,
    run_layout,
    run_plan,
    tmux,
    workers_csv,
)
from impala.launch.containers import Containers
from tests.helpers import read_text, run_without_ml_stack, wait_until

HEADER = "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices,workdir,python"
CSV = f"""{HEADER}
learner,n1,8001,22,alice,,0,/w,
actor,n2,,2222,bob,,,/w,/opt/py
learner,n2,8001,2222,bob,,1,/w,
actor,n1,,22,alice,,,/w,
learner,n1,8002,22,alice,,,/w,
"""


def _plan(tmp_path, local_hosts=frozenset(), accept=False):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    return run_plan.plan_run(
        workers,
        ["--batch_size=32", "--level_name=PongNoFrameskip-v4"],
        "cluster",
        local_hosts=local_hosts,
        accept_unknown_host_keys=accept,
    )


# A window's script: owner-only files, into the workdir, then the process in a restart loop (see
# `_in_workdir`).
_SUPERVISED = re.compile(
    r"umask 077; (cd .+? && mkdir -p .+?) \|\| exit 1; restarts=0; delay=1; while true; do "
    r"(.+? 2>&1 \| tee -a .+?); code=\$\?; case \$code in 0\|2\|130\) exit \$code;; esac; "
    r".* done",
    re.S,
)


def _script(window):
    """The shell script inside `bash -o pipefail -c '...'`, its restart loop left out: what
    runs once, `cd ... && mkdir -p ... && <process> 2>&1 | tee -a <log>`."""
    argv = shlex.split(window.command)
    assert argv[:3] == ["bash", "-o", "pipefail"] and argv[3] == "-c"
    match = _SUPERVISED.fullmatch(argv[4])
    assert match, argv[4]
    return f"{match[1]} && {match[2]}"


def _run_supervised(tmp_path, exit_codes, max_restarts=2, private=True):
    """Runs a window's script around a process that exits with each of `exit_codes` in turn."""
    codes = tmp_path / "codes"
    codes.write_text("".join(f"{code}\n" for code in exit_codes))
    line = f"bash -c {shlex.quote('c=$(head -1 codes); sed -i 1d codes; echo ran; exit $c')}"
    command = tmux.window_command(str(tmp_path), "logs", line, "actor_0", max_restarts, 1, private)
    done = subprocess.run(
        shlex.split(command), capture_output=True, text=True, timeout=60, umask=0o002
    )
    return done.returncode, (tmp_path / "logs" / "actor_0.log").read_text()


@pytest.mark.parametrize("private, folder, log", [(True, 0o700, 0o600), (False, 0o775, 0o664)])
def test_a_windows_run_folder_and_log_are_owner_only_unless_told_not_to(
    tmp_path, private, folder, log
):
    _run_supervised(tmp_path, [0], private=private)
    assert stat.S_IMODE((tmp_path / "logs").stat().st_mode) == folder
    assert stat.S_IMODE((tmp_path / "logs" / "actor_0.log").stat().st_mode) == log


def test_every_window_keeps_the_runs_files_private_unless_told_not_to(tmp_path):
    scripts = [shlex.split(w.command)[4] for plan in _plan(tmp_path) for w in plan.windows]
    assert len(scripts) == 3 and all(s.startswith("umask 077; cd ") for s in scripts)
    workers = workers_csv.read_workers(str(tmp_path / "cluster.csv"), default_workdir="/w")
    plans = run_plan.plan_run(workers, ["--noprivate_run_files"], "cluster", private=False)
    scripts = [shlex.split(w.command)[4] for plan in plans for w in plan.windows]
    assert len(scripts) == 3 and all(s.startswith("cd ") for s in scripts)


def test_a_window_restarts_its_process_when_it_dies_at_most_so_many_times(tmp_path):
    code, log = _run_supervised(tmp_path, [137, 1, 139, 0])
    assert code == 139
    assert log.count("ran") == 3  # the first start and 2 restarts
    assert (
        "[frontend] actor_0 exited with code 137; restarting it in 1 s (restart 1 of at most 2)"
        in log
    )
    assert (
        "[frontend] actor_0 exited with code 1; restarting it in 1 s (restart 2 of at most 2)"
        in log
    )
    assert "[frontend] actor_0 exited with code 139; not restarting it after 2 restarts" in log


@pytest.mark.parametrize("final", run_folder.FINAL_EXIT_CODES)
def test_a_window_does_not_restart_a_process_that_finished_refused_or_was_stopped(tmp_path, final):
    code, log = _run_supervised(tmp_path, [137, final, 1])
    assert code == final
    assert log.count("ran") == 2 and "restart 2" not in log


def test_learner_ranks_are_grouped_by_host_in_first_seen_order(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    assert [w.address for w in run_layout.learner_ranks(workers)] == [
        "n1:8001",
        "n1:8002",
        "n2:8001",
    ]


def test_hosts_sessions_and_windows(tmp_path):
    plans = _plan(tmp_path)
    assert [(p.host, p.session, [w.name for w in p.windows]) for p in plans] == [
        ("n1", "impala_cluster_n1", ["learners", "actor_1"]),
        ("n2", "impala_cluster_n2", ["actor_0"]),
    ]
    assert [p.local for p in plans] == [False, False]
    assert [w.line for w in plans[1].workers] == [3, 4]  # both rows on n2 are checked there
    assert _plan(tmp_path, local_hosts=frozenset({"n1"}))[0].local


def test_exact_actor_command(tmp_path):
    (_, n2) = _plan(tmp_path)
    assert _script(n2.windows[0]) == (
        "cd /w && mkdir -p runs/cluster && env CUDA_VISIBLE_DEVICES= /opt/py -u experiment.py "
        "--job_name=actor --task=0 --learner_hosts=n1:8001,n1:8002,n2:8001 --actor_hosts=n2,n1 "
        "--batch_size=32 --level_name=PongNoFrameskip-v4 --logdir=runs --experiment=cluster "
        "2>&1 | tee -a runs/cluster/actor_0.log"
    )


def test_exact_mpirun_line_one_context_per_learner(tmp_path):
    (n1, _) = _plan(tmp_path)
    learner = (
        "-u experiment.py --job_name=learner --learner_hosts=n1:8001,n1:8002,n2:8001 "
        "--actor_hosts=n2,n1 --batch_size=32 --level_name=PongNoFrameskip-v4 "
        "--logdir=runs --experiment=cluster"
    )
    assert _script(n1.windows[0]) == (
        "cd /w && mkdir -p runs/cluster && "
        "mpirun -H n1:2,n2:1 --bind-to none --map-by slot --mca mpi_yield_when_idle 1 "
        "-x PYTHONUNBUFFERED=1 "
        "--mca plm_rsh_args '-F runs/cluster/ssh_config' --mca plm_rsh_no_tree_spawn 1 "
        f"-np 1 -wdir /w -x CUDA_VISIBLE_DEVICES=0 /w/.venv/bin/python {learner} : "
        f"-np 1 -wdir /w -x CUDA_VISIBLE_DEVICES= /w/.venv/bin/python {learner} : "
        f"-np 1 -wdir /w -x CUDA_VISIBLE_DEVICES=1 /w/.venv/bin/python {learner} "
        "2>&1 | tee -a runs/cluster/learners.log"
    )


def test_ssh_config_for_mpirun_checks_host_keys_unless_told_not_to(tmp_path):
    (n1, _) = _plan(tmp_path)
    ((path, content),) = n1.files
    assert path == "/w/runs/cluster/ssh_config"
    # Every learner host, n1 (where mpirun runs) too; each host once, as its first row says.
    assert content == (
        "Host n1\n  HostName n1\n  Port 22\n  User alice\n  BatchMode yes\n"
        "  StrictHostKeyChecking yes\n  UserKnownHostsFile ~/.ssh/known_hosts\n"
        "Host n2\n  HostName n2\n  Port 2222\n  User bob\n  BatchMode yes\n"
        "  StrictHostKeyChecking yes\n  UserKnownHostsFile ~/.ssh/known_hosts\n"
    )
    (n1, _) = _plan(tmp_path, accept=True)
    assert "StrictHostKeyChecking accept-new" in n1.files[0][1]


def test_a_users_logdir_holds_the_run_folder_on_every_host(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    plans = run_plan.plan_run(workers, [], "cluster", logdir="/data/impala")
    for plan in plans:
        for window in plan.windows:
            assert window.command.count("--logdir=/data/impala --experiment=cluster") == (
                window.command.count("experiment.py")
            )
            assert f"tee -a /data/impala/cluster/{window.name}.log" in window.command
    assert plans[0].files[0][0] == "/data/impala/cluster/ssh_config"
    assert "plm_rsh_args '-F /data/impala/cluster/ssh_config'" in _script(plans[0].windows[0])


def test_every_host_gets_the_run_secret_in_each_run_folder_its_processes_read(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV.replace("actor,n1,,22,alice,,,/w,", "actor,n1,,22,alice,,,/w2,"))
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    n1, n2 = run_plan.plan_run(workers, [], "cluster")
    assert n1.secret_paths == ("/w/runs/cluster/secret", "/w2/runs/cluster/secret")
    assert n2.secret_paths == ("/w/runs/cluster/secret",)
    absolute = run_plan.plan_run(workers, [], "cluster", logdir="/data/impala")
    assert [p.secret_paths for p in absolute] == [("/data/impala/cluster/secret",)] * 2
    # No process is told where it is: each reads its run folder's (--logdir, --experiment).
    assert not any("secret" in w.command for p in (n1, n2) for w in p.windows)
    assert n1.tls_paths == n2.tls_paths == ()  # without --transport_tls


def test_with_transport_tls_every_host_gets_the_runs_bundle_beside_each_secret(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV.replace("actor,n1,,22,alice,,,/w,", "actor,n1,,22,alice,,,/w2,"))
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    n1, n2 = run_plan.plan_run(workers, ["--transport_tls=true"], "cluster", tls=True)
    assert n1.tls_paths == ("/w/runs/cluster/tls.pem", "/w2/runs/cluster/tls.pem")
    assert n2.tls_paths == ("/w/runs/cluster/tls.pem",)
    # Each process finds it beside its secret: no window names it.
    assert not any("tls.pem" in w.command for p in (n1, n2) for w in p.windows)


def test_the_dry_run_says_where_the_tls_bundle_goes_and_makes_none(tmp_path):
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--logdir={tmp_path}",
        "--transport_tls",
        "--dry_run",
    )
    assert completed.returncode == 0, completed.stderr
    run_dir = tmp_path / "local_workers_example"
    assert [line for line in completed.stdout.splitlines() if line.startswith("write ")] == [
        f"write {run_dir}/secret: the run secret (owner-only; not shown)",
        f"write {run_dir}/tls.pem: the run's TLS bundle (owner-only; not shown)",
    ]
    windows = [line for line in completed.stdout.splitlines() if line.startswith("window ")]
    assert len(windows) == 3 and all("--transport_tls=true" in line for line in windows)
    assert not run_dir.exists()


def test_session_names_are_per_run_and_host():
    assert tmux.session_name("my run", "10.0.0.2") == "impala_my_run_10_0_0_2"


def test_learners_on_one_host_need_no_ssh_config_and_talk_through_shared_memory(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text(
        f"{HEADER}\nlearner,n1,8001,22,root,,,/w,\nlearner,n1,8002,22,root,,,/w,\n"
        "actor,n2,,22,root,,,/w,\n"
    )
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    (n1, _) = run_plan.plan_run(workers, [], "one")
    assert n1.files == ()
    assert "plm_rsh_args" not in n1.windows[0].command
    assert "--allow-run-as-root" in n1.windows[0].command  # Open MPI refuses root otherwise
    # No TCP transport, whose listener every rank would open on every interface.
    assert "mpirun -H n1:2 --bind-to none --map-by slot --mca mpi_yield_when_idle 1 " + (
        "--mca btl self,vader -x PYTHONUNBUFFERED=1 "
    ) in _script(n1.windows[0])


ONE_LEARNER = f"""{HEADER}
learner,n1,8001,22,root,,0,/w,/opt/py
actor,n2,,22,root,,,/w,
"""


def test_a_learner_alone_runs_as_its_own_process_without_mpirun(tmp_path):
    """As run_local.py runs one: a world of one needs no Horovod, and mpirun would listen on
    every interface (its out-of-band channel, unauthenticated) for ranks it never starts."""
    path = tmp_path / "one.csv"
    path.write_text(ONE_LEARNER)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    (n1, _) = run_plan.plan_run(workers, ["--batch_size=32"], "one")
    assert [w.name for w in n1.windows] == ["learners"]
    assert _script(n1.windows[0]) == (
        "cd /w && mkdir -p runs/one && env PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0 /opt/py -u "
        "experiment.py --job_name=learner --learner_hosts=n1:8001 --actor_hosts=n2 "
        "--batch_size=32 --logdir=runs --experiment=one 2>&1 | tee -a runs/one/learners.log"
    )
    assert n1.files == ()


def test_the_dry_run_of_the_sandbox_example_starts_no_mpirun(tmp_path):
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--logdir={tmp_path}",
        "--dry_run",
    )
    assert completed.returncode == 0, completed.stderr
    windows = [line for line in completed.stdout.splitlines() if line.startswith("window ")]
    assert windows[0].startswith("window learners: ")
    assert "--job_name=learner " in windows[0]
    assert "mpirun" not in completed.stdout


def test_tmux_window_keeps_its_pane_in_the_same_command_list():
    window = tmux.Window("actor_3", "python x.py")
    assert tmux.tmux_new_window("impala_run", window, first=True) == [
        "new-session",
        "-d",
        "-s",
        "impala_run",
        "-n",
        "actor_3",
        "exec python x.py",  # the pane's process is the window's own, whatever tmux's shell
        ";",
        "set-option",
        "-w",
        "-t",
        "impala_run:actor_3",
        "remain-on-exit",
        "on",
    ]
    # The session keeps which run and host it was started for (names may collapse to one).
    labelled = tmux.tmux_new_window("impala_run", window, first=True, label='["r.n", "h"]')
    assert labelled[-6:] == [";", "set-option", "-t", "impala_run:", "@impala_run", '["r.n", "h"]']
    assert tmux.session_name("r.n", "h") == tmux.session_name("r_n", "h")
    assert tmux.session_label("r.n", "h") != tmux.session_label("r_n", "h")
    assert tmux.label_names(tmux.session_label("r.n", "h")) == "'r.n' (on h)"
    assert tmux.tmux_new_window("impala_run", window, first=False)[:5] == [
        "new-window",
        "-d",
        "-t",
        "impala_run:",
        "-n",
    ]
    # Sessions are matched exactly, never as a prefix of another session's name.
    assert tmux.tmux_kill_session("impala_run") == ["kill-session", "-t", "=impala_run"]
    # Learners are stopped through their window's process, the learner alone or the mpirun of
    # several, which passes SIGUSR1 on to every rank.
    assert tmux.stop_learners_command("impala_run") == (
        'pkill -USR1 -x -P "$(tmux display-message -p -t =impala_run:learners '
        "'#{pane_pid}')\" -- 'mpirun|mpiexec|orterun|prterun|python.*'"
    )


# A learner that saves when told (SIGUSR1), writing after the signal as the real one does.
_SAVING_LEARNER = """\
import signal, sys, time
def stop(signum, frame):
    print("saving", flush=True)
    time.sleep(0.5)
    print("saved", flush=True)
    sys.exit(130)
signal.signal(signal.SIGUSR1, stop)
print("training", flush=True)
while True:
    time.sleep(0.1)
"""


def _tmux(env, args):
    return subprocess.run(["tmux", *args], env=env, capture_output=True, text=True, timeout=30)


def _stop_learners(env, session):
    command = tmux.stop_learners_command(session)
    return subprocess.run(["bash", "-c", command], env=env, timeout=30).returncode


def _window_states(env, session):
    """(window, alive) of each window of `session`."""
    listing = _tmux(env, tmux.tmux_list_windows(session)).stdout
    return [(name, alive) for name, alive, _ in tmux.parse_status(listing)]


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
@pytest.mark.parametrize("under_mpirun", [False, True])
def test_stopping_a_learners_window_signals_its_learner_not_the_windows_tee(
    tmp_path, under_mpirun, shell
):
    """The learner alone, or the mpirun of several, gets SIGUSR1; the window's tee lives on
    and logs what the learner writes while it saves. Whatever shell tmux starts windows with
    (the user's $SHELL; Debian's /bin/sh, dash, runs a command in a child of its own)."""
    (tmp_path / "experiment.py").write_text(_SAVING_LEARNER)
    learner = [sys.executable, "-u", "experiment.py", "--job_name=learner", "--learner_hosts=x:1"]
    if under_mpirun:
        argv = planning.mpirun_command(["localhost"], learner, as_root=os.geteuid() == 0)
    else:
        argv = ["env", "PYTHONUNBUFFERED=1", *learner]
    line = planning.shell_line(argv)
    window = tmux.Window("learners", tmux.window_command(str(tmp_path), "logs", line, "w", 0, 1))
    log = tmp_path / "logs" / "w.log"
    # A tmux server of this test's own, its socket in a short folder (socket paths are short).
    with tempfile.TemporaryDirectory(prefix="tmux") as sockets:
        env = {**os.environ, "TMUX_TMPDIR": sockets, "SHELL": shell}
        env.pop("TMUX", None)
        try:
            _tmux(env, tmux.tmux_new_window("impala_t", window, first=True))
            wait_until(lambda: "training" in read_text(log), 30, lambda: read_text(log))
            assert _stop_learners(env, "impala_t") == 0
            ended = [("learners", False)]
            wait_until(lambda: _window_states(env, "impala_t") == ended, 30, str(log))
            # Its last lines logged, and no word from the window's shell: the learners exited
            # with 130, stopped (any other code would have been reported).
            assert "saving\nsaved\n" in read_text(log), read_text(log)
            assert "[frontend]" not in read_text(log), read_text(log)
            # Nothing left to stop: the caller falls back to Ctrl-C.
            assert _stop_learners(env, "impala_t") == 1
        finally:
            _tmux(env, ["kill-server"])


def test_status_parsing_and_summary_line():
    listing = "learners|0|\nactor_0|1|137\n"
    assert tmux.parse_status(listing) == [("learners", True, ""), ("actor_0", False, "137")]
    screen = "12:00 frames 1k/2M [--] | 900 frames/s\n12:00   step 3 | loss 1.0\n\n"
    assert tmux.summary_line(screen) == "12:00 frames 1k/2M [--] | 900 frames/s"
    assert tmux.summary_line("starting\nconnected\n") == "connected"


def test_a_hostile_hosts_answers_reach_the_terminal_printable():
    # A worker host answers status with whatever it likes: escape sequences that would clear
    # the user's screen, retitle it or move the cursor, backspaces that hide text.
    screen = "12:00 frames 1k/2M \x1b[2J\x1b]0;owned\x07done\x08fake | 900 frames/s\u202e\n"
    line = tmux.summary_line(screen)
    assert line == "12:00 frames 1k/2M ?[2J?]0;owned?done?fake | 900 frames/s?"
    assert line.isprintable()
    listing = "actor_0|1|137\x1b[31m\n"
    assert tmux.parse_status(listing) == [("actor_0", False, "137?[31m")]


# ---- Values from someone else's CSV ------------------------------------------------------------

HOSTILE_WORKDIR = "/srv/my project/it's #1 $(touch /tmp/PWNED) `touch /tmp/PWNED`; &"
HOSTILE_PYTHON = "/opt/py 3/'; touch /tmp/PWNED; '/python"


def _two_host_workers(tmp_path, workdir="/w", python="", key=""):
    path = tmp_path / "cluster.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER.split(","))
        writer.writerow(["learner", "n1", "8001", "22", "alice", key, "", workdir, python])
        writer.writerow(["learner", "n2", "8001", "2222", "bob", key, "", workdir, python])
        writer.writerow(["actor", "n2", "", "2222", "bob", key, "", workdir, python])
    return workers_csv.read_workers(str(path), default_workdir="/w")


def test_paths_with_spaces_quotes_and_shell_characters_are_one_word_in_every_command(tmp_path):
    workers = _two_host_workers(tmp_path, HOSTILE_WORKDIR, HOSTILE_PYTHON)
    n1, n2 = run_plan.plan_run(workers, [], "cluster")
    (learners,) = n1.windows
    words = shlex.split(_script(learners))
    assert words[:2] == ["cd", HOSTILE_WORKDIR]
    assert words.count("-wdir") == 2 and words.count(HOSTILE_PYTHON) == 2
    assert words[words.index("-wdir") + 1] == HOSTILE_WORKDIR
    # mpirun splits plm_rsh_args at spaces: the config's path is relative to the workdir.
    assert words[words.index("plm_rsh_args") + 1] == "-F runs/cluster/ssh_config"
    assert n1.files[0][0] == f"{HOSTILE_WORKDIR}/runs/cluster/ssh_config"
    (actor,) = n2.windows
    words = shlex.split(_script(actor))
    assert words[:2] == ["cd", HOSTILE_WORKDIR] and HOSTILE_PYTHON in words


def test_learners_on_several_hosts_need_a_run_folder_path_without_spaces(tmp_path):
    workers = _two_host_workers(tmp_path)
    with pytest.raises(ValueError, match=r"--logdir='/data/my runs' .* without spaces"):
        run_plan.plan_run(workers, [], "cluster", logdir="/data/my runs")


def _ssh_reads(config, tmp_path, host):
    """What ssh itself reads from `config` for `host` (`ssh -G`: no connection)."""
    path = tmp_path / "ssh_config"
    path.write_text(config)
    out = subprocess.run(
        ["ssh", "-G", "-F", str(path), host], capture_output=True, text=True, check=True
    ).stdout
    read = {}
    for line in out.splitlines():
        keyword, _, value = line.partition(" ")
        read.setdefault(keyword, value)
    return read


def test_ssh_reads_the_paths_in_mpiruns_config_back_intact(tmp_path):
    key = tmp_path / "my key's #1 =x"
    key.write_text("not really a key")
    workers = _two_host_workers(tmp_path, key=str(key))
    (n1, _) = run_plan.plan_run(workers, [], "cluster", known_hosts="~/my known hosts")
    for host, user, port in (("n1", "alice", "22"), ("n2", "bob", "2222")):
        read = _ssh_reads(n1.files[0][1], tmp_path, host)
        assert (read["hostname"], read["user"], read["port"]) == (host, user, port)
        assert read["identityfile"] == str(key)
        assert read["userknownhostsfile"] == os.path.expanduser("~/my known hosts")
        assert "proxycommand" not in read and "localcommand" not in read


def test_ssh_config_doubles_percent_signs(tmp_path):
    key = tmp_path / "100%d"
    key.write_text("not really a key")
    (n1, _) = run_plan.plan_run(_two_host_workers(tmp_path, key=str(key)), [], "cluster")
    assert f"  IdentityFile {tmp_path}/100%%d\n" in n1.files[0][1]


@pytest.mark.parametrize(
    "field,value",
    [
        ("host", "-oProxyCommand=touch /tmp/PWNED"),
        ("host", "n1\nProxyCommand touch /tmp/PWNED"),
        ("ssh_user", "alice\nProxyCommand touch /tmp/PWNED"),
        ("ssh_user", "alice ProxyCommand=x"),
        ("ssh_key", "/k\nProxyCommand touch /tmp/PWNED"),
        ("ssh_key", "/k/${HOME}"),
        ("ssh_key", '/k" ProxyCommand "x'),
    ],
)
def test_ssh_config_refuses_what_it_cannot_hold(tmp_path, field, value):
    # Rows that did not come through the CSV's checks: the config still holds only safe values.
    (worker, *_) = _two_host_workers(tmp_path)
    with pytest.raises(ValueError, match=rf"{field}={re.escape(repr(value))}: "):
        learner_plan.ssh_config([dataclasses.replace(worker, **{field: value})], False, "~/kh")


@pytest.mark.parametrize("known_hosts", ["/kh\nProxyCommand touch /tmp/PWNED", "/kh/$HOME"])
def test_ssh_config_refuses_a_known_hosts_path_it_cannot_hold(tmp_path, known_hosts):
    workers = _two_host_workers(tmp_path)
    with pytest.raises(ValueError, match=r"--known_hosts=.*: cannot go into mpirun's ssh config"):
        run_plan.plan_run(workers, [], "cluster", known_hosts=known_hosts)


def test_tmux_never_gets_a_window_command_ending_in_a_semicolon():
    # tmux reads an argument ending in ';' as the end of its command and runs the rest as tmux
    # commands.
    with pytest.raises(ValueError, match="may not end with ';'"):
        tmux.tmux_new_window("impala_run", tmux.Window("actor_0", "true;"), first=True)


def test_a_dry_run_refuses_a_bad_job_flag_in_one_line(tmp_path):
    # Without the ML stack, as on a laptop driving the run: the check is the frontend's own.
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--logdir={tmp_path}",
        "--keep_checkpoints=0",
        "--dry_run",
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stderr.splitlines() == [
        "run_experiment_mm_raw.py: error: --keep_checkpoints=0: must be at least 1"
    ]
    assert completed.stdout == ""


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--max_actor_restarts=100000000000000000000", "must be in 0-1000000"),
        ("--max_learner_restarts=-1", "must be in 0-1000000"),
        ("--restart_max_delay_secs=100000", "must be in 1-86400 (a day)"),
    ],
)
def test_restart_flags_fit_the_windows_shell_arithmetic(tmp_path, flag, message):
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--logdir={tmp_path}",
        flag,
        "--dry_run",
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stderr.splitlines() == [f"run_experiment_mm_raw.py: error: {flag}: {message}"]


def test_a_bad_job_flag_does_not_keep_a_run_from_being_looked_at_or_stopped(tmp_path):
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--logdir={tmp_path}",
        "--keep_checkpoints=0",
        "--experiment=never_started_here",
        "--action=status",
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "not started" in completed.stdout


# ---- --docker_image: every process in a container ---------------------------------------------

ONE_LEARNER_HOST = f"""{HEADER}
learner,n1,8001,22,alice,,0,/w,
actor,n2,,2222,bob,,,/srv/w,
learner,n1,8002,22,alice,,,/w,
"""


def _container_plan(tmp_path, runtime=("podman", "--runtime", "runc")):
    path = tmp_path / "cluster.csv"
    path.write_text(ONE_LEARNER_HOST)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    return run_plan.plan_run(
        workers,
        ["--batch_size=32"],
        "cluster",
        containers=Containers("registry.example/impala:1.0", runtime),
    )


def _container_argv(window, runtime="podman --runtime runc", image="registry.example/impala:1.0"):
    """(the container runtime's argv up to the image, what runs in the container) of a window
    of a containers plan; checks the leftover container of that name is removed first."""
    remove, run = _script(window).split(" && ", 2)[2].split("; ", 1)
    name = f"impala_cluster_{'n1' if window.name == 'learners' else 'n2'}-{window.name}"
    assert remove == f"{runtime} rm -f {name} >/dev/null 2>&1"
    argv = shlex.split(run.rsplit(" 2>&1 | tee -a ", 1)[0])
    image = argv.index(image)
    return argv[:image], argv[image + 1 :]


def test_with_an_image_each_actor_runs_in_a_container_with_its_run_folder_at_its_own_path(
    tmp_path,
):
    (_, n2) = _container_plan(tmp_path)
    outside, inside = _container_argv(n2.windows[0])
    assert outside == [
        *("podman", "--runtime", "runc", "run", "--rm", "--init"),
        *("--name", "impala_cluster_n2-actor_0", "--label", "impala.run=impala_cluster_n2"),
        "--network=host",
        *("--cap-drop=ALL", "--security-opt=no-new-privileges"),
        *("--user", "$(id -u):$(id -g)"),  # expanded by the window's shell, on the host
        *("-v", "/srv/w/runs/cluster:/srv/w/runs/cluster"),
        *("-e", "PYTHONUNBUFFERED=1", "-e", "CUDA_VISIBLE_DEVICES="),
    ]
    assert inside == [
        *("/opt/impala/.venv/bin/python", "-u", "experiment.py", "--job_name=actor", "--task=0"),
        *("--learner_hosts=n1:8001,n1:8002", "--actor_hosts=n2", "--batch_size=32"),
        *("--logdir=/srv/w/runs", "--experiment=cluster"),
    ]
    # The window still logs on the host, in the CSV's workdir, and the secret goes there.
    assert _script(n2.windows[0]).startswith("cd /srv/w && mkdir -p runs/cluster && ")
    assert n2.secret_paths == ("/srv/w/runs/cluster/secret",)


def test_with_an_image_the_learners_mpirun_runs_every_rank_in_one_container(tmp_path):
    (n1, _) = _container_plan(tmp_path)
    outside, inside = _container_argv(n1.windows[0])
    assert outside[outside.index("-v") :] == [
        *("-v", "/w/runs/cluster:/w/runs/cluster"),  # one folder: both learners' workdir is /w
        *("-e", "OMPI_ALLOW_RUN_AS_ROOT=1", "-e", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"),
        *("--gpus", "all"),  # the first learner was given GPU 0
    ]
    learner = [
        *("/opt/impala/.venv/bin/python", "-u", "experiment.py", "--job_name=learner"),
        *("--learner_hosts=n1:8001,n1:8002", "--actor_hosts=n2", "--batch_size=32"),
        *("--logdir=/w/runs", "--experiment=cluster"),
    ]
    assert inside == [
        *("mpirun", "-H", "localhost:2", "--bind-to", "none", "--map-by", "slot"),
        *("--mca", "mpi_yield_when_idle", "1", "--mca", "btl", "self,vader"),
        *("-x", "PYTHONUNBUFFERED=1"),
        *("-np", "1", "-wdir", "/opt/impala", "-x", "CUDA_VISIBLE_DEVICES=0", *learner, ":"),
        *("-np", "1", "-wdir", "/opt/impala", "-x", "CUDA_VISIBLE_DEVICES=", *learner),
    ]


def test_with_an_image_a_learner_alone_runs_in_its_container_without_mpirun(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(ONE_LEARNER)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    containers = Containers("registry.example/impala:1.0", ("docker",))
    (n1, _) = run_plan.plan_run(workers, ["--batch_size=32"], "cluster", containers=containers)
    assert [w.name for w in n1.windows] == ["learners"] and n1.key_files == ()
    outside, inside = _container_argv(n1.windows[0], runtime="docker")
    assert outside[outside.index("-v") :] == [
        *("-v", "/w/runs/cluster:/w/runs/cluster"),
        *("-e", "PYTHONUNBUFFERED=1", "-e", "CUDA_VISIBLE_DEVICES=0"),
        *("--gpus", "all"),
    ]
    assert inside == [
        *("/opt/impala/.venv/bin/python", "-u", "experiment.py", "--job_name=learner"),
        *("--learner_hosts=n1:8001", "--actor_hosts=n2", "--batch_size=32"),
        *("--logdir=/w/runs", "--experiment=cluster"),
    ]


def test_with_an_image_learners_on_other_hosts_start_through_an_sshd_container_there(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)  # learners: two on n1 (workdir /w), one on n2 (workdir /w)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    containers = Containers("impala", ("docker",), sshd_port=2200)
    n1, n2 = run_plan.plan_run(workers, [], "cluster", containers=containers)
    # n2's sshd starts first (its plan first, its window first): mpirun on n1 then waits for it.
    assert (n1.host, n2.host) == ("n2", "n1")
    n1, n2 = n2, n1
    assert [w.name for w in n2.windows] == ["sshd", "actor_0"]
    outside, inside = _container_argv(n2.windows[0], runtime="docker", image="impala")
    assert "-v" in outside and "/w/runs/cluster:/w/runs/cluster" in outside
    # sshd as root chroots and switches users; nothing else is kept.
    caps = outside[outside.index("--cap-drop=ALL") :][:5]
    assert caps == [
        "--cap-drop=ALL",
        *("--cap-add=SYS_CHROOT", "--cap-add=SETGID", "--cap-add=SETUID"),
        "--security-opt=no-new-privileges",
    ]
    assert inside == ["sshd", "2200", "/w/runs/cluster/mpi_ssh"]
    assert n2.key_files == (
        ("/w/runs/cluster/mpi_ssh/host_key", "host_key"),
        ("/w/runs/cluster/mpi_ssh/authorized_keys", "authorized_keys"),
    )
    assert n1.key_files == (
        ("/w/runs/cluster/mpi_ssh/id_ed25519", "id_ed25519"),
        ("/w/runs/cluster/mpi_ssh/known_hosts", "known_hosts"),
    )
    script = _script(n1.windows[0])
    wait, run = script.split("; docker rm -f ", 1)
    assert wait.endswith(
        'for target in n2/2200; do for second in $(seq 120); do (exec 3<>"/dev/tcp/$target") '
        "2>/dev/null && break; sleep 1; done; done"
    )
    argv = shlex.split(run.split(" impala ", 1)[1].rsplit(" 2>&1 | tee -a ", 1)[0])
    assert argv[:19] == [
        *("mpirun", "-H", "localhost:2,n2:1", "--bind-to", "none", "--map-by", "slot"),
        *("--mca", "mpi_yield_when_idle", "1"),
        *("-x", "PYTHONUNBUFFERED=1", "--mca", "plm_rsh_args"),
        "-p 2200 -i /w/runs/cluster/mpi_ssh/id_ed25519 -o UserKnownHostsFile="
        "/w/runs/cluster/mpi_ssh/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes "
        "-o IdentitiesOnly=yes",
        *("--mca", "plm_rsh_no_tree_spawn", "1", "-np"),
    ]
    assert not n1.files  # no ssh_config for a bare mpirun


def test_the_run_ssh_keys_go_where_the_plan_says_with_a_known_hosts_line_per_sshd(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    containers = Containers("impala", ("docker",), sshd_port=2200)
    plans = run_plan.plan_run(workers, [], "cluster", containers=containers)
    keys = run_control.run_ssh_keys(str(tmp_path / "keys"))
    assert keys == run_control.run_ssh_keys(str(tmp_path / "keys"))  # made once, then the same
    assert stat.S_IMODE(os.stat(tmp_path / "keys" / "client").st_mode) == 0o600
    contents = run_control._key_contents(plans, keys)
    assert contents["known_hosts"] == f"[n2]:2200 {' '.join(keys.host_public.split()[:2])}\n"
    assert contents["authorized_keys"] == f"restrict {keys.client_public}"
    assert "PRIVATE KEY" in contents["id_ed25519"] and "PRIVATE KEY" in contents["host_key"]


@pytest.mark.parametrize(
    "image, runtime",
    [
        ("impala;touch x", ("docker",)),
        ("-v/:/host", ("docker",)),
        ("impala horovod", ("docker",)),
        ("", ("docker",)),
        ("impala", ()),
        ("impala", ("--privileged",)),
        ("impala", ("docker", "$(touch x)")),
        ("impala", ("docker", "a b")),
    ],
)
def test_an_image_or_runtime_that_would_not_be_one_word_is_refused(image, runtime):
    with pytest.raises(ValueError, match=r"--docker_image|--container_runtime"):
        Containers(image, runtime)


def test_stopping_a_containers_run_signals_its_learners_and_removes_its_containers():
    containers = Containers("impala", ("docker",))
    assert containers.signal_command("impala_r_n1", "learners", "USR1") == (
        "docker kill --signal USR1 impala_r_n1-learners"
    )
    assert containers.remove_command("impala_r_n1") == (
        "docker ps -aq --filter label=impala.run=impala_r_n1 | xargs -r docker rm -f >/dev/null"
    )


def test_the_dry_run_shows_the_container_commands(tmp_path):
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        "--workers_csv_path=sandbox/local_workers_example.csv",
        f"--logdir={tmp_path}",
        "--docker_image=impala-horovod",
        "--container_runtime=podman --runtime runc",
        "--dry_run",
    )
    assert completed.returncode == 0, completed.stderr
    assert "containers of impala-horovod" in completed.stdout
    windows = [line for line in completed.stdout.splitlines() if line.startswith("window ")]
    assert len(windows) == 3
    assert all("podman --runtime runc run --rm --init" in line for line in windows)
    assert not (tmp_path / "local_workers_example").exists()  # a dry run writes nothing


@pytest.mark.parametrize("port", [0, -1, 65536])
def test_a_container_sshd_port_out_of_range_is_refused(port):
    with pytest.raises(ValueError, match=rf"^--container_sshd_port={port}: not a port in 1-65535"):
        Containers("impala", ("docker",), sshd_port=port)


# ---- Several policies (--num_policies) ---------------------------------------------------------

POLICIES_CSV = f"""{HEADER}
learner,n1,8001,22,alice,,,/w,
learner,n2,8001,22,alice,,,/w,
learner,n1,8002,22,alice,,,/w,
learner,n2,8002,22,alice,,,/w,
actor,n1,,22,alice,,,/w,
actor,n2,,22,alice,,,/w,
actor,n1,,22,alice,,,/w,
"""


def _policies_plan(tmp_path, text=POLICIES_CSV, num_policies=2, **kwargs):
    path = tmp_path / "policies.csv"
    path.write_text(text)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    flags = ["--batch_size=32", f"--num_policies={num_policies}"]
    return run_plan.plan_run(
        workers, flags, "pop", num_policies=num_policies, source=str(path), **kwargs
    )


def _windows_by_name(plans):
    return {(p.host, w.name): w for p in plans for w in p.windows}


def test_without_a_policy_column_learners_split_in_rank_order_and_actors_take_turns(tmp_path):
    plans = _policies_plan(tmp_path)
    assert [(p.host, [w.name for w in p.windows]) for p in plans] == [
        # Ranks n1:8001, n1:8002 | n2:8001, n2:8002: policy 0's mpirun on n1, policy 1's on n2.
        ("n1", ["policy_0_learners", "policy_0_actor_0", "policy_0_actor_1"]),
        ("n2", ["policy_1_learners", "policy_1_actor_0"]),
    ]
    windows = _windows_by_name(plans)
    # Policy 1: its own learners, actors and folder; its learners know both policies' rank 0,
    # and every learner of the run (whose replays share each host's memory).
    learner = (
        "-u experiment.py --job_name=learner --learner_hosts=n2:8001,n2:8002 --actor_hosts=n2 "
        "--batch_size=32 --num_policies=2 --logdir=runs --experiment=pop --policy=1 "
        "--policy_hosts=n1:8001,n2:8001 --run_learner_hosts=n1:8001,n1:8002,n2:8001,n2:8002"
    )
    assert _script(windows["n2", "policy_1_learners"]) == (
        "cd /w && mkdir -p runs/pop/policy_1 && "
        "mpirun -H n2:2 --bind-to none --map-by slot --mca mpi_yield_when_idle 1 "
        "--mca btl self,vader -x PYTHONUNBUFFERED=1 "
        f"-np 1 -wdir /w -x CUDA_VISIBLE_DEVICES= /w/.venv/bin/python {learner} : "
        f"-np 1 -wdir /w -x CUDA_VISIBLE_DEVICES= /w/.venv/bin/python {learner} "
        "2>&1 | tee -a runs/pop/policy_1/learners.log"
    )
    # Actor 2 of the CSV is policy 0's second: --task=1, its log named as in a run of one.
    assert _script(windows["n1", "policy_0_actor_1"]) == (
        "cd /w && mkdir -p runs/pop/policy_0 && env CUDA_VISIBLE_DEVICES= "
        "/w/.venv/bin/python -u experiment.py --job_name=actor --task=1 "
        "--learner_hosts=n1:8001,n1:8002 --actor_hosts=n1,n1 --batch_size=32 --num_policies=2 "
        "--logdir=runs --experiment=pop --policy=0 2>&1 | tee -a runs/pop/policy_0/actor_1.log"
    )
    # One run secret for every policy, in the run folder.
    assert [p.secret_paths for p in plans] == [("/w/runs/pop/secret",)] * 2


def test_a_policy_column_places_each_row_and_odd_counts_split_as_evenly_as_they_can(tmp_path):
    text = POLICIES_CSV.replace(HEADER, f"{HEADER},policy")
    rows = text.splitlines()
    # Learner rows 0,1,0,1 as written; actors 1,1,0.
    policies = ["0", "1", "0", "1", "1", "1", "0"]
    text = (
        "\n".join([rows[0], *(f"{r},{p}" for r, p in zip(rows[1:], policies, strict=True))]) + "\n"
    )
    plans = _policies_plan(tmp_path, text)
    windows = _windows_by_name(plans)
    assert set(windows) == {
        ("n1", "policy_0_learners"),
        ("n1", "policy_0_actor_0"),
        ("n2", "policy_1_learners"),
        ("n1", "policy_1_actor_0"),
        ("n2", "policy_1_actor_1"),
    }
    assert "--learner_hosts=n2:8001,n2:8002 --actor_hosts=n1,n2 " in (
        windows["n2", "policy_1_actor_1"].command
    )
    # No column, 3 learners for 2 policies: blocks of 2 and 1 in rank order.
    three = "\n".join(POLICIES_CSV.splitlines()[:4] + POLICIES_CSV.splitlines()[5:]) + "\n"
    windows = _windows_by_name(_policies_plan(tmp_path, three))
    assert "mpirun -H n1:2 " in windows["n1", "policy_0_learners"].command
    assert "--learner_hosts=n2:8001 --actor_hosts=n2 " in windows["n2", "policy_1_actor_0"].command
    # The column, empty in every row: as without it.
    empty = _policies_plan(tmp_path, POLICIES_CSV.replace(HEADER, f"{HEADER},policy"))
    assert _windows_by_name(empty) == _windows_by_name(_policies_plan(tmp_path))


@pytest.mark.parametrize(
    ("policies", "num_policies", "message"),
    [
        ("0,1,0,1,1,1,2", 2, r"policies\.csv:8: policy=2: out of range for --num_policies=2"),
        ("0,0,0,0,0,1,1", 2, r"policies\.csv: no learner row names policy=1; every one of"),
        ("0,1,0,1,1,1,1", 2, r"policies\.csv: no actor row names policy=0; every one of"),
        ("0,1,0,1,0,2,1", 3, r"policies\.csv: no learner row names policy=2"),
        ("0,1,0,1,1,1,x", 2, r"policies\.csv:8: policy='x': must be a policy number"),
        ("0,1,0,1,1,1,", 2, r"policies\.csv:8: policy='': names no policy, but line 2 names"),
        ("0,1,0,1,1,1,1", 1, r"policies\.csv:3: policy=1: out of range for --num_policies=1"),
    ],
)
def test_a_policy_column_that_leaves_a_policy_out_or_names_none_is_one_line(
    tmp_path, policies, num_policies, message
):
    rows = POLICIES_CSV.splitlines()
    text = f"{rows[0]},policy\n" + "".join(
        f"{row},{p}\n" for row, p in zip(rows[1:], policies.split(","), strict=True)
    )
    with pytest.raises(ValueError, match=message):
        _policies_plan(tmp_path, text, num_policies)


def test_more_policies_than_learner_or_actor_rows_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"policies\.csv: 3 actor row\(s\) for --num_policies=4"):
        _policies_plan(tmp_path, num_policies=4)
    with pytest.raises(ValueError, match=r"policies\.csv: 4 learner row\(s\) for --num_policies=5"):
        _policies_plan(tmp_path, num_policies=5)


def test_several_policies_in_containers_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"--docker_image with --num_policies=2: several"):
        _policies_plan(tmp_path, containers=Containers("impala", ("docker",)))


def test_each_policys_learners_window_is_stopped_through_its_own_mpirun():
    assert tmux.is_learners_window("learners") and tmux.is_learners_window("policy_12_learners")
    for name in ("actor_0", "policy_1_actor_0", "policy_x_learners", "learners_0", "sshd"):
        assert not tmux.is_learners_window(name), name
    assert "-t =impala_pop_n1:policy_1_learners " in tmux.stop_learners_command(
        "impala_pop_n1", "policy_1_learners"
    )


def test_a_dry_run_of_several_policies_shows_each_policys_windows(tmp_path):
    path = tmp_path / "local.csv"
    path.write_text(
        "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices\n"
        "learner,localhost,8001,22,,,\nlearner,localhost,8002,22,,,\n"
        "actor,localhost,,22,,,\nactor,localhost,,22,,,\n"
    )
    completed = run_without_ml_stack(
        "run_experiment_mm_raw.py",
        f"--workers_csv_path={path}",
        f"--logdir={tmp_path}",
        "--num_policies=2",
        "--with_pbt",
        "--dry_run",
    )
    assert completed.returncode == 0, completed.stderr
    windows = [line.split(":")[0] for line in completed.stdout.splitlines() if "window " in line]
    assert windows == [
        "window policy_0_learners",
        "window policy_0_actor_0",
        "window policy_1_learners",
        "window policy_1_actor_0",
    ]
    assert completed.stdout.count("--policy_hosts=localhost:8001,localhost:8002") == 2


def test_synchronous_collection_needs_each_learners_actors_to_fill_its_batch(tmp_path):
    """--col_workers_communication=synchronous: with 4 learner rows and 3 actor rows (CSV of
    one policy), the last learner has no actor; in two policies, each learner pair has one
    actor or two, and actor i of a policy plays for its learner i mod 2."""
    with pytest.raises(ValueError, match=r"a learner with 0 actor\(s\) of --num_envs_per_actor"):
        _policies_plan(tmp_path, num_policies=1, synchronous_round=(8, 16))
    # Two policies: policy 0 has actors 0 and 2 (one per learner), policy 1 actor 1 (its second
    # learner none).
    with pytest.raises(ValueError, match=r"a learner with 0 actor"):
        _policies_plan(tmp_path, synchronous_round=(8, 16))
    three = POLICIES_CSV + "actor,n2,,22,alice,,,/w,\n"
    assert _policies_plan(tmp_path, three, synchronous_round=(16, 16))
    with pytest.raises(ValueError, match=r"^--batch_size=32: in synchronous collection a learner"):
        _policies_plan(tmp_path, three, synchronous_round=(32, 16))


# A host answers the session's label with anything: deep nesting, a huge name, escapes.
@pytest.mark.parametrize(
    "answer",
    ["[" * 100_000, '["' + "r" * 10**6 + '", "h"]', '{"a": 1}', "x" * 1000, '["a", "\x1b[2J"]'],
)
def test_a_sessions_label_from_a_host_is_named_printably_whatever_it_holds(answer):
    named = tmux.label_names(answer)
    assert named.isprintable() and len(named) < 250
