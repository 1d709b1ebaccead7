"""`--replay_parameters` as users of the PyTorch IMPALA platforms write it, and the share of a
batch each replay gives (impala/configs/replay.py)."""

import json

import pytest

from impala.configs import replay

QUEUE_AND_STANDARD = (
    '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
    ' {"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]'
)
ELITE = (
    '[{"type": "custom", "capacity": 1000, "sample_ratio": 0.5, "dist_function": "ln_norm",'
    ' "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 6,'
    ' "alfa_annealing_factor": 2.0},'
    ' {"type": "queue", "capacity": 1, "sample_ratio": 0.5}]'
)


def test_the_issues_two_examples_are_read_as_written():
    queue, standard = replay.parse(QUEUE_AND_STANDARD)
    assert queue == replay.Replay("queue", 1, 0.5)
    assert standard == replay.Replay("standard", 1000, 0.5)
    elite, queue = replay.parse(ELITE)
    assert elite == replay.Replay(
        "custom",
        1000,
        0.5,
        dist_function="ln_norm",
        p=2,
        sample_strategy="elite_sampling",
        lambda_batch_multiplier=6,
        alfa_annealing_factor=2.0,
        elite_sampling_strategy="strategy3",
    )
    assert queue.type == "queue"


def test_no_flag_is_no_replay_and_names_are_case_insensitive():
    assert replay.parse("") == () and replay.parse("  ") == ()
    (only,) = replay.parse('[{"type": "Standard", "capacity": 10.0, "sample_ratio": 1}]')
    assert (only.type, only.capacity, only.sample_ratio) == ("standard", 10, 1.0)
    (elite,) = replay.parse(
        '[{"type": "custom", "capacity": 5, "sample_ratio": 1, "dist_function": "COS_DIST",'
        ' "sample_strategy": "Elite_Sampling", "lambda_batch_multiplier": 2,'
        ' "alfa_annealing_factor": 1, "elite_sampling_strategy": "strategy1"}]'
    )
    assert (elite.dist_function, elite.elite_sampling_strategy) == ("cos_dist", "strategy1")


def _custom(**changes):
    item = {
        "type": "custom",
        "capacity": 1000,
        "sample_ratio": 1.0,
        "dist_function": "ln_norm",
        "sample_strategy": "elite_sampling",
        "lambda_batch_multiplier": 6,
        "alfa_annealing_factor": 2.0,
    }
    item.update(changes)
    return json.dumps([{k: v for k, v in item.items() if v is not ...}])


@pytest.mark.parametrize(
    "text, message",
    [
        ("[{", "--replay_parameters: not JSON (Expecting property name"),
        ("{}", "must be a JSON list of at least one replay"),
        ("[]", "must be a JSON list of at least one replay"),
        ("[1]", "replay 1: must be an object"),
        ('[{"capacity": 1, "sample_ratio": 1}]', "replay 1: type must be one of queue, standard"),
        ('[{"type": "prioritized", "capacity": 1, "sample_ratio": 1}]', "not 'prioritized'"),
        (
            '[{"type": "queue", "capacity": 1, "sample_ratio": 1, "dist_function": "ln_norm"}]',
            "replay 1 (queue): unknown key 'dist_function'; a queue replay takes type, capacity",
        ),
        ('[{"type": "queue", "sample_ratio": 1}]', "replay 1 (queue): capacity is missing"),
        ('[{"type": "queue", "capacity": 1}]', "replay 1 (queue): sample_ratio is missing"),
        (
            '[{"type": "standard", "capacity": 0, "sample_ratio": 1}]',
            "replay 1 (standard): capacity must be an integer in [1, 10000000], not 0",
        ),
        ('[{"type": "standard", "capacity": 2.5, "sample_ratio": 1}]', "not 2.5"),
        ('[{"type": "standard", "capacity": true, "sample_ratio": 1}]', "not True"),
        ('[{"type": "standard", "capacity": "10", "sample_ratio": 1}]', "not '10'"),
        ('[{"type": "standard", "capacity": 1e12, "sample_ratio": 1}]', "in [1, 10000000]"),
        (
            '[{"type": "queue", "capacity": 1, "sample_ratio": 0}]',
            "replay 1 (queue): sample_ratio must be a number in (0, 1], not 0",
        ),
        ('[{"type": "queue", "capacity": 1, "sample_ratio": NaN}]', "not nan"),
        ('[{"type": "queue", "capacity": 1, "sample_ratio": 1.5}]', "not 1.5"),
        (
            '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
            ' {"type": "standard", "capacity": 9, "sample_ratio": 0.4}]',
            "the sample_ratios must sum to 1, not 0.5 + 0.4 = 0.9",
        ),
        (_custom(dist_function=...), "replay 1 (custom): dist_function is missing; one of"),
        (_custom(dist_function="l2"), "dist_function must be one of ln_norm, cos_dist, kl_div"),
        (_custom(sample_strategy=...), "sample_strategy is missing; one of elite_sampling"),
        (_custom(sample_strategy="attentive_sampling"), "not 'attentive_sampling'"),
        (_custom(lambda_batch_multiplier=...), "elite_sampling needs lambda_batch_multiplier"),
        (_custom(alfa_annealing_factor=...), "elite_sampling needs alfa_annealing_factor"),
        (_custom(lambda_batch_multiplier=0), "lambda_batch_multiplier must be an integer in"),
        (_custom(alfa_annealing_factor=0), "alfa_annealing_factor must be a number > 0, not 0"),
        (_custom(elite_sampling_strategy="strategy5"), "must be one of strategy1, strategy2"),
        (_custom(dist_function="kl_div", p=3), "p is the order of ln_norm, not of kl_div"),
        (_custom(p=0), "p must be an integer in [1, 16], not 0"),
        (_custom(insert_strategy="elite_insertion"), "unknown key 'insert_strategy'"),
        ("[" + "1," * 40000 + "1]", "more than a list of replays needs"),
        ("[" * 30000 + "]" * 30000, "JSON nested too deeply, or with a number too long"),
        ('[{"type": "queue", "capacity": 1, "sample_ratio": 1' + "0" * 5000 + "}]", "too long"),
        (
            _custom(alfa_annealing_factor=10**400),
            "a number > 0, not 1000000000000000000000000000000000000...",
        ),
        (_custom(capacity=10**400), "capacity must be an integer in [1, 10000000], not 10000"),
    ],
)
def test_a_malformed_list_is_one_line_naming_the_replay_and_key(text, message):
    with pytest.raises(ValueError) as raised:
        replay.parse(text)
    error = str(raised.value)
    assert error.startswith("--replay_parameters: ") and message in error, error
    assert "\n" not in error


@pytest.mark.parametrize(
    "ratios, batch_size, shares",
    [
        ((0.5, 0.5), 16, (8, 8)),
        ((0.25, 0.75), 16, (4, 12)),
        ((1 / 3, 1 / 3, 1 / 3), 16, (6, 5, 5)),  # 5.33 each: the leftover to the first
        ((0.3, 0.7), 16, (5, 11)),  # 4.8 and 11.2: the larger remainder gets the leftover
        ((0.1, 0.9), 16, (2, 14)),  # 1.6 and 14.4
        ((1.0,), 7, (7,)),
        ((0.7, 0.2, 0.1), 10, (7, 2, 1)),  # exact, however the products round in floating point
    ],
)
def test_each_batch_takes_its_ratios_share_and_keeps_its_size(ratios, batch_size, shares):
    replays = tuple(replay.Replay("standard", 10, ratio) for ratio in ratios)
    assert replay.batch_shares(replays, batch_size) == shares
    assert sum(shares) == batch_size


def test_a_ratio_too_small_for_the_batch_is_refused():
    replays = replay.parse(
        '[{"type": "queue", "capacity": 1, "sample_ratio": 0.97},'
        ' {"type": "standard", "capacity": 9, "sample_ratio": 0.03}]'
    )
    with pytest.raises(ValueError, match=r"replay 2 \(standard\): a sample_ratio of 0.03 gives no"):
        replay.batch_shares(replays, 16)
