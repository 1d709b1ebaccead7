"""Train on this machine through the real distributed path: learner and actor processes, the
learners of a policy under one mpirun when several (their ranks talk through shared memory).

  python run_local.py                                  # 1 learner, 2 actors, Pong (make train)
  python run_local.py --num_learners=2 --num_actors=4 --level_name=BreakoutNoFrameskip-v4
  python run_local.py --experiment=PongNoFrameskip-v4-20261122-101500   # resume that run

Every experiment.py flag given here is passed to every process; `python run_local.py --helpfull`
lists them. The implementation is `impala/launch/single_host.py`; this launcher imports no
TensorFlow.
"""

from absl import app

from impala.launch import single_host

if __name__ == "__main__":
    app.run(single_host.main)
