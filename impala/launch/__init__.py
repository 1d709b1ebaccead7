"""Starting runs: the workers CSV, the command plans, tmux and SSH hosts, the run on this host.

TensorFlow-free: the frontend and run_local.py need only this package, absl, paramiko and libtmux.
"""
