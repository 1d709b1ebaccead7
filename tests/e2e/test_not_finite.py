"""A real learner process fed, through its transport, a batch within the transport's bounds on
which its train step is not finite: the issue's attack, made by a caller holding the run secret.
The learner skips and counts the step, trains on, and checkpoints only finite weights."""

import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from impala import build, envs, run_secret, transport
from impala.actor.actor import Actor
from impala.launch.ports import free_ports
from impala.learner import checkpoints
from impala.trajectory import MAX_ABS_POLICY_LOGIT
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

COUNTER = envs.COUNTER_LEVEL
UNROLL_LENGTH, BATCH_SIZE = 5, 4


def _hostile(unroll):
    """`unroll` as a caller with the secret could make it: behaviour logits at the transport's
    bound, -bound on each action taken and +bound on another. Finite, in range, in bounds: and
    PPO's pi / mu for it is exp(2000), which float32 cannot hold."""
    steps = unroll.steps
    logits = np.full(steps.policy_logits.shape, -MAX_ABS_POLICY_LOGIT, np.float32)
    other = (steps.action + 1) % logits.shape[-1]
    np.put_along_axis(logits, other[..., None], np.float32(MAX_ABS_POLICY_LOGIT), axis=-1)
    return unroll._replace(steps=steps._replace(policy_logits=logits))


def test_a_learner_skips_counts_and_survives_a_batch_whose_step_is_not_finite(processes, tmp_path):
    (port,) = free_ports(1)
    run_dir = tmp_path / "run"
    learner = processes.experiment(
        "learner",
        "--job_name=learner",
        f"--learner_hosts=localhost:{port}",
        f"--level_name={COUNTER}",
        "--agent_name=MLPAgent",
        f"--unroll_length={UNROLL_LENGTH}",
        f"--batch_size={BATCH_SIZE}",
        "--total_environment_frames=1e9",
        # Every trajectory fresh: the hostile batch is trained on in its 6 passes only, where a
        # replay would sample its trajectories again at random.
        "--replay_parameters=",
        f"--logdir={tmp_path}",
        "--experiment=run",
    )
    # A caller with the run secret, acting with the learner's weights as an actor does: one
    # unroll of BATCH_SIZE environments is one batch.
    with build.environment(COUNTER, BATCH_SIZE, 0) as env:
        agent = build.agent("MLPAgent", env)
        spec, identity = transport.describe(env, agent, UNROLL_LENGTH, COUNTER, 1)
        actor = Actor(env, agent, UNROLL_LENGTH, seed=0)
        client = transport.ActorClient(
            f"localhost:{port}",
            0,
            spec,
            identity,
            list(agent.variables),
            connect_timeout_secs=120,
            secret=run_secret.load(processes.secret_file),
        )
        try:
            # The learner serves before it publishes its first weights: ask until it has.
            fetched = []
            wait_until(
                lambda: fetched.append(client.fetch_weights()) or fetched[-1] is not None,
                60,
                lambda: processes.log(learner),
            )
            actor.set_weights(*fetched[-1])
            client.send(_hostile(actor.unroll()))
            wait_until(
                lambda: "skipped an optimisation step" in processes.log(learner),
                120,
                lambda: processes.log(learner),
            )
            for _ in range(2):  # sound batches: trained on as ever
                client.send(actor.unroll())
            wait_until(lambda: client.learner_version() == 3, 60, lambda: processes.log(learner))
            assert client.refused_chunks == 0  # the transport let it in: it is within bounds
        finally:
            client.close()
    learner.send_signal(signal.SIGTERM)
    assert processes.wait(learner, 60) == 130, processes.log(learner)

    log = processes.log(learner)
    assert "step 1 skipped an optimisation step: its loss or gradients were not finite" in log
    # Six passes over a batch of fresh trajectories: all six of the hostile batch's skipped.
    assert "(6 steps skipped: not finite)" in log
    summary = json.loads((run_dir / "learner_0.json").read_text())
    assert (summary["steps"], summary["skipped_steps"]) == (3, 6)
    # The checkpoint of the stop holds finite weights and optimizer state.
    (path,), _ = checkpoints.listed(str(run_dir / "checkpoints"))
    reader = tf.train.load_checkpoint(path)
    floats = [
        name for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating
    ]
    assert len(floats) > 10
    for name in floats:
        assert np.isfinite(reader.get_tensor(name)).all(), name
    assert os.path.basename(path) == f"ckpt-{summary['weights_version']}"
