"""The learner's trajectory store: what any `TrajectoryStore` is asked, and the registry."""

import gc

import numpy as np
import pytest
import tensorflow as tf

from impala import trajectory_store
from impala.trajectory_store import FifoStore, TrajectoryStore

SPECS = [tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.float32)]


def _chunk(first, count):
    ids = tf.range(first, first + count)
    return [ids, tf.cast(tf.stack([ids, -ids], axis=1), tf.float32)]


def test_fifo_store_admits_while_not_full_and_hands_out_in_order():
    # What any `TrajectoryStore` is asked, run as the service runs it: inside tf.functions.
    # Earlier tests' RPC futures are collected first: a future collected while a function is
    # traced puts its deletion into that function's graph, which then fails when run twice.
    gc.collect()
    store = FifoStore(SPECS, capacity=3)
    admit, take = tf.function(store.admit), tf.function(store.take)

    assert store.capacity == 3
    assert bool(admit(_chunk(0, 2)))
    assert bool(admit(_chunk(2, 2)))  # 2 of 3: let in whole, passing the capacity by one
    assert int(store.size()) == 4
    assert not bool(admit(_chunk(4, 1)))  # full: refused at once, nothing stored
    assert int(store.size()) == 4
    assert not bool(tf.function(store.has_room)())

    ids, values = take(tf.constant(3))
    assert ids.numpy().tolist() == [0, 1, 2]
    assert bool(store.has_room())
    np.testing.assert_array_equal(values.numpy(), [[0, 0], [1, -1], [2, -2]])
    assert bool(admit(_chunk(4, 1)))
    store.close()
    # What was stored before closing can still be taken, and no more.
    assert take(tf.constant(2))[0].numpy().tolist() == [3, 4]
    with pytest.raises(tf.errors.OutOfRangeError):
        take(tf.constant(1))


def test_make_store_builds_the_default_store_by_name_with_its_capacity():
    store = trajectory_store.make_store(trajectory_store.DEFAULT_STORE, SPECS, 7)
    assert isinstance(store, FifoStore) and isinstance(store, TrajectoryStore)
    assert store.capacity == 7 and int(store.size()) == 0
    assert all(issubclass(kind, TrajectoryStore) for kind in trajectory_store.STORES.values())


def test_make_store_refuses_an_unknown_kind_in_one_line():
    with pytest.raises(ValueError, match=r"^trajectory store 'replay': not one of fifo$"):
        trajectory_store.make_store("replay", SPECS, 7)
