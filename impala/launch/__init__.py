"""Starting runs: the workers CSV, the command plans, tmux and SSH hosts, the run on this host.

  planning.py      every process's command line (both launchers)
  single_host.py   run_local.py: the run on this machine (ports.py, supervisor.py)
  workers_csv.py   the multi-host frontend's CSV, checked
  run_plan.py      its plan: each host's tmux session and windows (run_layout.py, learner_plan.py,
                   containers.py, tmux.py)
  hosts.py         reaching hosts (libtmux here, paramiko over SSH)
  run_control.py   carrying a plan out: start, status, stop

TensorFlow-free: the frontend and run_local.py need only this package, absl, paramiko and libtmux.
"""
