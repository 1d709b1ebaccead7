"""Why observations travel as raw bytes: TF's RPC layer with a uint8 tensor against a byte string.

  python -m benchmarks.transport_encoding

Sends the same observations ([21, n, 84, 84, 4] uint8, one unroll of n Atari trajectories) to an
RPC server in another process, once as a uint8 tensor and once as a tf.string of its bytes (what
impala/transport does), and prints MB/s for each. Both go over loopback. Then times, on this
process's CPU, turning one chunk of an unroll's observations (7 of 16 environments' [21, 84,
84, 4], sliced as the actor's client slices them) into the string tensor sent: with
`tf.constant` of the bytes, and through a 0-d NumPy object array (what impala/transport does).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from impala.transport.wire import observation_bytes

_SHAPE = [21, 84, 84, 4]


def serve(port: int) -> None:
    """The server process: decodes and queues what it receives, like a learner."""
    queue = tf.queue.FIFOQueue(512, [tf.uint8], shapes=[_SHAPE])

    @tf.function(input_signature=[tf.TensorSpec([None, *_SHAPE], tf.uint8)])
    def put_tensor(x):
        queue.enqueue_many(x)
        return tf.constant(True)

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def put_bytes(x):
        queue.enqueue_many(tf.reshape(tf.io.decode_raw(x, tf.uint8), [-1, *_SHAPE]))
        return tf.constant(True)

    server = tf.distribute.experimental.rpc.Server.create("grpc", f"127.0.0.1:{port}")
    server.register("put_tensor", put_tensor)
    server.register("put_bytes", put_bytes)
    server.start()
    while True:
        if int(queue.size()) >= 8:
            queue.dequeue_many(8)
        time.sleep(0.001)


def measure(port: int, calls: int = 16) -> None:
    client = tf.distribute.experimental.rpc.Client.create("grpc", f"127.0.0.1:{port}")
    spec = tf.TensorSpec([], tf.bool)
    rng = np.random.default_rng(0)
    # Under the 4 MiB message limit either way (the tensor form takes ~1.5 bytes per byte).
    for trajectories in (1, 2):
        data = rng.integers(0, 256, [trajectories, *_SHAPE], dtype=np.uint8)
        rates = {}
        for method, make_arg in (
            ("put_tensor", lambda d=data: tf.constant(d)),
            ("put_bytes", lambda d=data: observation_bytes(d)),
        ):
            for _ in range(3):
                client.call(method, [make_arg()], output_specs=spec).get_value()
            start = time.perf_counter()
            for _ in range(calls):
                client.call(method, [make_arg()], output_specs=spec).get_value()
            rates[method] = data.nbytes * calls / (time.perf_counter() - start) / 1e6
        ratio = rates["put_bytes"] / rates["put_tensor"]
        print(
            f"{data.nbytes / 1e6:.2f} MB per call: uint8 tensor {rates['put_tensor']:6.0f} MB/s, "
            f"bytes {rates['put_bytes']:6.0f} MB/s ({ratio:.1f}x)"
        )


def measure_conversion(repeats: int = 50) -> None:
    """CPU milliseconds to make one chunk's observations a string tensor, both ways."""
    unroll = np.random.default_rng(1).integers(0, 256, [21, 16, 84, 84, 4], dtype=np.uint8)
    ways = {
        "tf.constant(bytes)": lambda: tf.constant(np.ascontiguousarray(unroll[:, :7]).tobytes()),
        "through an object array (impala/transport)": lambda: observation_bytes(unroll[:, :7]),
    }
    cpu_ms = {}
    for _ in range(2):  # alternating rounds, so that neither way has the machine to itself
        for way, convert in ways.items():
            convert()
            start = time.process_time()
            for _ in range(repeats):
                convert()
            cpu_ms.setdefault(way, []).append(1e3 * (time.process_time() - start) / repeats)
    print(
        "a chunk's observations (4.15 MB) to a string tensor, CPU ms: "
        + ", ".join(f"{way} {min(ms):.1f}" for way, ms in cpu_ms.items())
    )


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.transport_encoding", "--serve", str(port)]
    )
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        measure(port)
    finally:
        server.kill()
        server.wait()
    measure_conversion()


if __name__ == "__main__":
    main()
