"""Actor <-> learner transport over gRPC: unrolls, weights, episodes, handshake, close.

Server and clients live in this process and talk over real gRPC on the loopback interface.
Attacks on a learner process are in tests/e2e/test_attacks.py.
"""

import contextlib
import socket
import threading
import time
import types
from concurrent import futures

import grpc
import numpy as np
import pytest
import tensorflow as tf

from impala import run_tls
from impala.launch.ports import free_ports
from impala.trajectory import Steps, Unroll
from impala.trajectory_store import FifoStore
from impala.transport import (
    ACCEPTED,
    MAX_MESSAGE_BYTES,
    QUEUE_FULL,
    REFUSAL_REASONS,
    REFUSED,
    UNKNOWN_ACTOR,
    ActorClient,
    AuthenticationError,
    LearnerFinishedError,
    LearnerRestartedError,
    LearnerService,
    LearnerUnreachableError,
    MismatchError,
    ProtocolError,
    UnrollSpec,
    serving,
    wire,
)
from impala.transport import client as client_module
from impala.transport.authentication import Authenticator
from impala.transport.queueing import TrajectoryQueue
from impala.transport.roster import ROOM_ASKING_SECS
from impala.transport.serving import check_listening_address
from tests.helpers import wait_until
from tests.raw_http2 import UnreadingCaller

IDENTITY = {"level_name": "PongNoFrameskip-v4", "agent": "ResNetLSTMAgent", "unroll_length": 4}
SECRET = "5e" * 32  # a run secret: 64 hexadecimal digits
ATARI_SHAPE = (84, 84, 4)
LSTM_SIZE = 8
# Long enough for a real hang to show, short enough that a broken test fails fast.
CLIENT_TIMEOUT_SECS = 30.0
THREAD_TIMEOUT_SECS = 15.0


def _free_address():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"localhost:{port}"


def _lstm_spec(unroll_length=4, observation_shape=ATARI_SHAPE, observation_dtype="uint8"):
    return UnrollSpec(
        unroll_length=unroll_length,
        observation_shape=observation_shape,
        observation_dtype=observation_dtype,
        num_actions=6,
        state_shapes=((LSTM_SIZE,), (LSTM_SIZE,)),
        state_dtypes=("float32", "float32"),
    )


def _unroll(spec, num_envs, rng, weight_version=0, first_env=0):
    """Random unroll whose `reward[0]` holds each trajectory's env index, to find it again.

    (Not an action: the learner refuses actions outside the action space.)
    """
    steps = (spec.unroll_length + 1, num_envs)
    if spec.observation_dtype == "uint8":
        observation = rng.integers(0, 256, (*steps, *spec.observation_shape), dtype=np.uint8)
    else:
        observation = rng.standard_normal((*steps, *spec.observation_shape))
        observation = observation.astype(spec.observation_dtype)
    reward = rng.standard_normal(steps).astype(np.float32)
    reward[0] = np.arange(first_env, first_env + num_envs)
    return Unroll(
        agent_state=tuple(
            rng.standard_normal((num_envs, *shape)).astype(dtype)
            for shape, dtype in zip(spec.state_shapes, spec.state_dtypes, strict=True)
        ),
        steps=Steps(
            prev_action=rng.integers(0, spec.num_actions, steps, dtype=np.int32),
            reward=reward,
            done=rng.random(steps) < 0.3,
            observation=observation,
            action=rng.integers(0, spec.num_actions, steps, dtype=np.int32),
            policy_logits=rng.standard_normal((*steps, spec.num_actions)).astype(np.float32),
        ),
        weight_version=weight_version,
    )


def _assert_same_trajectories(batch, unroll, first_env=0):
    """Every env of `unroll` appears once in `batch`, bit-exact, whatever the order of chunks."""
    num_envs = unroll.steps.prev_action.shape[1]
    envs = np.asarray(batch.steps.reward)[0].astype(int)
    order = np.argsort(envs, kind="stable")
    np.testing.assert_array_equal(envs[order], np.arange(first_env, first_env + num_envs))
    for name, got, sent in zip(Steps._fields, batch.steps, unroll.steps, strict=True):
        got = np.asarray(got)
        assert got.dtype == sent.dtype, name
        np.testing.assert_array_equal(got[:, order], sent, err_msg=name)
    sent_states = tf.nest.flatten(unroll.agent_state)
    assert len(batch.agent_state) == len(sent_states)
    for got, sent in zip(batch.agent_state, sent_states, strict=True):
        got = np.asarray(got)
        assert got.dtype == sent.dtype
        np.testing.assert_array_equal(got[order], sent)


class _Thread:
    """Runs `fn` in a daemon thread and keeps its result or exception, so a test cannot hang."""

    def __init__(self, fn, *args):
        self.result = self.error = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), daemon=True)
        self._thread.start()

    def _run(self, fn, *args):
        try:
            self.result = fn(*args)
        except BaseException as error:
            self.error = error

    def is_alive(self):
        return self._thread.is_alive()

    def join(self, timeout=THREAD_TIMEOUT_SECS):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still blocked after {timeout} s"


def _wait_until(condition, timeout=THREAD_TIMEOUT_SECS):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _start_waiting_for_room(client, unroll):
    """Starts `client.send(unroll)` on a thread and returns it once the actor has been told
    twice that the queue is full (so it is waiting for room, not about to send)."""
    before = client.room_calls
    sending = _Thread(client.send, unroll)
    _wait_until(lambda: client.room_calls >= before + 2)
    return sending


def _episode(episode_return, episode_steps, episode_frames, start_frames=-1):
    return types.SimpleNamespace(
        episode_return=episode_return,
        episode_steps=episode_steps,
        episode_frames=episode_frames,
        start_frames=start_frames,
    )


@pytest.fixture
def make_service():
    """Starts `LearnerService`s on free ports; closes them after the test."""
    services = []

    def make(
        spec, variables=(), queue_capacity=64, learner_index=0, num_learners=1, synchronous=False
    ):
        address = _free_address()
        service = LearnerService(
            address,
            spec,
            IDENTITY,
            list(variables),
            learner_index,
            num_learners,
            queue_capacity,
            secret=SECRET,
            synchronous=synchronous,
        )
        services.append(service)
        return service, address

    yield make
    for service in services:
        service.close()
        service.stop()


def _client(address, spec, actor_task=0, variables=(), identity=IDENTITY, secret=SECRET):
    return ActorClient(
        address,
        actor_task,
        spec,
        identity,
        list(variables),
        timeout_secs=CLIENT_TIMEOUT_SECS,
        secret=secret,
    )


# ---- Unrolls --------------------------------------------------------------------------------


@pytest.mark.parametrize("num_envs", [1, 3])
def test_small_atari_unroll_round_trips_bit_exact(make_service, num_envs):
    spec = _lstm_spec()
    service, address = make_service(spec)
    unroll = _unroll(spec, num_envs, np.random.default_rng(num_envs))
    _client(address, spec).send(unroll)

    assert service.queue_size == num_envs
    batch = service.dequeue(num_envs)
    assert batch.steps.observation.shape == (spec.unroll_length + 1, num_envs, *ATARI_SHAPE)
    assert batch.steps.policy_logits.shape == (spec.unroll_length + 1, num_envs, spec.num_actions)
    assert [s.shape for s in batch.agent_state] == [(num_envs, LSTM_SIZE)] * 2
    _assert_same_trajectories(batch, unroll)
    assert service.queue_size == 0


def test_unroll_larger_than_a_message_is_sent_in_chunks(make_service):
    spec = _lstm_spec()
    per_chunk = spec.chunk_trajectories
    assert per_chunk == MAX_MESSAGE_BYTES // spec.trajectory_bytes
    num_envs = 2 * per_chunk + 3  # three chunks, the last one partial
    assert num_envs * spec.trajectory_bytes > 2 * MAX_MESSAGE_BYTES
    service, address = make_service(spec, queue_capacity=num_envs)
    unroll = _unroll(spec, num_envs, np.random.default_rng(0))
    _client(address, spec).send(unroll)

    assert service.queue_size == num_envs
    _assert_same_trajectories(service.dequeue(num_envs), unroll)


def test_the_learner_sleeps_until_its_batch_is_in_and_wakes_as_it_arrives(make_service):
    """`wait_for_trajectories` times out while too few are queued, and is woken by the chunk
    that completes the batch rather than at its timeout."""
    spec = _lstm_spec(unroll_length=3, observation_shape=(5,), observation_dtype="float32")
    service, address = make_service(spec)
    client = _client(address, spec)
    client.send(_unroll(spec, 2, np.random.default_rng(0)))
    assert service.wait_for_trajectories(2, timeout_secs=0)
    started = time.monotonic()
    assert not service.wait_for_trajectories(4, timeout_secs=0.3)
    assert time.monotonic() - started >= 0.3

    sender = threading.Timer(0.5, client.send, [_unroll(spec, 2, np.random.default_rng(1))])
    sender.start()
    started = time.monotonic()
    try:
        assert service.wait_for_trajectories(4, timeout_secs=30)
    finally:
        sender.join()
    # Woken by the arrival: a wait that missed it would have slept its 30 s.
    assert 0.4 < time.monotonic() - started < 15
    assert service.queue_size == 4


def test_a_wait_for_trajectories_ends_when_the_service_closes(make_service):
    """A learner told to stop while it waits for its batch is not held for its timeout."""
    spec = _lstm_spec(unroll_length=3, observation_shape=(5,), observation_dtype="float32")
    service, _ = make_service(spec)
    closer = threading.Timer(0.3, service.close)
    closer.start()
    started = time.monotonic()
    try:
        assert not service.wait_for_trajectories(4, timeout_secs=30)
    finally:
        closer.join()
    assert not service.wait_for_trajectories(1, timeout_secs=30)  # once closed, at once
    assert time.monotonic() - started < 15


def test_float_vector_observations_round_trip_bit_exact(make_service):
    spec = _lstm_spec(unroll_length=7, observation_shape=(5,), observation_dtype="float32")
    service, address = make_service(spec)
    unroll = _unroll(spec, 6, np.random.default_rng(1))
    _client(address, spec).send(unroll)

    batch = service.dequeue(6)
    assert batch.steps.observation.dtype == tf.float32
    assert batch.steps.observation.shape == (8, 6, 5)
    _assert_same_trajectories(batch, unroll)


def test_feed_forward_agent_without_core_state(make_service):
    spec = UnrollSpec(
        unroll_length=3, observation_shape=(4,), observation_dtype="float32", num_actions=2
    )
    service, address = make_service(spec)
    unroll = _unroll(spec, 2, np.random.default_rng(2))
    assert unroll.agent_state == ()
    _client(address, spec).send(unroll)

    batch = service.dequeue(2)
    assert list(batch.agent_state) == []
    _assert_same_trajectories(batch, unroll)


def test_many_small_trajectories_whose_other_fields_exceed_a_message(make_service):
    # Vector observations are tiny, but the core states alone are well over a message: the
    # chunks must be sized on every field, not on observations alone.
    spec = UnrollSpec(
        unroll_length=20,
        observation_shape=(4,),
        observation_dtype="float32",
        num_actions=2,
        state_shapes=((256,), (256,)),
        state_dtypes=("float32", "float32"),
    )
    num_envs = 2500
    state_bytes = num_envs * 2 * 256 * 4
    observation_bytes = num_envs * (spec.unroll_length + 1) * 4 * 4
    assert state_bytes > 4 << 20 and observation_bytes < MAX_MESSAGE_BYTES
    service, address = make_service(spec, queue_capacity=num_envs)
    unroll = _unroll(spec, num_envs, np.random.default_rng(3))
    _client(address, spec).send(unroll)

    _assert_same_trajectories(service.dequeue(num_envs), unroll)


def test_dequeued_trajectories_carry_actor_task_and_weight_version(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    rng = np.random.default_rng(4)
    first, second = _client(address, spec, actor_task=3), _client(address, spec, actor_task=8)
    first.send(_unroll(spec, 2, rng, weight_version=11, first_env=0))
    second.send(_unroll(spec, 3, rng, weight_version=12, first_env=10))
    first.send(_unroll(spec, 1, rng, weight_version=2**40, first_env=20))

    batch = service.dequeue(6)
    assert batch.actor_task.dtype == tf.int32
    assert batch.weight_version.dtype == tf.int64
    got = {
        int(env): (int(task), int(version))
        for env, task, version in zip(
            np.asarray(batch.steps.reward)[0],
            batch.actor_task.numpy(),
            batch.weight_version.numpy(),
            strict=True,
        )
    }
    assert got == {
        0: (3, 11),
        1: (3, 11),
        10: (8, 12),
        11: (8, 12),
        12: (8, 12),
        20: (3, 2**40),
    }


def test_a_request_that_breaks_its_layout_is_a_protocol_error_and_the_learner_goes_on(
    make_service,
):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, [tf.Variable(np.zeros(3, np.float32))])
    service.publish_weights(0)
    client = _client(address, spec)
    with pytest.raises(ProtocolError, match=r"Weights on learner .*INVALID_ARGUMENT"):
        client._call("Weights", b"\0" * 9)  # a version is 8 bytes
    with pytest.raises(ProtocolError, match=r"Room on learner .*INVALID_ARGUMENT"):
        client._call("Room", b"")

    good = _unroll(spec, 2, np.random.default_rng(5))
    client.send(good)
    _assert_same_trajectories(service.dequeue(2), good)


# ---- Backpressure and closing ---------------------------------------------------------------


def test_full_queue_blocks_the_actor_until_the_learner_dequeues(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, queue_capacity=3)
    rng = np.random.default_rng(6)
    client = _client(address, spec)
    unrolls = [_unroll(spec, 2, rng, first_env=2 * i) for i in range(3)]
    client.send(unrolls[0])
    # Not full yet (2 of 3): the next chunk goes in whole, passing the capacity by one.
    client.send(unrolls[1])
    assert service.queue_size == 4

    sending = _start_waiting_for_room(client, unrolls[2])  # full: waits for the learner
    assert sending.is_alive(), "send returned although the queue was full"
    assert service.queue_size == 4

    batches = [service.dequeue(2)]
    sending.join()
    assert sending.error is None
    batches += [service.dequeue(2), service.dequeue(2)]
    assert service.queue_size == 0
    # One actor's trajectories stay in order, each unroll whole.
    for index, (batch, unroll) in enumerate(zip(batches, unrolls, strict=True)):
        _assert_same_trajectories(batch, unroll, first_env=2 * index)


class _CountingStore(FifoStore):
    """A FIFO store that counts the chunks offered to it, admitted or not."""

    def __init__(self, specs, capacity):
        super().__init__(specs, capacity)
        self.offered = tf.Variable(0, dtype=tf.int64, trainable=False)

    def admit(self, components):
        with tf.control_dependencies([self.offered.assign_add(1)]):
            return super().admit(components)


@contextlib.contextmanager
def _full_counting_service(seed):
    """A service whose store counts the chunks offered to it, filled by one client's unroll of
    2; yields (service, store, that client, rng)."""
    spec = _lstm_spec()
    store = _CountingStore(spec.queue_specs(), capacity=2)
    address = _free_address()
    service = LearnerService(address, spec, IDENTITY, [], 0, 1, store=store, secret=SECRET)
    try:
        rng = np.random.default_rng(seed)
        client = _client(address, spec)
        client.send(_unroll(spec, 2, rng))  # fills the queue
        assert int(store.offered) == 1
        yield service, store, client, rng
    finally:
        service.close()
        service.stop()


def test_an_actor_waiting_for_room_sends_nothing_until_there_is_room():
    # Unrolls sent to a full queue travel, are decoded and checked, and are refused: the actor
    # asks for room with a small call instead and sends its unroll once.
    with _full_counting_service(21) as (service, store, client, rng):
        waiting = _unroll(service.spec, 2, rng, first_env=2)
        sending = _start_waiting_for_room(client, waiting)
        assert sending.is_alive(), "send returned although the queue was full"
        assert int(store.offered) == 1, "the unroll was sent to a full queue"
        service.dequeue(2)
        sending.join()
        assert sending.error is None
        assert int(store.offered) == 2
        assert (client.sent_chunks, client.full_chunks) == (2, 0)
        _assert_same_trajectories(service.dequeue(2), waiting, first_env=2)


def test_a_chunk_that_meets_a_full_store_is_refused_before_it_is_decoded():
    # Two actors told there is room may both send: the chunks that find the queue filled by
    # the other's are answered QUEUE_FULL without being decoded and offered to the store.
    with _full_counting_service(22) as (service, store, client, rng):
        chunk = client._chunk(_unroll(service.spec, 2, rng), slice(0, 2))
        assert _status(client._call("Enqueue", chunk)) == QUEUE_FULL
        assert int(store.offered) == 1
        assert service.queue_size == 2


def test_an_actor_that_waits_long_for_room_asks_less_often(make_service, monkeypatch):
    # Each `room` call costs both sides CPU. An actor pauses between calls for up to a tenth of
    # how long it has waited so far or typically waits, rather than every 20 ms (about 100
    # calls in 2 s), and still hears of room soon after it opens. The pauses are the client's
    # own (recorded as it sleeps), not call counts, which a busy machine changes.
    pauses = []
    recording = types.SimpleNamespace(
        monotonic=time.monotonic, sleep=lambda secs: (pauses.append(secs), time.sleep(secs))
    )
    monkeypatch.setattr(client_module, "time", recording)
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, queue_capacity=2)
    rng = np.random.default_rng(5)
    client = _client(address, spec)
    client.send(_unroll(spec, 2, rng))  # fills the queue
    calls, heard, waits, typical = [], [], [], []
    for _ in range(3):
        before = client.room_calls
        typical.append(client._typical_room_wait_secs)
        del pauses[:]
        sending = _Thread(client.send, _unroll(spec, 2, rng))
        time.sleep(2.0)
        assert sending.is_alive(), "send returned although the queue was full"
        room_at = time.monotonic()
        service.dequeue(2)
        sending.join()
        assert sending.error is None
        calls.append(client.room_calls - before)
        heard.append(time.monotonic() - room_at)
        waits.append(list(pauses))
    # Every wait's pauses start at 2 ms and double; none is longer than 0.2 s.
    for wait in waits:
        assert wait[:4] == [0.002, 0.004, 0.008, 0.016] and max(wait) <= 0.2, wait
    # The first wait: from 20 ms, a tenth of the time waited: about 40 calls in 2 s.
    assert calls[0] < 60, calls
    # Two waits of about 2 s later, the typical wait is about 0.7 s: from its seventh call on,
    # the third wait pauses at least a tenth of that between calls.
    assert typical[2] > 0.5, typical
    assert min(waits[2][6:]) >= min(0.2, typical[2] / 10), (typical[2], waits[2])
    assert max(heard) < 1.0, f"room heard of {max(heard):.2f} s after it opened"
    assert service.queue_size == 2


def _status(reply: bytes) -> int:
    return wire.STATUS.unpack(reply)[0]


def _ask_room(client, task=None):
    task = client._task if task is None else task
    return _status(client._call("Room", wire.TASK.pack(task)))


def _two_actors_at_a_full_queue(make_service, seed):
    """A learner whose queue (capacity 2) the first of two actors (tasks 0 and 1) has filled."""
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, queue_capacity=2)
    rng = np.random.default_rng(seed)
    first, second = (_client(address, spec, actor_task=task) for task in (0, 1))
    first.send(_unroll(spec, 2, rng))
    return service, rng, first, second


def test_room_goes_to_the_actor_that_has_waited_longest(make_service):
    # Answered by who asks first, an actor that pauses longer between asks (after long waits)
    # lost the race for room again and again: 25 unrolls against 94 in one make bench run.
    service, rng, first, second = _two_actors_at_a_full_queue(make_service, 31)
    assert _ask_room(first) == QUEUE_FULL  # actor 0 begins to wait
    time.sleep(0.05)
    assert _ask_room(second) == QUEUE_FULL  # then actor 1
    service.dequeue(2)
    assert _ask_room(second) == QUEUE_FULL, "room went past the actor that waited longer"
    assert _ask_room(first) == ACCEPTED
    # The room is actor 0's until its unroll arrives, even if actor 1 asks in between.
    assert _ask_room(second) == QUEUE_FULL, "room given to one actor went to another too"
    assert _ask_room(first) == ACCEPTED
    first.send(_unroll(service.spec, 1, rng))  # one trajectory: room for one more
    assert _ask_room(second) == ACCEPTED  # first in line now, and the room is still there


@pytest.mark.parametrize("given_room", [False, True], ids=["waiting", "given_room"])
def test_an_actor_that_stopped_asking_does_not_hold_up_the_line(make_service, given_room):
    # An actor that died (or sent) while waiting, or died after it was given room and before
    # its unroll arrived, is passed over once it has not asked for ROOM_ASKING_SECS, and
    # asking again later starts a new wait at the back of the line.
    service, rng, gone, waiting = _two_actors_at_a_full_queue(make_service, 32)
    assert _ask_room(gone) == QUEUE_FULL
    time.sleep(0.05)
    assert _ask_room(waiting) == QUEUE_FULL
    service.dequeue(2)
    if given_room:
        assert _ask_room(gone) == ACCEPTED  # and it never sends
    assert _ask_room(waiting) == QUEUE_FULL  # actor 0 is still asking, as far as it can tell
    time.sleep(ROOM_ASKING_SECS + 0.1)
    assert _ask_room(waiting) == ACCEPTED
    waiting.send(_unroll(service.spec, 2, rng))  # fills the queue again
    assert _ask_room(gone) == QUEUE_FULL  # back, and waiting anew
    service.dequeue(2)
    assert _ask_room(gone) == ACCEPTED


def test_a_task_this_learner_does_not_serve_takes_no_place_in_line(make_service):
    # `room` carries the caller's task: a negative one (or another learner's) is answered
    # whether the store has room, as before, and never holds up this learner's actors.
    service, _, first, second = _two_actors_at_a_full_queue(make_service, 35)
    assert _ask_room(first, -5) == QUEUE_FULL
    time.sleep(0.05)
    assert _ask_room(second) == QUEUE_FULL
    service.dequeue(2)
    assert _ask_room(second) == ACCEPTED
    assert _ask_room(first, -5) == ACCEPTED


def test_an_actor_that_has_waited_long_keeps_its_place_in_line(make_service):
    # After 3 s of waiting an actor pauses up to 0.2 s between asks: still often enough to
    # count as asking (ROOM_ASKING_SECS), so an actor that began waiting later and asks every
    # few ms does not go first.
    service, rng, early, late = _two_actors_at_a_full_queue(make_service, 34)
    spec = service.spec
    early_unroll = _unroll(spec, 2, rng, first_env=2)
    early_sending = _Thread(early.send, early_unroll)
    time.sleep(3.0)
    late_sending = _Thread(late.send, _unroll(spec, 2, rng, first_env=4))
    time.sleep(0.1)
    service.dequeue(2)
    _assert_same_trajectories(service.dequeue(2), early_unroll, first_env=2)
    early_sending.join()
    late_sending.join()
    assert early_sending.error is None and late_sending.error is None


def test_actors_sending_in_turn_are_served_evenly(make_service):
    # Two actors sending unroll after unroll through `send`, a learner taking one batch (one
    # unroll) at a time: each actor's unrolls reach the learner about as often as the other's.
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, queue_capacity=2)
    clients = [_client(address, spec, actor_task=task) for task in (0, 1)]
    stop = threading.Event()

    def act(client):
        # Closing the service at the end ends each actor's send one way or the other.
        with contextlib.suppress(LearnerFinishedError, LearnerUnreachableError):
            while not stop.is_set():
                client.send(_unroll(spec, 2, np.random.default_rng(client._task)))

    actors = [_Thread(act, c) for c in clients]
    served = []
    try:
        for _ in range(40):
            served += np.asarray(service.dequeue(2).actor_task).tolist()[:1]
            time.sleep(0.1)  # the learner's step
    finally:
        stop.set()
        service.close()
        # Each actor hears that the learner finished while its service still exists: left
        # running, a thread's next call could reach the queue after the service was collected
        # at the test's end, and fail with NotFoundError instead.
        for actor in actors:
            actor.join()
    assert [actor.error for actor in actors] == [None, None]
    assert min(served.count(0), served.count(1)) >= 15, served


def test_an_actor_refuses_a_learner_that_lacks_a_method():
    # A learner of other code (one without `Hello`, say) is named at connecting, not met with
    # an unexplained error.
    address = _free_address()
    server = grpc.server(futures.ThreadPoolExecutor(1))
    server.add_insecure_port(address)
    server.start()
    try:
        spec = _lstm_spec()
        with pytest.raises(MismatchError, match=f"learner at {address} does not serve Hello"):
            _client(address, spec)
    finally:
        server.stop(None)


def test_a_queue_of_one_batch_fills_whatever_the_chunk_sizes(make_service):
    # Chunks of 3 against a capacity and batch of 4: refusing a chunk that does not fit whole
    # left 3 queued, the learner waiting for a fourth and every actor waiting for room.
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, queue_capacity=4)
    rng = np.random.default_rng(13)
    _client(address, spec, actor_task=0).send(_unroll(spec, 3, rng))
    sender = _Thread(_client(address, spec, actor_task=1).send, _unroll(spec, 3, rng))
    # The learner waits for a whole batch to be queued before it dequeues one.
    _wait_until(lambda: service.queue_size >= 4)
    sender.join()
    assert sender.error is None
    assert np.asarray(service.dequeue(4).actor_task).tolist() == [0, 0, 0, 1]
    assert service.queue_size == 2


def test_after_close_every_call_raises_learner_finished(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    variables = [tf.Variable([1.0, 2.0])]
    service, address = make_service(spec, variables)
    rng = np.random.default_rng(7)
    client = _client(address, spec, variables=variables)
    client.send(_unroll(spec, 1, rng))
    service.publish_weights(3)
    service.close()
    with pytest.raises(LearnerFinishedError):
        client.send(_unroll(spec, 1, rng))
    with pytest.raises(LearnerFinishedError):
        client.report_episodes([_episode(1.0, 1, 4)])
    with pytest.raises(LearnerFinishedError):
        client.fetch_weights()
    # What was queued before closing can still be taken.
    assert service.dequeue(1).actor_task.numpy().tolist() == [0]


def test_close_releases_an_actor_waiting_for_room(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, queue_capacity=1)
    rng = np.random.default_rng(8)
    client = _client(address, spec)
    client.send(_unroll(spec, 1, rng))

    sending = _start_waiting_for_room(client, _unroll(spec, 1, rng))
    assert sending.is_alive(), "send returned although the queue was full"
    service.close()
    sending.join()
    assert isinstance(sending.error, LearnerFinishedError), repr(sending.error)


def test_a_chunk_arriving_as_the_learner_finishes_hears_that_it_finished(make_service, monkeypatch):
    # The learner finishes (closing its store) after the service checked that it still
    # trains and before the store takes the chunk: an error from the closed store, which the
    # actor took for a broken learner, is not the answer.
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    admit = TrajectoryQueue.admit

    def finishing_first(queue, *chunk):
        service.close()
        return admit(queue, *chunk)

    monkeypatch.setattr(TrajectoryQueue, "admit", finishing_first)
    with pytest.raises(LearnerFinishedError):
        _client(address, spec).send(_unroll(spec, 1, np.random.default_rng(15)))


# ---- The trajectory store -------------------------------------------------------------------


def test_the_service_keeps_trajectories_in_the_store_it_is_given():
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    store = FifoStore(spec.queue_specs(), capacity=5)
    with pytest.raises(ValueError, match="either queue_capacity"):
        LearnerService(_free_address(), spec, IDENTITY, [], 0, 1, 5, store=store, secret=SECRET)
    address = _free_address()
    service = LearnerService(address, spec, IDENTITY, [], 0, 1, store=store, secret=SECRET)
    try:
        assert service.queue_capacity == 5
        unroll = _unroll(spec, 2, np.random.default_rng(14))
        _client(address, spec).send(unroll)
        assert int(store.size()) == service.queue_size == 2
        _assert_same_trajectories(service.dequeue(2), unroll)
    finally:
        service.close()
        service.stop()


# ---- Unreachable learner --------------------------------------------------------------------


def test_connecting_where_no_learner_listens_raises_unreachable():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))  # held, never listening: nobody answers there
        address = f"localhost:{sock.getsockname()[1]}"
        spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
        with pytest.raises(LearnerUnreachableError):
            ActorClient(address, 0, spec, IDENTITY, [], timeout_secs=1.0, secret=SECRET)


def test_calls_to_a_learner_that_is_gone_raise_unreachable():
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    address = _free_address()
    service = LearnerService(address, spec, IDENTITY, [], 0, 1, 8, secret=SECRET)
    client = ActorClient(address, 0, spec, IDENTITY, [], timeout_secs=1.0, secret=SECRET)
    service.stop()
    with pytest.raises(LearnerUnreachableError):
        client.send(_unroll(spec, 1, np.random.default_rng(15)))


def test_an_actor_whose_learner_restarted_connects_again_before_it_sends():
    # gRPC reconnects on its own to a learner that comes back at the same address, so the
    # client's next call reaches a learner that never checked it: it is told to say hello.
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    rng = np.random.default_rng(16)
    client, restarted, address = _restarted_learner(spec, spec, IDENTITY, rng)
    try:
        # Not refused (the trajectories are sound) nor queued: sent again after a new hello.
        with pytest.raises(LearnerRestartedError, match="restarted since actor 0 connected"):
            client.send(_unroll(spec, 1, rng))
        assert restarted.queue_size == 0 and restarted.connections == {}
        assert sum(restarted.refusals.values()) == 0
        again = _client(address, spec, actor_task=0)
        again.send(_unroll(spec, 1, rng))
        assert restarted.queue_size == 1 and restarted.connections == {0: 1}
    finally:
        restarted.stop()


def test_an_actor_whose_learner_came_back_with_another_spec_hears_what_differs():
    # Told to say hello before its chunks are checked, it hears of the mismatch by name
    # instead of having one chunk after another refused as malformed.
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    other_spec = _lstm_spec(observation_shape=(5,), observation_dtype="float32")
    other_identity = {**IDENTITY, "level_name": "BreakoutNoFrameskip-v4"}
    rng = np.random.default_rng(17)
    client, restarted, address = _restarted_learner(spec, other_spec, other_identity, rng)
    try:
        with pytest.raises(LearnerRestartedError):
            client.send(_unroll(spec, 1, rng))
        assert sum(restarted.refusals.values()) == 0
        with pytest.raises(MismatchError, match="level_name"):
            _client(address, spec, actor_task=0)
    finally:
        restarted.stop()


def _restarted_learner(spec, new_spec, new_identity, rng):
    """A client that sent to a learner, and the learner started anew at the same address."""
    address = _free_address()
    service = LearnerService(address, spec, IDENTITY, [], 0, 1, 8, secret=SECRET)
    client = _client(address, spec, actor_task=0)
    client.send(_unroll(spec, 1, rng))
    assert service.queue_size == 1
    service.stop()
    restarted = LearnerService(address, new_spec, new_identity, [], 0, 1, 8, secret=SECRET)
    return client, restarted, address


# ---- Weights --------------------------------------------------------------------------------


def _weights(rng, shapes):
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def test_fetch_weights_returns_each_published_version_once(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    # The first variable alone is larger than an unroll's chunk.
    shapes = [(1100, 800), (7,), (), (3, 1, 2)]
    assert MAX_MESSAGE_BYTES < 1100 * 800 * 4
    rng = np.random.default_rng(9)
    learner_variables = [tf.Variable(w) for w in _weights(rng, shapes)]
    actor_variables = [tf.Variable(np.zeros(shape, np.float32)) for shape in shapes]
    service, address = make_service(spec, learner_variables)
    client = _client(address, spec, variables=actor_variables)

    assert client.fetch_weights() is None  # nothing published yet
    assert client.learner_version() == -1

    service.publish_weights(0)
    weights, version = client.fetch_weights()
    assert version == client.version == 0
    assert [w.shape for w in weights] == shapes
    for got, variable in zip(weights, learner_variables, strict=True):
        np.testing.assert_array_equal(got, variable.numpy())
    assert client.fetch_weights() is None  # up to date

    new_values = _weights(rng, shapes)
    for variable, value in zip(learner_variables, new_values, strict=True):
        variable.assign(value)
    assert client.fetch_weights() is None  # changed but not published
    service.publish_weights(7)
    assert client.learner_version() == 7
    weights, version = client.fetch_weights()
    assert version == client.version == 7
    for got, value in zip(weights, new_values, strict=True):
        np.testing.assert_array_equal(got, value)
    assert client.fetch_weights() is None


def test_each_actor_fetches_weights_independently(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    learner_variables = [tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))]
    service, address = make_service(spec, learner_variables)
    service.publish_weights(1)
    first = _client(address, spec, actor_task=0, variables=learner_variables)
    second = _client(address, spec, actor_task=1, variables=learner_variables)
    assert first.fetch_weights()[1] == 1
    assert first.fetch_weights() is None
    weights, version = second.fetch_weights()
    assert version == 1
    np.testing.assert_array_equal(weights[0], np.arange(6).reshape(2, 3))


# ---- Handshake ------------------------------------------------------------------------------


def test_identity_mismatch_names_every_differing_field(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    actor_identity = {**IDENTITY, "unroll_length": 20, "agent": "MLPAgent", "extra": True}
    with pytest.raises(MismatchError) as raised:
        _client(address, spec, identity=actor_identity)
    message = str(raised.value)
    assert "agent: actor has 'MLPAgent', learner has 'ResNetLSTMAgent'" in message
    assert "unroll_length: actor has 20, learner has 4" in message
    assert "extra: actor has True, learner has None" in message
    assert "level_name" not in message

    # The learner keeps serving: a matching actor connects and sends.
    client = _client(address, spec)
    unroll = _unroll(spec, 2, np.random.default_rng(10))
    client.send(unroll)
    _assert_same_trajectories(service.dequeue(2), unroll)


@pytest.mark.parametrize(
    ("actor_task", "num_learners", "owner"), [(1, 2, 1), (5, 2, 1), (4, 3, 1), (5, 3, 2)]
)
def test_actor_of_another_learner_is_rejected(make_service, actor_task, num_learners, owner):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, learner_index=0, num_learners=num_learners)
    with pytest.raises(MismatchError, match=f"task {actor_task} belongs to learner {owner} "):
        _client(address, spec, actor_task=actor_task)
    # Even with a different identity too, the learner names the right learner.
    with pytest.raises(MismatchError, match=rf"belongs to learner {owner} .*not to learner 0"):
        _client(address, spec, actor_task=actor_task, identity={"other": 1})

    client = _client(address, spec, actor_task=num_learners)  # task mod learners == 0: ours
    client.send(_unroll(spec, 1, np.random.default_rng(11)))
    assert service.dequeue(1).actor_task.numpy().tolist() == [num_learners]


def test_actor_of_this_learner_connects_when_there_are_several(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, learner_index=1, num_learners=2)
    with pytest.raises(MismatchError, match=r"task 4 belongs to learner 0 .*not to learner 1"):
        _client(address, spec, actor_task=4)
    client = _client(address, spec, actor_task=3)
    client.send(_unroll(spec, 1, np.random.default_rng(12)))
    assert service.dequeue(1).actor_task.numpy().tolist() == [3]


# ---- Episodes -------------------------------------------------------------------------------


def test_reported_episodes_are_popped_once_with_their_actor_task(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    first, second = _client(address, spec, actor_task=2), _client(address, spec, actor_task=5)
    first.report_episodes([_episode(21.0, 1000, 4000, 7), _episode(-3.5, 17, 68, 30)])
    second.report_episodes([])  # nothing to report: no call
    second.report_episodes([_episode(0.25, 3, 12)])  # a family without start frames

    episodes = service.pop_episodes()
    assert episodes.actor_task.dtype == np.int32
    assert episodes.episode_return.dtype == np.float32
    assert episodes.episode_steps.dtype == episodes.episode_frames.dtype == np.int64
    np.testing.assert_array_equal(episodes.actor_task, [2, 2, 5])
    np.testing.assert_array_equal(episodes.episode_return, [21.0, -3.5, 0.25])
    np.testing.assert_array_equal(episodes.episode_steps, [1000, 17, 3])
    np.testing.assert_array_equal(episodes.episode_frames, [4000, 68, 12])
    assert episodes.start_frames.dtype == np.int64
    np.testing.assert_array_equal(episodes.start_frames, [7, 30, -1])

    empty = service.pop_episodes()
    dtypes = (np.int32, np.float32, np.int64, np.int64, np.int64)
    for field, dtype in zip(empty, dtypes, strict=True):
        assert field.shape == (0,)
        assert field.dtype == dtype


def test_pop_episodes_on_a_fresh_learner_is_empty(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, _ = make_service(spec)
    episodes = service.pop_episodes()
    assert all(field.shape == (0,) for field in episodes)


# ---- Large replies left unread ---------------------------------------------------------------


def _unread_calls(address, method, request, calls):
    """`calls` calls of `method` with the secret over one bare HTTP/2 connection whose
    windows stay shut, so that no reply is ever read: the connection and their streams."""
    host, port = address.rsplit(":", 1)
    caller = UnreadingCaller(host, int(port))
    metadata = [(wire.SECRET_KEY, SECRET)]
    return caller, [caller.call(wire.method_path(method), request, metadata) for _ in range(calls)]


def test_weights_a_caller_never_reads_are_held_within_a_budget_and_cancelled_when_late(
    make_service, monkeypatch
):
    """A caller with the secret, over a bare socket, asks for the weights again and again and
    never reads them (each stream's HTTP/2 window shut): gRPC frees each call's place when its
    handler returns but keeps its reply, so the learner held every reply until the caller hung
    up. Now those unread stay within the budget, calls past it end RESOURCE_EXHAUSTED (an
    actor tries again), and replies left unread too long are cancelled, freeing the room."""
    monkeypatch.setattr(serving, "MAX_REPLY_BYTES_OUT", 6 << 20)
    weights = tf.Variable(tf.zeros([1 << 18]))  # 1 MiB a reply
    service, address = make_service(_lstm_spec(), variables=[weights])
    clock = [0.0]
    service._replies._clock = lambda: clock[0]
    service.publish_weights(7)
    reply_bytes = wire.VERSION.size + (1 << 20)
    calls = 30  # within one connection's streams at once (serving.MAX_STREAMS_PER_CONNECTION)
    caller, streams = _unread_calls(address, "Weights", wire.VERSION.pack(-1), calls)
    with caller:
        # The calls past the budget ended; the others wait for a read that never comes.
        wait_until(
            lambda: service.unread_replies["refused"] + len(service._replies._out) == calls,
            10,
            lambda: f"{service.unread_replies}, {len(service._replies._out)} out",
        )
        kept = set(streams) - caller.ended
        wait_until(lambda: len(caller.ended) == calls - len(kept), 10, lambda: caller.ended)
        # Admitted while under 6 MiB: 6 replies, and one more per thread admitted meanwhile.
        assert 6 <= len(kept) <= 6 + serving.SERVER_THREADS
        assert service._replies.bytes_out == len(kept) * (reply_bytes + serving.CALL_BYTES)
        assert service.unread_replies == {"refused": calls - len(kept), "cancelled": 0}
        assert _raw_call(address, "Weights", wire.VERSION.pack(-1)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        clock[0] = serving.REPLY_DELIVERY_SECS + 1
        # Late now: the next call cancels them, and its reply is read.
        assert len(_raw_call(address, "Weights", wire.VERSION.pack(-1))) == reply_bytes
        assert service.unread_replies == {"refused": calls - len(kept) + 1, "cancelled": len(kept)}
        wait_until(lambda: kept <= caller.ended, 10, lambda: caller.ended)
        wait_until(lambda: service._replies.bytes_out == 0, 10, service.unread_replies)


def test_a_call_refused_for_room_has_done_nothing(make_service, monkeypatch):
    """Refused before its method runs: a chunk refused after it was queued would be queued
    again when its actor tries again."""
    monkeypatch.setattr(serving, "MAX_REPLY_BYTES_OUT", 2 * serving.CALL_BYTES)
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, variables=[tf.Variable(tf.ones([6]))])
    service.publish_weights(1)
    client = _client(address, spec)  # its Hello, while there is room
    caller, _ = _unread_calls(address, "Weights", wire.VERSION.pack(-1), 1)
    with caller:
        wait_until(lambda: len(service._replies._out) == 1, 10, service.unread_replies)
        unroll = _unroll(spec, 2, np.random.default_rng(0), weight_version=1)
        assert _raw_call(address, "Enqueue", _chunk(unroll)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert service.queue_size == 0 and service.trajectories_received == 0
    wait_until(lambda: service._replies.bytes_out == 0, 10, service.unread_replies)
    client.send(unroll)
    assert service.queue_size == 2
    client.close()


def test_an_actor_refused_for_room_tries_again_and_reconnects_after_its_deadline(
    make_service, monkeypatch
):
    """While unread replies fill the budget an actor's fetch is refused; it tries again with
    growing pauses, gets the weights once room is made, and past its call's deadline reports
    the learner unreachable (the actor loop reconnects) rather than failing for good."""
    monkeypatch.setattr(serving, "MAX_REPLY_BYTES_OUT", 2 * serving.CALL_BYTES + 64)
    variables = [tf.Variable(tf.ones([6]))]  # replies of 32 bytes
    service, address = make_service(_lstm_spec(), variables=variables)
    service.publish_weights(3)
    client = ActorClient(
        address, 0, _lstm_spec(), IDENTITY, variables, timeout_secs=3.0, secret=SECRET
    )
    caller, _ = _unread_calls(address, "Weights", wire.VERSION.pack(-1), 2)
    with caller:
        wait_until(lambda: len(service._replies._out) == 2, 10, service.unread_replies)
        try:
            started = time.monotonic()
            with pytest.raises(LearnerUnreachableError, match="too busy to answer Weights"):
                client.fetch_weights()
            assert 1 < time.monotonic() - started < 6  # the last pause would pass 3 s
            assert service.unread_replies["refused"] >= 4  # tried again
            threading.Timer(0.3, caller.close).start()  # the unread calls end: room
            _, version = client.fetch_weights()
            assert version == 3
        finally:
            client.close()


def test_small_replies_a_caller_never_reads_are_held_within_the_budget_too(
    make_service, monkeypatch
):
    """An unread call of a few bytes keeps about 21 KiB in gRPC: up to 1,024 connections of
    32 streams of them would be most of a GiB."""
    reply_bytes = wire.VERSION.size
    monkeypatch.setattr(serving, "MAX_REPLY_BYTES_OUT", 20 * (reply_bytes + serving.CALL_BYTES))
    service, address = make_service(_lstm_spec())
    callers = [_unread_calls(address, "WeightsVersion", b"", 15)[0] for _ in range(2)]
    try:
        wait_until(
            lambda: sum(len(caller.ended) for caller in callers) == 10,
            10,
            lambda: f"ended {[caller.ended for caller in callers]}, {service.unread_replies}",
        )
        assert service.unread_replies == {"refused": 10, "cancelled": 0}
        assert _raw_call(address, "WeightsVersion", b"") == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for caller in callers:
            caller.close()
    wait_until(lambda: service._replies.bytes_out == 0, 10, service.unread_replies)
    assert _raw_call(address, "WeightsVersion", b"") == wire.VERSION.pack(-1)


# ---- Population-based training's calls -------------------------------------------------------


def test_policy_state_calls_beyond_two_are_answered_at_once_so_the_actors_keep_their_threads(
    make_service,
):
    """A caller holding the secret sends many `PolicyState` calls at once with a plain grpcio
    client: two wait for the next snapshot, the rest get b'' at once (were all to wait, they
    would hold the server's threads that the actors' calls need for the learner to step), and
    the two waiting get the snapshot the learner then takes."""
    service, address = make_service(_lstm_spec())
    service.publish_status(b'{"policy": 0}')  # in a population from now on
    connection = grpc.insecure_channel(address)
    policy_state = connection.unary_unary("/impala.Learner/PolicyState")
    metadata = ((wire.SECRET_KEY, SECRET),)
    try:
        with futures.ThreadPoolExecutor(6) as pool:
            calls = [
                pool.submit(policy_state, b"", metadata=metadata, timeout=30) for _ in range(6)
            ]
            deadline = time.monotonic() + 10
            while sum(call.done() for call in calls) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sum(call.done() for call in calls) == 4
            assert all(call.result() == b"" for call in calls if call.done())
            assert service.state_wanted
            # The actors' calls still find threads while the two wait.
            _client(address, _lstm_spec()).send(_unroll(_lstm_spec(), 2, np.random.default_rng(5)))
            service.publish_state(b"the snapshot")
            replies = sorted(call.result(timeout=10) for call in calls)
        assert replies == [b""] * 4 + [b"the snapshot"] * 2
    finally:
        connection.close()


# ---- The run secret -------------------------------------------------------------------------


def _raw_call(address, method, request, secret=SECRET):
    """A call of our own, as anyone who reaches the port could make one: the reply, or the
    gRPC status it ended with."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(wire.method_path(method))
        metadata = () if secret is None else ((wire.SECRET_KEY, secret),)
        try:
            return call(request, metadata=metadata, timeout=CLIENT_TIMEOUT_SECS)
        except grpc.RpcError as error:
            return error.code()


def _chunk(unroll, task=0, envs=slice(None)):
    """An `Enqueue` request for `unroll`'s trajectories `envs`, from actor `task`."""
    return wire.encode_enqueue(
        task,
        unroll.weight_version,
        Steps(*(field[:, envs] for field in unroll.steps)),
        [state[envs] for state in unroll.agent_state],
    )


def _refused(service, reason):
    return service.refusals[reason]


@pytest.mark.parametrize(
    "secret",
    ["", "5e" * 31 + "5f", "5E" * 32, "5e" * 32 + "00", "x", "5e" * 16],
    ids=["empty", "last-digit", "upper-case", "longer", "short", "prefix"],
)
def test_a_client_without_the_run_secret_is_refused_on_connecting(make_service, secret):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    with pytest.raises(AuthenticationError, match="refused this actor's run secret"):
        _client(address, spec, secret=secret)
    assert _refused(service, "wrong secret") == 1
    assert sum(service.refusals.values()) == 1
    assert service.connections == {}


def test_without_the_secret_no_method_gives_weights_or_takes_data(make_service):
    """Every method, called by a stranger: nothing read, nothing queued, every call counted."""
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    variables = [tf.Variable(np.arange(6, dtype=np.float32))]
    service, address = make_service(spec, variables)
    service.publish_weights(7)
    unroll = _unroll(spec, 2, np.random.default_rng(20))
    episode = wire.encode_episodes(0, [21.0], [10], [40], [3])
    hello = wire.encode_hello(0, IDENTITY)
    calls = [
        ("WeightsVersion", b""),
        ("Weights", wire.VERSION.pack(-1)),
        ("Enqueue", _chunk(unroll)),
        ("ReportEpisodes", episode),
        ("Hello", hello),
        ("Room", wire.TASK.pack(0)),
        ("NoSuchMethod", b""),  # not even whether a method exists
    ]
    for secret in (None, "0" * 64):
        for method, request in calls:
            assert _raw_call(address, method, request, secret) == grpc.StatusCode.UNAUTHENTICATED
    assert service.queue_size == 0 and service.trajectories_received == 0
    assert len(service.pop_episodes().episode_return) == 0
    assert service.connections == {}
    assert _refused(service, "wrong secret") == 2 * len(calls)
    assert sum(service.refusing_hosts.values()) == 2 * len(calls)

    # The same calls with the secret work: the refusals were about the secret alone. (Its
    # trajectories once it has said hello, as every actor does before it sends any.)
    assert _raw_call(address, "WeightsVersion", b"") == wire.VERSION.pack(7)
    assert len(_raw_call(address, "Weights", wire.VERSION.pack(-1))) == 8 + 6 * 4
    assert _status(_raw_call(address, "Room", wire.TASK.pack(0))) == ACCEPTED
    assert _status(_raw_call(address, "Enqueue", _chunk(unroll))) == UNKNOWN_ACTOR
    assert _raw_call(address, "Hello", hello) == b""
    assert _status(_raw_call(address, "Enqueue", _chunk(unroll))) == ACCEPTED
    assert _status(_raw_call(address, "ReportEpisodes", episode)) == ACCEPTED
    assert _raw_call(address, "NoSuchMethod", b"") == grpc.StatusCode.UNIMPLEMENTED
    assert service.queue_size == 2
    assert service.pop_episodes().episode_return.tolist() == [21.0]


def _tampered(unroll, **steps):
    return unroll._replace(steps=unroll.steps._replace(**steps))


def _bad_unrolls(spec, rng):
    """(reason, unroll) pairs a learner must refuse, each bad in one way only."""
    good = _unroll(spec, 2, rng)
    steps = good.steps
    action_high = steps.action.copy()
    action_high[3, 1] = spec.num_actions
    action_negative = steps.prev_action.copy()
    action_negative[0, 0] = -1
    reward_nan = steps.reward.copy()
    reward_nan[2, 0] = np.nan
    reward_inf = steps.reward.copy()
    reward_inf[1, 1] = -np.inf
    logits_nan = steps.policy_logits.copy()
    logits_nan[4, 1, 2] = np.nan
    state_inf = tuple(s.copy() for s in good.agent_state)
    state_inf[0][1, 0] = np.inf
    return [
        ("action out of range", _tampered(good, action=action_high)),
        ("action out of range", _tampered(good, prev_action=action_negative)),
        ("non-finite value", _tampered(good, reward=reward_nan)),
        ("non-finite value", _tampered(good, reward=reward_inf)),
        ("non-finite value", _tampered(good, policy_logits=logits_nan)),
        ("non-finite value", good._replace(agent_state=state_inf)),
        # Observations of the wrong size: the learner could not reshape them.
        ("malformed", _tampered(good, observation=steps.observation[..., :2])),
        # Fields that disagree on how many trajectories there are.
        ("malformed", _tampered(good, reward=steps.reward[:, :1])),
        ("malformed", good._replace(agent_state=tuple(s[:1] for s in good.agent_state))),
        ("negative weight version", good._replace(weight_version=-5)),
    ]


def test_bad_trajectories_are_refused_counted_and_the_learner_goes_on(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    client = _client(address, spec)
    rng = np.random.default_rng(21)
    bad = _bad_unrolls(spec, rng)
    for count, (reason, unroll) in enumerate(bad, start=1):
        before = service.refusals[reason]
        client.send(unroll)
        assert client.refused_chunks == count, reason
        assert service.refusals[reason] == before + 1, reason
        assert service.queue_size == 0, reason
    expected = {reason: sum(r == reason for r, _ in bad) for reason in REFUSAL_REASONS}
    expected["wrong secret"] = 0
    assert service.refusals == expected

    good = _unroll(spec, 2, rng)
    client.send(good)
    _assert_same_trajectories(service.dequeue(2), good)


def test_trajectories_and_episodes_of_another_learners_actor_are_refused(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, learner_index=1, num_learners=2)
    # An insider: knows the secret, lies about its task.
    unroll = _unroll(spec, 1, np.random.default_rng(22))
    for task in (0, 2, -1):
        assert _status(_raw_call(address, "Enqueue", _chunk(unroll, task))) == REFUSED
        episode = wire.encode_episodes(task, [1.0], [1], [4], [1])
        assert _status(_raw_call(address, "ReportEpisodes", episode)) == REFUSED
    assert service.refusals["actor task not this learner's"] == 6
    assert service.queue_size == 0 and len(service.pop_episodes().episode_return) == 0


@pytest.mark.parametrize(
    "returns, steps, frames, starts, reason",
    [
        ([np.nan], [1], [4], [1], "non-finite value"),
        ([np.inf, 1.0], [1, 1], [4, 4], [1, 1], "non-finite value"),
        ([1.0], [-1], [4], [1], "malformed"),
        ([1.0], [1], [-4], [1], "malformed"),
        ([1.0, 2.0], [1], [4, 4], [1, 1], "malformed"),
        ([1.0], [1], [4], [-2], "malformed"),
        ([1.0, 2.0], [1, 1], [4, 4], [1], "malformed"),
    ],
)
def test_bad_episode_reports_are_refused(make_service, returns, steps, frames, starts, reason):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    episode = wire.encode_episodes(0, returns, steps, frames, starts)
    assert _status(_raw_call(address, "ReportEpisodes", episode)) == REFUSED
    assert service.refusals[reason] == 1
    assert len(service.pop_episodes().episode_return) == 0


def test_a_learner_refuses_a_secret_that_is_not_one(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    with pytest.raises(ValueError, match="64 characters"):
        LearnerService(_free_address(), spec, IDENTITY, [], 0, 1, 8, secret="short")


# ---- Listening ------------------------------------------------------------------------------


def test_a_second_learner_on_a_busy_port_fails_at_start(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    _, address = make_service(spec)
    with pytest.raises(ValueError, match=f"cannot listen at {address}: port .* is in use"):
        LearnerService(address, spec, IDENTITY, [], 0, 1, 8, secret=SECRET)


@pytest.mark.parametrize(
    "address, message",
    [
        ("192.0.2.1:8001", "is 192.0.2.1 an address of this host"),  # TEST-NET-1: not ours
        ("no-such-host.invalid:8001", "does not resolve"),
        ("localhost:0", "not host:port"),
        ("localhost:65536", "not host:port"),
        ("localhost", "not host:port"),
        ("-oProxyCommand=x:8001", "not a host name or address"),
        ("local host:8001", "not a host name or address"),
        ("::1:8001", r"an IPv6 address takes brackets, as in \[::1\]:8001"),
        ("localhost:\u0668", "not host:port"),  # an Arabic-Indic 8: a digit to str.isdigit
        ("localhost:" + "9" * 5000, "not host:port"),
        ("[::1]]:8001", "the brackets hold one IPv6 address"),
        ("[localhost:8001", "the brackets hold one IPv6 address"),
    ],
)
def test_an_address_that_cannot_be_listened_on_is_a_one_line_error(address, message):
    with pytest.raises(ValueError, match=message) as raised:
        check_listening_address(address)
    assert "\n" not in str(raised.value)


def test_the_learner_counts_each_actors_connections(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, learner_index=1, num_learners=2)
    assert service.connections == {}
    for task in (1, 3, 1, 1):
        _client(address, spec, actor_task=task)
    with pytest.raises(MismatchError):
        _client(address, spec, actor_task=2)  # another learner's: not counted
    with pytest.raises(AuthenticationError):
        _client(address, spec, actor_task=3, secret="0" * 64)  # a stranger: not counted
    assert service.connections == {1: 3, 3: 1}


# ---- TLS ------------------------------------------------------------------------------------


def test_over_tls_an_actor_with_the_runs_bundle_sends_and_fetches(tmp_path):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    material = run_tls.create(str(tmp_path / "tls.pem"))
    other_run = run_tls.create(str(tmp_path / "other.pem"))
    variables = [tf.Variable(np.arange(4, dtype=np.float32))]
    address = _free_address()
    service = LearnerService(
        address, spec, IDENTITY, variables, 0, 1, 8, secret=SECRET, tls=material
    )
    try:
        service.publish_weights(2)
        client = ActorClient(
            address, 0, spec, IDENTITY, variables, timeout_secs=5.0, secret=SECRET, tls=material
        )
        unroll = _unroll(spec, 2, np.random.default_rng(40))
        client.send(unroll)
        _assert_same_trajectories(service.dequeue(2), unroll)
        assert client.fetch_weights()[1] == 2
        # Plain TCP to a learner serving TLS, and another run's certificate: no learner there.
        for tls, hint in [(None, "answers only actors given it too"), (other_run, "over TLS")]:
            with pytest.raises(LearnerUnreachableError, match=hint):
                ActorClient(
                    address, 0, spec, IDENTITY, variables, timeout_secs=1.0, secret=SECRET, tls=tls
                )
        assert service.connections == {0: 1}
    finally:
        service.stop()


def test_synchronous_collection_queues_only_trajectories_of_the_published_version(make_service):
    """--col_workers_communication=synchronous: a chunk acted with other weights than those
    published is dropped on arrival (the actor hears it accepted, and acts again with the next
    weights), and new weights drop what is still queued: the learner trains at lag 0 only."""
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec, synchronous=True)
    client = _client(address, spec)
    rng = np.random.default_rng(3)
    service.publish_weights(4)
    client.send(_unroll(spec, 2, rng, weight_version=3))  # acted before the last step
    assert (service.queue_size, service.stale_trajectories) == (0, 2)
    assert client.refused_chunks == 0
    client.send(_unroll(spec, 3, rng, weight_version=4))
    assert (service.queue_size, service.stale_trajectories) == (3, 2)
    service.publish_weights(5)  # the three queued were acted with version 4: stale now
    assert (service.queue_size, service.stale_trajectories) == (0, 5)
    client.send(_unroll(spec, 2, rng, weight_version=5))
    queued = service.dequeue(2)
    assert list(np.asarray(queued.weight_version)) == [5, 5]
    assert service.trajectories_received == 5  # the ones admitted; the late two never were


def test_asynchronous_collection_queues_every_version(make_service):
    spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
    service, address = make_service(spec)
    client = _client(address, spec)
    rng = np.random.default_rng(4)
    service.publish_weights(4)
    client.send(_unroll(spec, 2, rng, weight_version=1))
    service.publish_weights(5)
    assert (service.queue_size, service.stale_trajectories) == (2, 0)


# A stranger's HTTP/2 connection, by hand: the client preface and an empty SETTINGS frame
# (RFC 9113 3.4, 6.5); the server answers with its own SETTINGS, acknowledged as a client does.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
_SETTINGS_ACK = bytes.fromhex("000000040100000000")


def _closed_by_server(connection: socket.socket, secs: float) -> bool:
    """Whether the server closes `connection` within `secs` (whatever it sends first)."""
    connection.settimeout(secs)
    deadline = time.monotonic() + secs
    try:
        while time.monotonic() < deadline:
            if connection.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_connections_past_the_cap_idle_or_never_set_up_are_closed(monkeypatch):
    """A stranger who opens connections and holds them, set up and idle or with no handshake
    at all, keeps none past its time, and none past the cap at once."""
    monkeypatch.setattr(serving, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(serving, "IDLE_CONNECTION_MS", 5000)
    monkeypatch.setattr(serving, "HANDSHAKE_MS", 5000)
    (port,) = free_ports(1)
    server = serving.serve(
        f"127.0.0.1:{port}",
        {wire.method_path("WeightsVersion"): lambda request, context: b"ok"},
        Authenticator(SECRET, lambda: None),
        1 << 20,
    )
    try:
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
        for connection in held:
            connection.sendall(_HTTP2_PREFACE)
        time.sleep(0.5)
        answered = []
        for connection in held:
            connection.settimeout(2)
            with contextlib.suppress(ConnectionResetError):
                first = connection.recv(9)
                if first[3:4] == b"\x04":  # the server's SETTINGS
                    connection.sendall(_SETTINGS_ACK)
                    answered.append(connection)
        # The cap's 4 were set up; the 2 past it were closed as they were accepted.
        assert len(answered) == 4
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)
        # Idle (no call under way) or silent (no preface): closed after their time, not before.
        assert not any(_closed_by_server(connection, 0.1) for connection in answered)
        assert all(_closed_by_server(connection, 10) for connection in answered)
        assert _closed_by_server(silent, 10)
        # Then a caller gets in again.
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            path = wire.method_path("WeightsVersion")
            reply = channel.unary_unary(path)(b"", metadata=((wire.SECRET_KEY, SECRET),))
        assert reply == b"ok"
        for connection in (*held, silent):
            connection.close()
    finally:
        server.stop(None)


def test_a_servers_connection_cap_leaves_half_the_open_file_limit_to_the_process(monkeypatch):
    limits = {"soft": 256}
    unlimited = serving.resource.RLIM_INFINITY
    monkeypatch.setattr(serving.resource, "getrlimit", lambda which: (limits["soft"], unlimited))
    assert serving.connection_cap() == 128
    assert serving.connection_cap(2) == 64  # a name that resolves to IPv4 and IPv6 addresses
    limits["soft"] = 1 << 20
    assert serving.connection_cap() == serving.MAX_CONNECTIONS
    limits["soft"] = unlimited
    assert serving.connection_cap() == serving.MAX_CONNECTIONS


def test_refusals_from_many_hosts_are_logged_within_a_bound_and_summed_up(monkeypatch, caplog):
    """A stranger with a network of addresses (an IPv6 /64) calls from a new one each time: the
    learner logs at most its lines a minute and keeps at most its hosts a minute, then sums up
    the rest in one line."""
    from impala.transport import authentication

    now = [1000.0]
    monkeypatch.setattr(authentication.time, "monotonic", lambda: now[0])
    authenticator = Authenticator(SECRET, lambda: None)
    caplog.set_level("WARNING", logger=authentication.__name__)
    logged = [authenticator._record("ipv4:10.0.0.1") for _ in range(8)]
    assert logged == [True] * authentication.LOGGED_REFUSALS_PER_MINUTE + [False] * 3
    hosts = [f"ipv6:[2001:db8::{n:x}]" for n in range(5000)]
    logged = sum(authenticator._record(host) for host in hosts)
    assert logged == authentication.LOGGED_LINES_PER_MINUTE - 5
    assert len(authenticator._minute) == authentication.MAX_HOSTS_A_MINUTE
    assert len(authenticator.by_host()) <= authentication.MAX_ACTOR_TASKS + 1
    now[0] += 61
    caplog.clear()
    assert authenticator._record("ipv4:10.0.0.1")  # a new minute: logged again
    (summary,) = [record.getMessage() for record in caplog.records]
    assert summary == (
        f"refused {8 + 5000 - 60} more calls without the run secret in the minute that began "
        f"61 s ago, from {authentication.MAX_HOSTS_A_MINUTE} hosts and more hosts (most from "
        "ipv4:10.0.0.1: 8 in all)"
    )
    assert len(authenticator._minute) == 1
    # A learner that stops sums up its last minute, which no later refusal would.
    logged = [authenticator._record("ipv4:10.0.0.1") for _ in range(6)]
    assert logged == [True] * (authentication.LOGGED_REFUSALS_PER_MINUTE - 1) + [False] * 2
    now[0] += 10
    caplog.clear()
    authenticator.sum_up()
    authenticator.sum_up()  # nothing left to say
    assert [record.getMessage() for record in caplog.records] == [
        "refused 2 more calls without the run secret in the minute that began 10 s ago, from 1 "
        "host (most from ipv4:10.0.0.1: 7 in all)"
    ]


class _Impostor(grpc.GenericRpcHandler):
    """Whoever holds a learner's address without TLS: answers every call with `answer`."""

    def __init__(self, answer: bytes):
        self._answer = answer

    def service(self, handler_call_details):
        return grpc.unary_unary_rpc_method_handler(lambda request, context: self._answer)


@pytest.mark.parametrize(
    "answer",
    [
        b"\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x1b[Hlearner ready",
        b'MISMATCH:{"\\u001b[2Jlevel_name": "\\u001b[1A\\r"}',
        b"MISMATCH:[1, 2, \x1b[2J",
    ],
    ids=["its own words", "a made-up identity", "no identity"],
)
def test_what_an_impostor_learner_says_reaches_the_actors_log_printable(answer):
    address = _free_address()
    server = grpc.server(futures.ThreadPoolExecutor(1), handlers=[_Impostor(answer)])
    server.add_insecure_port(address)
    server.start()
    try:
        with pytest.raises(MismatchError) as raised:
            _client(address, _lstm_spec())
    finally:
        server.stop(None)
    message = str(raised.value)
    assert all(char.isprintable() for char in message), repr(message)
    assert f"learner at {address}" in message or f"at learner {address}" in message


class _Player:
    """The environments and the policy of an actor (`Actor`'s interface) as a stand-in: its
    first unroll beyond what the loss takes (refused), then `_unroll`s. `on_refused` runs as the
    refused unroll is made. Records the version that decided each unroll's first step."""

    def __init__(self, spec, rng, on_refused=lambda: None):
        self.spec, self.rng, self.on_refused = spec, rng, on_refused
        self.weight_version = self.first_step_version = -1
        self.unrolls = 0
        self.first_steps = []  # (first step's version, the unroll's version) of each unroll

    def set_weights(self, weights, version):
        self.weight_version = version

    def decide_first_step_again(self):
        self.first_step_version = self.weight_version

    def unroll(self):
        self.unrolls += 1
        self.first_steps.append((self.first_step_version, self.weight_version))
        self.first_step_version = self.weight_version
        unroll = _unroll(self.spec, 2, self.rng, weight_version=self.weight_version)
        if self.unrolls == 1:
            unroll.steps.policy_logits[...] = 1e6  # beyond what the loss takes: refused
            self.on_refused()
        return unroll

    def pop_episode_stats(self):
        return []


class _SynchronousActing:
    """`loop._act` of a synchronous-collection actor, in a thread, on `_Player`'s unrolls, for a
    learner's service that has published version 0; `on_refused(service)` runs as the first
    (refused) unroll is made."""

    def __init__(self, make_service, seed, on_refused=lambda service: None):
        from impala.actor import loop

        spec = _lstm_spec(observation_shape=(3,), observation_dtype="float32")
        self.service, address = make_service(
            spec, [tf.Variable(np.ones(3, np.float32))], synchronous=True
        )
        self.service.publish_weights(0)
        self.client = _client(address, spec, variables=[tf.Variable(np.zeros(3, np.float32))])
        rng = np.random.default_rng(seed)
        self.player = _Player(spec, rng, on_refused=lambda: on_refused(self.service))
        config = types.SimpleNamespace(
            task=0, learner_address=address, num_envs=2, synchronous_collection=True
        )
        self.failed = []

        def act():
            try:
                loop._act(self.client, self.player, loop._Counts(), config, lambda line: None)
            except LearnerFinishedError:
                pass
            except Exception as error:  # said by the test, not lost in the thread
                self.failed.append(error)

        self.thread = threading.Thread(target=act, daemon=True)
        self.thread.start()

    def wait_until(self, condition):
        deadline = time.monotonic() + 20
        while not condition() and not self.failed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not self.failed, self.failed
        assert condition(), "not within 20 s"

    def stop(self):
        self.service.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_a_synchronous_actor_whose_unroll_was_refused_acts_again_with_the_same_weights(
    make_service,
):
    """Synchronous collection: an unroll the learner refused takes no place in its round, so
    the actor acts again with the weights it holds, rather than wait for weights that the
    learner, one unroll short, would never publish."""
    acting = _SynchronousActing(make_service, seed=5)
    acting.wait_until(lambda: acting.service.queue_size >= 2)
    # The first unroll refused, the second (the same weights, version 0) queued; then the actor
    # waits for version 1.
    assert acting.client.refused_chunks == 1 and acting.service.queue_size == 2
    assert acting.player.unrolls == 2 and acting.player.weight_version == 0
    # Decided by version 0, not by the weights before the first fetch.
    assert acting.player.first_steps == [(0, 0), (0, 0)]
    acting.stop()


def test_a_synchronous_actor_decides_the_first_step_again_whenever_newer_weights_came(
    make_service,
):
    """Synchronous collection, lag 0 on every step: weights newer than those that decided the
    next unroll's first step, fetched after a refused unroll (no wait for the next version) as
    after a wait, have that step decided again before the unroll takes its action."""
    # The learner moves on to version 1 while the first (refused) unroll is acted.
    acting = _SynchronousActing(make_service, 6, lambda service: service.publish_weights(1))
    acting.wait_until(lambda: acting.service.queue_size >= 2)
    assert acting.client.refused_chunks == 1 and acting.service.queue_size == 2
    # The refused unroll by version 0; the next by version 1 on every step, its first too.
    assert acting.player.first_steps == [(0, 0), (1, 1)]
    acting.service.publish_weights(2)  # after a wait for the next version, the same
    acting.wait_until(lambda: acting.player.unrolls >= 3)
    assert acting.player.first_steps[2] == (2, 2)
    acting.stop()
