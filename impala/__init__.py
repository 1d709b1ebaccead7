"""IMPALA with Horovod learners: the system behind the entry points at the repository's root.

Sub-packages by role; each imports only the stack its role needs:

  envs/       environments behind one vector interface (Atari, Gymnasium, test games)
  actor/      the behaviour policy stepping environments into unrolls, and the actor process
  learner/    the loss, the optimisation step, checkpoints, the all-reduce and the learner process
  transport/  unrolls to learners and weights to actors over gRPC (grpcio), behind the run secret
  launch/     the workers CSV, command plans, tmux and SSH hosts, the run on this host

and shared modules: flags and configs (no TensorFlow), trajectory types, run folders, progress;
and curves/, the learning curves `plot.py` and the benchmarks read, analyse and draw.
"""
