"""One Horovod rank of `benchmarks.scaling`, started by its mpirun inside a network namespace.

    python -m benchmarks.scaling_rank WARMUP REPEATS COMPRESSIONS TRAIN_BATCHES
        TRAIN_COMPRESSIONS TAG

Each rank builds the network the learner trains (`start.build_agent` on the default
`LearnerJobConfig`: Pong, the default agent) and all-reduces float32 tensors of exactly its
trainable variables' shapes, one `hvd.allreduce` (op Average) per tensor inside one
`tf.function`, as `hvd.DistributedGradientTape` does in the train step, Horovod fusing them into
one collective; and the train step's other all-reduce, the one-float vote of
`allreduce.every_learner`.

Rank 0 reads the name of a measurement (the link's set-up) from its standard input, which
mpirun forwards to it, one line at a time, and tells rank 1; both then time, after WARMUP
untimed calls, REPEATS calls of: the gradient set with each compression of COMPRESSIONS
(comma-separated: none, fp16), then the vote; then, unless TRAIN_BATCHES is 0, the learner's
own `Trainer` under each gradient scheme (`--grad_workers_communication`: synchronous, the
gradients all-reduced as the tape takes them, and asynchronous, each step's all-reduced during
the next step's computation) with each compression of TRAIN_COMPRESSIONS (a subset of
COMPRESSIONS), TRAIN_BATCHES batches after one untimed,
on a batch of random frames as `make bench`'s train stage; on the shaped links only, not the
measurement named `unshaped`. Rank 0 prints one line per measurement,
`SCALING {json}`: the seconds of each call, and the bytes its namespace's interfaces sent and
received over the timed calls (everything but `lo`: the veth end). An empty line or the end of
its input ends both ranks. TAG, the run's name, is there so that its processes can be found.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as experiment.py's roles compute

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from benchmarks import stages
from benchmarks.scaling_model import SCHEMES, UNSHAPED, learner_config, train_key
from impala import configs
from impala.learner import allreduce, start

COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}
# Bytes of one element on the wire: Horovod's fp16 compression casts before the collective.
WIRE_BYTES = {"none": 4, "fp16": 2}
MARK = "SCALING "


def interface_bytes() -> tuple[int, int]:
    """Bytes received and sent so far by this namespace's interfaces other than `lo`."""
    received = sent = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, counters = line.split(":", 1)
            if name.strip() != "lo":
                fields = counters.split()
                received, sent = received + int(fields[0]), sent + int(fields[8])
    return received, sent


def gradient_all_reduce(compression: str):
    """A `tf.function` all-reducing a list of tensors as the train step's tape does."""

    def reduce(tensors):
        # Horovod: one allreduce per gradient, averaged, as DistributedGradientTape issues
        # them; its background thread fuses them into one collective.
        return [
            hvd.allreduce(tensor, op=hvd.Average, compression=COMPRESSIONS[compression])
            for tensor in tensors
        ]

    return tf.function(reduce, autograph=False)


def timed(call, warmup: int, repeats: int) -> dict:
    """Seconds of each of `repeats` calls after `warmup` untimed ones, and the interfaces'
    bytes over the timed ones."""
    for _ in range(warmup):
        call()
    received, sent = interface_bytes()
    seconds = []
    for _ in range(repeats):
        begin = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - begin)
    after = interface_bytes()
    return {"seconds": seconds, "received": after[0] - received, "sent": after[1] - sent}


def trainers(agent, config: configs.LearnerConfig, compressions: list[str], rank: int) -> dict:
    """The learner's `Trainer` under each gradient scheme and compression
    (`start.make_trainer`, as the learner makes it), all on one agent (only their speed is
    measured)."""
    return {
        train_key(scheme, compression): start.make_trainer(agent, config, scheme, compression, rank)
        for compression in compressions
        for scheme in SCHEMES
    }


def measure(tensors, reducers, vote, warmup: int, repeats: int, training) -> dict:
    """Every measurement of one link set-up: each compression's gradient set, then the vote,
    then (`training`: the trainers, a batch and how many batches) each trainer's batches."""
    results = {}
    for name, reduce in reducers.items():
        results[name] = timed(lambda reduce=reduce: reduce(tensors)[0].numpy(), warmup, repeats)
    results["vote"] = timed(lambda: vote().numpy(), warmup, repeats)
    if training:
        built, batch, batches = training
        results["train"] = {
            key: timed(lambda trainer=trainer: trainer.learn(batch, frames=0), 1, batches)
            for key, trainer in built.items()
        }
    return results


def main(argv: list[str]) -> int:
    warmup, repeats, compressions = int(argv[1]), int(argv[2]), argv[3].split(",")
    train_batches, train_compressions = int(argv[4]), argv[5].split(",")
    batch_reuse = int(argv[7])  # 0: the learner's default
    topology = allreduce.init(num_learners=2)  # the two ranks mpirun started
    job = configs.LearnerJobConfig()
    env_info, agent = start.build_agent(job)
    rng = np.random.default_rng(topology.rank)
    tensors = [
        tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in agent.trainable_variables
    ]
    elements = sum(int(np.prod(v.shape)) for v in agent.trainable_variables)
    reducers = {name: gradient_all_reduce(name) for name in compressions}
    vote = tf.function(lambda: allreduce.every_learner(tf.constant(True)), autograph=False)
    training = None
    if train_batches:
        config = learner_config(job, batch_reuse)
        batch = stages.train_batch(
            agent, env_info.observation_shape, env_info.observation_dtype, config
        )
        built = trainers(agent, config, train_compressions, topology.rank)
        training = (built, batch, train_batches)
    if topology.is_chief:
        ready = {
            "ready": True,
            "size": topology.size,
            "agent": job.agent_name,
            "level": job.game.level_name,
            "tensors": len(tensors),
            "elements": elements,
            "payload": {name: elements * WIRE_BYTES[name] for name in compressions},
        }
        print(MARK + json.dumps(ready), flush=True)
    while True:
        label = sys.stdin.readline().strip() if topology.is_chief else None
        label = allreduce.broadcast_object_from_chief(label)
        if not label:
            return 0
        shaped = label != UNSHAPED
        results = measure(tensors, reducers, vote, warmup, repeats, training if shaped else None)
        if topology.is_chief:
            print(MARK + json.dumps({"link": label, "results": results}), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
