"""Population-based training's rule (`impala/learner/pbt.py`) and what a learner accepts from
another policy's (`impala/learner/population.py`): statuses and states as a hostile peer could
send them."""

import contextlib
import dataclasses
import json
import os
import random
from concurrent import futures

import grpc
import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

from impala.configs import PbtConfig
from impala.learner import pbt, population
from impala.transport import wire

HYPERPARAMETERS = {"learning_rate": 2.5e-4, "entropy_cost": 0.01}


def _status(policy, objective, games=50, hyperparameters=HYPERPARAMETERS):
    return pbt.Status(policy, 1000, games, objective, dict(hyperparameters), 0)


def _decide(me, *others, seed=0, **settings):
    config = PbtConfig(with_pbt=True, **settings)
    return pbt.decide(me, others, config, random.Random(seed))


def test_the_worst_copies_one_of_the_best_when_the_gap_is_real():
    # Four policies at 0.3: ceil(1.2) = 2 best and 2 worst.
    others = [_status(1, 15.0), _status(2, 10.0), _status(3, 0.0)]
    decision = _decide(_status(0, -20.0), *others)
    assert decision.action == pbt.REPLACE and decision.donor in (1, 2)
    assert decision.ranking == (1, 2, 3, 0)
    # Every donor the draw can give is among the best two.
    donors = {_decide(_status(0, -20.0), *others, seed=seed).donor for seed in range(40)}
    assert donors == {1, 2}
    # The best keep everything; the middle does not exist here (2 + 2 = 4): policy 3 is worst.
    assert _decide(_status(1, 15.0), _status(0, -20.0), others[1], others[2]).action == pbt.KEEP
    assert _decide(_status(3, 0.0), _status(0, -20.0), *others[:2]).action == pbt.REPLACE


def test_a_gap_within_the_threshold_mutates_instead_and_holds_for_negative_returns():
    # Pong's returns are negative for a long time: -19 against -20 is a gap of 1.0, not more
    # than max(1.0, 0.1 x 19); -15 against -20 is (5.0 > max(1.0, 0.1 x 15)).
    assert _decide(_status(0, -20.0), _status(1, -19.0)).action == pbt.MUTATE
    replaced = _decide(_status(0, -20.0), _status(1, -15.0))
    assert replaced.action == pbt.REPLACE and "by 5.00 > 1.50" in replaced.why
    # Relative to the donor's own size: 18 against 17.5 is not a gap at 10%.
    assert _decide(_status(0, 17.5), _status(1, 18.0)).action == pbt.MUTATE
    near_zero = _decide(
        _status(0, -0.5), _status(1, 0.0), replace_reward_gap_absolute=0.1
    )  # 0.5 > max(0.1, 0.1 x 0)
    assert near_zero.action == pbt.REPLACE


def test_policies_too_new_to_be_ranked_sit_out_or_are_left_out():
    assert _decide(_status(0, None, games=5), _status(1, 10.0)).action == pbt.SIT_OUT
    alone = _decide(_status(0, 3.0), _status(1, None, games=2))
    assert alone.action == pbt.SIT_OUT and alone.ranking == (0,)
    assert pbt.objective([1.0] * 11, 50) is None  # fewer than a quarter of 50
    assert pbt.objective([0.0] * 40 + [1.0] * 20, 50) == pytest.approx(20 / 50)


def test_ties_rank_the_lower_index_first_and_the_middle_mutates():
    statuses = [_status(k, 1.0 if k else 5.0) for k in range(6)]  # 6 x 0.3: 2 best, 2 worst
    decision = _decide(statuses[2], *(s for s in statuses if s.policy != 2))
    assert decision.ranking == (0, 1, 2, 3, 4, 5)
    assert decision.action == pbt.MUTATE and "neither among the best nor the worst" in decision.why


def test_perturbing_multiplies_or_divides_within_the_range_and_keeps_the_bounds():
    config = PbtConfig(with_pbt=True, mutation_rate=1.0, perturb_min=1.2, perturb_max=1.5)
    rng = random.Random(1)
    ratios = []
    for _ in range(200):
        changed = pbt.perturb(HYPERPARAMETERS, config, rng)
        ratios += [changed[name] / HYPERPARAMETERS[name] for name in HYPERPARAMETERS]
    up = [r for r in ratios if r > 1]
    down = [r for r in ratios if r < 1]
    assert all(1.2 <= r <= 1.5 for r in up) and all(1 / 1.5 <= r <= 1 / 1.2 for r in down)
    assert 0.35 < len(up) / len(ratios) < 0.65
    # Never perturbed at rate 0; kept within the tuned range at its edge.
    never = PbtConfig(with_pbt=True, mutation_rate=0.0)
    assert pbt.perturb(HYPERPARAMETERS, never, rng) == HYPERPARAMETERS
    edge = {"learning_rate": 1e-2, "entropy_cost": 0.1}
    for _ in range(20):
        bounded = pbt.perturb(edge, config, rng)
        assert bounded["learning_rate"] <= 1e-2 and bounded["entropy_cost"] <= 0.1


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"policy": 1}',
        json.dumps({**_status(1, 1.0).__dict__, "policy": 2}).encode(),  # another policy
        json.dumps({**_status(1, 1.0).__dict__, "objective": "NaN"}).encode(),
        json.dumps({**_status(1, 1.0).__dict__, "frames": -1}).encode(),
        json.dumps({**_status(1, 1.0).__dict__, "games": True}).encode(),
        json.dumps(
            {**_status(1, 1.0).__dict__, "hyperparameters": {"learning_rate": 1.0}}
        ).encode(),
        json.dumps(
            {**_status(1, 1.0).__dict__, "hyperparameters": {**HYPERPARAMETERS, "x": 1}}
        ).encode(),
    ],
)
def test_a_status_that_is_not_a_sound_one_of_the_policy_asked_is_left_out(answer):
    assert pbt.Status.decode(answer, 1) is None


def test_a_status_round_trips():
    status = _status(3, -2.5)
    assert pbt.Status.decode(status.encode(), 3) == status
    assert pbt.Status.decode(_status(3, None, games=1).encode(), 3).objective is None


class _Trainer:
    def __init__(self, optimizer=None):
        from impala.learner.optimise import Hyperparameters

        self.hyperparameters = Hyperparameters(**HYPERPARAMETERS)
        self.optimizer = optimizer or snt.optimizers.Adam(1e-3)

    def set_hyperparameters(self, **values):
        self.hyperparameters = dataclasses.replace(self.hyperparameters, **values)


def _variables():
    return [
        tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3)),
        tf.Variable(np.int64(7)),
    ]


def _state_of(variables, policy=1):
    config = _config(policy)
    member = population.Population(config, _Trainer(), variables, "", False, print, "0" * 64)
    return member._encode_state(1234)


def _config(policy):
    from impala.configs import LearnerJobConfig

    return LearnerJobConfig(
        num_policies=2,
        policy_index=policy,
        experiment="run",
        secret_file="s",
        pbt=PbtConfig(with_pbt=True),
        policy_hosts=("localhost:1", "localhost:2"),
    )


def test_a_state_round_trips_into_variables_of_the_same_shapes_and_dtypes():
    data = _state_of(_variables())
    header, arrays = population.decode_state(data, 1, _variables())
    assert header["frames"] == 1234 and header["hyperparameters"] == HYPERPARAMETERS
    assert np.array_equal(arrays[0], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert arrays[1].dtype == np.int64 and int(arrays[1]) == 7


def _with_header(data, **changes):
    (size,) = wire.STATE_HEADER.unpack_from(data)
    header = json.loads(data[4 : 4 + size]) | changes
    encoded = json.dumps(header).encode()
    return wire.STATE_HEADER.pack(len(encoded)) + encoded + data[4 + size :]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d[:2], "too short for its header"),
        (lambda d: wire.STATE_HEADER.pack(1 << 30) + d[4:], "a header of 1073741824 bytes"),
        (lambda d: d[:4] + b"\xff" * (len(d) - 4), "its header does not describe"),
        (lambda d: _with_header(d, policy=0), "its header does not describe"),
        (lambda d: _with_header(d, variables=[[[3, 2], "float32"], [[], "int64"]]), "describe"),
        (lambda d: _with_header(d, hyperparameters={"learning_rate": 5.0}), "describe"),
        (lambda d: _with_header(d, frames=-3), "its header does not describe"),
        (lambda d: d[:-1], "fewer than its variables take"),
        (lambda d: d + b"\0", "1 bytes more than its variables take"),
    ],
)
def test_a_damaged_or_foreign_state_is_refused_in_one_line_and_nothing_is_assigned(damage, message):
    variables = _variables()
    with pytest.raises(population.PbtStateError, match=message) as error:
        population.decode_state(damage(_state_of(variables)), 1, variables)
    assert str(error.value).startswith("policy 1's state: ") and "\n" not in str(error.value)


def test_a_state_with_values_that_are_not_finite_is_refused():
    variables = _variables()
    variables[0].assign(np.full((2, 3), np.nan, np.float32))
    with pytest.raises(population.PbtStateError, match="not finite"):
        population.decode_state(_state_of(variables), 1, _variables())


def _adam_member(policy=1):
    """A policy's variables as the learner lists them, the network's then a real Adam's (its
    first moments, step count and second moments), after one step; and its member."""
    weights = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    optimizer = snt.optimizers.Adam(1e-3)
    optimizer.apply([tf.ones([2, 3])], [weights])
    variables = [weights, *optimizer.variables]
    member = population.Population(
        _config(policy), _Trainer(optimizer), variables, "", False, print, "0" * 64
    )
    return variables, optimizer, member


def test_a_state_whose_optimiser_would_make_the_next_step_nan_is_refused():
    """Finite values a lying peer may send that the next Adam step turns into NaN weights: a
    negative second moment (its square root), a step count beyond 2^53 or below 0."""
    mine, _, receiver = _adam_member(policy=0)
    assert len(receiver._nonnegative) == 2  # the second moments and the step count
    _, _, donor = _adam_member()
    _, arrays = population.decode_state(donor._encode_state(9), 1, mine, receiver._nonnegative)
    assert [a.shape for a in arrays] == [tuple(v.shape) for v in mine]
    for damage, message in [
        (lambda adam: adam.v[0].assign(-tf.ones([2, 3])), "adam/v/.* holds negative values"),
        (lambda adam: adam.step.assign(-1), "adam/t.* holds negative values"),
        (lambda adam: adam.step.assign(2**62), "adam/t.* holds integers beyond"),
    ]:
        _, optimizer, donor = _adam_member()
        damage(optimizer)
        with pytest.raises(population.PbtStateError, match=message) as error:
            population.decode_state(donor._encode_state(9), 1, mine, receiver._nonnegative)
        assert "\n" not in str(error.value)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "field, value",
    [
        ("objective", 10**400),
        ("frames", 10**400),
        ("hyperparameters", {**HYPERPARAMETERS, "learning_rate": 10**400}),
        ("objective", "DEEP"),
    ],
)
def test_a_status_with_a_huge_number_or_deep_json_is_left_out_not_raised(field, value):
    text = json.dumps({**_status(1, 1.0).__dict__, field: value}).replace('"DEEP"', _deep(60000))
    assert len(text) < 150_000
    assert pbt.Status.decode(text.encode(), 1) is None


def test_a_state_with_a_deeply_nested_header_is_refused_in_one_line():
    variables = _variables()
    data = _state_of(variables)
    (size,) = wire.STATE_HEADER.unpack_from(data)
    header = _deep(30000).encode()
    damaged = wire.STATE_HEADER.pack(len(header)) + header + data[4 + size :]
    with pytest.raises(population.PbtStateError, match="its header does not describe"):
        population.decode_state(damaged, 1, variables)


class _Impostor(grpc.GenericRpcHandler):
    """What answers at another policy's address: a plain grpcio server, which says what it
    likes (raw bytes) to whoever calls, as a lying peer or a process on its port would."""

    def __init__(self, answers: dict[str, bytes]):
        self.answers = answers

    def service(self, details):
        answer = self.answers.get(details.method.rsplit("/", 1)[-1])
        if answer is None:
            return None
        if isinstance(answer, grpc.StatusCode):  # the call ends with it
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: context.abort(answer, "replies wait to be read")
            )
        return grpc.unary_unary_rpc_method_handler(lambda request, context: answer)


@contextlib.contextmanager
def _impostor(answers):
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((_Impostor(answers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _looking_member(address):
    """Policy 0, rank 0, among the worst of two after its games, with policy 1 at `address`."""
    weights = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    optimizer = snt.optimizers.Adam(1e-3)
    optimizer.apply([tf.ones([2, 3])], [weights])
    config = dataclasses.replace(
        _config(0), policy_hosts=("127.0.0.1:1", address), pbt=PbtConfig(with_pbt=True)
    )
    variables = [weights, *optimizer.variables]
    member = population.Population(
        config, _Trainer(optimizer), variables, "", True, print, "0" * 64
    )
    member.record(np.full(50, -20.0))
    return member, variables


@pytest.mark.parametrize(
    "status",
    [
        _deep(5000).encode(),  # within the status's 64 KiB, past the parser's depth
        json.dumps({**_status(1, 1.0).__dict__, "objective": 10**400}).encode(),
        json.dumps({**_status(1, 1.0).__dict__, "frames": 10**400}).encode(),
        b"\xff" * 100,
    ],
)
def test_a_peer_that_answers_its_status_with_anything_is_left_out_of_the_look(status):
    with _impostor({"PolicyStatus": status}) as address:
        member, _ = _looking_member(address)
        decision, _, note = member._decide(3_000_000)
        member.close()
    assert decision.action == pbt.SIT_OUT and note["answered"] == 0


def _ranked_first_with(state):
    """An impostor's answers: a status far ahead of policy 0's, and `state` for a copy."""
    return {"PolicyStatus": _status(1, 21.0).encode(), "PolicyState": state}


def test_a_donor_whose_state_would_make_the_weights_nan_is_not_copied():
    """The impostor ranks itself far ahead, so policy 0 copies it; the state it sends is
    well-formed and finite, but with negative second moments: nothing is assigned."""
    donor_variables, donor_optimizer, donor = _adam_member()
    donor_optimizer.v[0].assign(-tf.ones([2, 3]))
    donor_variables[0].assign(tf.fill([2, 3], 9.0))
    answers = _ranked_first_with(donor._encode_state(4_000_000))
    with _impostor(answers) as address:
        member, variables = _looking_member(address)
        before = [v.numpy().copy() for v in variables]
        decision, _, _ = member._decide(3_000_000)
        member.close()
    assert decision.action == pbt.SIT_OUT and "negative values" in decision.why
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, variables, strict=True))


def test_a_donor_whose_weights_its_actors_games_would_be_refused_for_is_not_kept():
    """A well-formed, finite state whose weights give logits past the bound actors' chunks
    are refused for: the learners would wait for ever for a batch, never to look again."""
    donor_variables, _, donor = _adam_member()
    donor_variables[0].assign(tf.fill([2, 3], 1e6))
    answers = _ranked_first_with(donor._encode_state(4_000_000))
    with _impostor(answers) as address:
        member, variables = _looking_member(address)
        before = [v.numpy().copy() for v in variables]
        checked = []

        def check():  # as `steps.outputs_out_of_bounds` on the weights copied
            checked.append(variables[0].numpy().max())
            return "its policy logits reach 3e+06"

        decision, _, _ = member._decide(3_000_000, check)
        member.close()
    assert checked == [1e6]
    assert decision.action == pbt.SIT_OUT
    assert decision.why == ("policy 1's state is not kept: its policy logits reach 3e+06")
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, variables, strict=True))

    def failing_check():
        raise tf.errors.ResourceExhaustedError(None, None, "out of memory")

    def broken_check():
        raise RuntimeError("a bug")

    with _impostor(answers) as address:
        member, variables = _looking_member(address)
        before = [v.numpy().copy() for v in variables]
        decision, _, _ = member._decide(3_000_000, failing_check)
        assert decision.why == (
            "policy 1's state is not kept: its outputs could not be checked "
            "(ResourceExhaustedError)"
        )
        with pytest.raises(RuntimeError, match="a bug"):
            member._decide(3_000_000, broken_check)
        member.close()
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, variables, strict=True))


def test_a_donor_that_answers_at_once_without_its_state_is_said_so_not_a_timeout():
    answers = {"PolicyStatus": _status(1, 21.0).encode(), "PolicyState": b""}
    with _impostor(answers) as address:
        member, _ = _looking_member(address)
        decision, _, _ = member._decide(3_000_000)
        member.close()
    assert decision.action == pbt.SIT_OUT
    assert decision.why.startswith("policy 1 answered in ") and "without its state" in decision.why


def test_a_donor_that_ends_the_call_is_said_so_with_its_status():
    """A learner whose unread replies fill its budget ends the call RESOURCE_EXHAUSTED."""
    answers = {
        "PolicyStatus": _status(1, 21.0).encode(),
        "PolicyState": grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
    with _impostor(answers) as address:
        member, _ = _looking_member(address)
        decision, _, _ = member._decide(3_000_000)
        member.close()
    assert decision.action == pbt.SIT_OUT
    assert decision.why == (
        "policy 1 did not give its state (RESOURCE_EXHAUSTED: replies wait to be read)"
    )


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b"\xff\xfe",
        b"[]",
        b'{"ckpt-5": {"generation": 1}}',
        b'{"ckpt-5": 3}',
        b"[" * 100_000,  # past the parser's depth
        b" " * (2 << 20),
    ],
)
def test_a_damaged_state_file_is_one_line_naming_it_and_rewritten_only_at_a_save(tmp_path, content):
    path = tmp_path / population.STATE_FILE
    path.write_bytes(content)
    with pytest.raises(population.PbtStateError, match=f"^{path}: ") as error:
        population._read_state(str(tmp_path))
    assert "\n" not in str(error.value) and str(error.value).endswith(
        "; remove it to resume with the flags' hyperparameters"
    )
    assert path.read_bytes() == content


def test_a_save_over_a_damaged_state_file_says_so_and_writes_it_again(tmp_path):
    run_dir = tmp_path / "policy_0"
    path = run_dir / "checkpoints" / population.STATE_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{")
    said = []
    member = population.Population(
        _config(0), _Trainer(), _variables(), str(run_dir), True, said.append, "0" * 64
    )
    member.before_save(version=7)
    member.close()
    assert len(said) == 1 and said[0].startswith(f"pbt: {path}: not valid JSON (")
    assert said[0].endswith("); writing it again with this checkpoint's entry only")
    assert list(json.loads(path.read_text())) == ["ckpt-7"]


def test_only_the_newest_entries_keep_their_games_so_many_kept_checkpoints_stay_small(tmp_path):
    """--keep_checkpoint_every_frames may keep thousands of checkpoints; each entry keeping
    up to 10,000 returns would pass the size a resume reads."""
    from impala.learner import checkpoint_folder

    run_dir = tmp_path / "policy_0"
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    kept = [f"ckpt-{version}" for version in range(1, 7)]
    checkpoint_folder.write_state(str(folder), [str(folder / name) for name in kept])
    entry = {"hyperparameters": HYPERPARAMETERS, "next_look": 5, "generation": 0}
    earlier = {name: {**entry, "returns": [1.0] * 1000} for name in [*kept, "ckpt-0"]}
    (folder / population.STATE_FILE).write_text(json.dumps(earlier))
    member = population.Population(
        _config(0), _Trainer(), _variables(), str(run_dir), True, print, "0" * 64
    )
    member.record(np.array([-21.0]))
    member.before_save(version=7)
    entries = json.loads((folder / population.STATE_FILE).read_text())
    with_games = [name for name in entries if "returns" in entries[name]]
    assert sorted(entries) == sorted([*kept, "ckpt-7"])  # ckpt-0 is no longer kept
    assert sorted(with_games) == ["ckpt-4", "ckpt-5", "ckpt-6", "ckpt-7"]
    assert len(with_games) == population.ENTRIES_WITH_RETURNS
    assert entries["ckpt-1"] == entry and entries["ckpt-7"]["returns"] == [-21.0]

    # A run's last save at the version of a periodic save just before it: the same four.
    checkpoint_folder.write_state(str(folder), [str(folder / f"ckpt-{v}") for v in range(1, 8)])
    member.before_save(version=7)
    member.close()
    entries = json.loads((folder / population.STATE_FILE).read_text())
    assert sorted(name for name in entries if "returns" in entries[name]) == sorted(with_games)


@pytest.mark.timeout(60)
def test_a_state_file_that_is_a_link_or_a_fifo_is_refused_without_being_read(tmp_path):
    path = tmp_path / population.STATE_FILE
    path.symlink_to("/dev/zero")  # a read through it would never end
    with pytest.raises(population.PbtStateError, match=f"^{path}: is a link"):
        population._read_state(str(tmp_path))
    path.unlink()
    os.mkfifo(path)  # no writer: a blocking open would wait for one for ever
    with pytest.raises(population.PbtStateError, match=f"^{path}: not a regular file"):
        population._read_state(str(tmp_path))


@pytest.mark.timeout(60)
def test_a_look_is_logged_never_through_a_link_and_a_log_that_cannot_be_written_is_said(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("precious")
    log = tmp_path / population.LOG_FILE
    log.symlink_to(outside)
    said = []
    population._append_line(str(log), '{"frames": 1}', said.append)
    assert outside.read_text() == "precious"
    assert len(said) == 1 and said[0].startswith(f"pbt: cannot write {log} (")
    log.unlink()
    os.mkfifo(log)  # no reader: a blocking open would wait for one for ever
    population._append_line(str(log), '{"frames": 1}', said.append)
    assert len(said) == 2 and said[1].startswith(f"pbt: cannot write {log} (")
    log.unlink()
    said.clear()
    population._append_line(str(log), '{"frames": 1}', said.append)
    population._append_line(str(log), '{"frames": 2}', said.append)
    assert log.read_text() == '{"frames": 1}\n{"frames": 2}\n' and not said


def test_a_resume_keeps_the_games_a_policy_is_ranked_on_and_reads_entries_without_them(tmp_path):
    """Its first look after a restart ranks it on the games before it, rather than sitting
    out for want of games (state files written before the games were kept still resume)."""
    run_dir = str(tmp_path / "policy_0")
    saved = population.Population(
        _config(0), _Trainer(), _variables(), run_dir, True, print, "0" * 64
    )
    saved.record(np.array([-21.0, -20.0, 3.5]))
    saved.before_save(version=7)
    saved.close()
    checkpoint = os.path.join(run_dir, "checkpoints", "ckpt-7")

    said = []
    resumed = population.Population(
        _config(0), _Trainer(), _variables(), run_dir, True, said.append, "0" * 64
    )
    resumed.restore(checkpoint)
    resumed.close()
    assert resumed.status(10).games == 3 and resumed.status(10).objective is None  # 3 < 50 / 4
    assert "3 games for its ranking" in said[-1]

    state = tmp_path / "policy_0" / "checkpoints" / population.STATE_FILE
    entries = json.loads(state.read_text())
    assert entries["ckpt-7"]["returns"] == [-21.0, -20.0, 3.5]
    del entries["ckpt-7"]["returns"]
    state.write_text(json.dumps(entries))
    older = population.Population(
        _config(0), _Trainer(), _variables(), run_dir, True, print, "0" * 64
    )
    older.restore(checkpoint)
    older.close()
    assert older.status(10).games == 0

    entries["ckpt-7"]["returns"] = [1.0, float("nan")]
    state.write_text(json.dumps(entries))
    with pytest.raises(population.PbtStateError, match="not population-based training's state"):
        population._read_state(str(state.parent))
