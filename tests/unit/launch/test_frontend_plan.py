"""The CSV frontend's plan: which host runs what, with the exact command lines."""

import shlex

from impala.launch import planning, tmux, workers_csv

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
    return planning.plan_run(
        workers,
        ["--batch_size=32", "--level_name=PongNoFrameskip-v4"],
        "cluster",
        local_hosts=local_hosts,
        accept_unknown_host_keys=accept,
    )


def _script(window):
    """The shell script inside `bash -o pipefail -c '...'`."""
    argv = shlex.split(window.command)
    assert argv[:3] == ["bash", "-o", "pipefail"] and argv[3] == "-c"
    return argv[4]


def test_learner_ranks_are_grouped_by_host_in_first_seen_order(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text(CSV)
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    assert [w.address for w in planning.learner_ranks(workers)] == [
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
        "mpirun -H n1:2,n2:1 --bind-to none --map-by slot -x PYTHONUNBUFFERED=1 "
        "--mca plm_rsh_args '-F /w/runs/cluster/ssh_config' --mca plm_rsh_no_tree_spawn 1 "
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
    plans = planning.plan_run(workers, [], "cluster", logdir="/data/impala")
    for plan in plans:
        for window in plan.windows:
            assert window.command.count("--logdir=/data/impala --experiment=cluster") == (
                window.command.count("experiment.py")
            )
            assert f"tee -a /data/impala/cluster/{window.name}.log" in window.command
    assert plans[0].files[0][0] == "/data/impala/cluster/ssh_config"


def test_session_names_are_per_run_and_host():
    assert planning.session_name("my run", "10.0.0.2") == "impala_my_run_10_0_0_2"


def test_learners_on_one_host_need_no_ssh_config(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text(f"{HEADER}\nlearner,n1,8001,22,root,,,/w,\nactor,n2,,22,root,,,/w,\n")
    workers = workers_csv.read_workers(str(path), default_workdir="/w")
    (n1, _) = planning.plan_run(workers, [], "one")
    assert n1.files == ()
    assert "plm_rsh_args" not in n1.windows[0].command
    assert "--allow-run-as-root" in n1.windows[0].command  # Open MPI refuses root otherwise


def test_tmux_window_keeps_its_pane_in_the_same_command_list():
    window = planning.Window("actor_3", "python x.py")
    assert tmux.tmux_new_window("impala_run", window, first=True) == [
        "new-session",
        "-d",
        "-s",
        "impala_run",
        "-n",
        "actor_3",
        "python x.py",
        ";",
        "set-option",
        "-w",
        "-t",
        "impala_run:actor_3",
        "remain-on-exit",
        "on",
    ]
    assert tmux.tmux_new_window("impala_run", window, first=False)[:5] == [
        "new-window",
        "-d",
        "-t",
        "impala_run:",
        "-n",
    ]
    # Sessions are matched exactly, never as a prefix of another session's name.
    assert tmux.tmux_kill_session("impala_run") == ["kill-session", "-t", "=impala_run"]
    # Learners are stopped through their mpirun, which passes SIGUSR1 on to every rank.
    assert tmux.stop_learners_command("impala_run") == (
        'pkill -USR1 -x mpirun -P "$(tmux display-message -p -t =impala_run:learners '
        "'#{pane_pid}')\""
    )


def test_status_parsing_and_summary_line():
    listing = "learners|0|\nactor_0|1|137\n"
    assert tmux.parse_status(listing) == [("learners", True, ""), ("actor_0", False, "137")]
    screen = "12:00 frames 1k/2M [--] | 900 frames/s\n12:00   step 3 | loss 1.0\n\n"
    assert tmux.summary_line(screen) == "12:00 frames 1k/2M [--] | 900 frames/s"
    assert tmux.summary_line("starting\nconnected\n") == "connected"
