"""Tests for networks/: shapes, unroll == steps, resets, variables, checkpoints, registry."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import networks
from networks import AgentInput

NUM_ACTIONS = 5
BATCH = 2
TIME = 3
FRAME_SHAPE = (84, 84, 4)
VECTOR_SHAPE = (4,)
ALL_AGENTS = sorted(networks.AGENTS)
RECURRENT_AGENTS = ("ResNetLSTMAgent", "ShallowLSTMAgent")
FEED_FORWARD_AGENTS = [n for n in ALL_AGENTS if n not in RECURRENT_AGENTS]

# Weights + biases: convs and linears have 2 each, snt.LSTM has 3 (w_i, w_h, b).
EXPECTED_NUM_VARIABLES = {
    "SimpleConvNetAgent": 2 * (3 + 1) + 4,
    "ShallowConvNetAgent": 2 * (2 + 1) + 4,
    "ShallowConvNetLastActionAgent": 2 * (2 + 1) + 4,
    "ResNetAgent": 2 * (3 * 5 + 1) + 4,
    "ResNetLSTMAgent": 2 * (3 * 5 + 1) + 3 + 4,
    "ShallowLSTMAgent": 2 * (2 + 1) + 3 + 4,
    "MLPAgent": 2 * 2 + 4,
}


@pytest.fixture(autouse=True)
def _seed():
    # Weight initialisation is random; fix it so the margins asserted below are reproducible.
    tf.random.set_seed(0)


def observation_spec(agent_name: str) -> tuple[tuple[int, ...], tf.DType]:
    if agent_name == "MLPAgent":
        return VECTOR_SHAPE, tf.float32
    return FRAME_SHAPE, tf.uint8


def random_inputs(agent_name: str, leading: tuple[int, ...], seed: int = 0) -> AgentInput:
    """Random numpy inputs with `leading` dims ([B] or [T, B]); `done` is all False."""
    rng = np.random.default_rng(seed)
    shape, dtype = observation_spec(agent_name)
    if dtype == tf.uint8:
        observation = rng.integers(0, 256, leading + shape, dtype=np.uint8)
    else:
        observation = rng.normal(size=leading + shape).astype(np.float32)
    return AgentInput(
        prev_action=rng.integers(0, NUM_ACTIONS, leading, dtype=np.int32),
        # Beyond [-1, 1] so that the LSTM agent's reward clipping is exercised.
        reward=rng.normal(scale=3.0, size=leading).astype(np.float32),
        done=np.zeros(leading, dtype=bool),
        observation=observation,
    )


def built_agent(agent_name: str) -> networks.Agent:
    agent = networks.make_agent(agent_name, NUM_ACTIONS)
    networks.build_variables(agent, *observation_spec(agent_name))
    return agent


def time_slice(inputs: AgentInput, start: int, stop: int | None = None) -> AgentInput:
    return AgentInput(*(x[start:stop] for x in inputs))


def step_through(agent: networks.Agent, inputs: AgentInput, state):
    """Runs `agent.__call__` once per time step; returns ([T, B, ...] outputs, final state)."""
    outputs = []
    for t in range(inputs.done.shape[0]):
        output, state = agent(AgentInput(*(x[t] for x in inputs)), state)
        outputs.append(output)
    return tf.nest.map_structure(lambda *xs: tf.stack(xs), *outputs), state


def assert_nests_close(actual, expected, atol: float = 1e-5) -> None:
    tf.nest.assert_same_structure(actual, expected)
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=atol, rtol=0)


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_step_shapes_and_dtypes(agent_name):
    agent = networks.make_agent(agent_name, NUM_ACTIONS)
    state = agent.initial_state(BATCH)

    output, new_state = agent(random_inputs(agent_name, (BATCH,)), state)

    assert isinstance(output, networks.AgentOutput)
    assert output.policy_logits.shape == (BATCH, NUM_ACTIONS)
    assert output.policy_logits.dtype == tf.float32
    assert output.baseline.shape == (BATCH,)
    assert output.baseline.dtype == tf.float32
    tf.nest.assert_same_structure(new_state, state)
    for new, old in zip(tf.nest.flatten(new_state), tf.nest.flatten(state), strict=True):
        assert new.shape == old.shape and new.dtype == old.dtype


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_unroll_shapes_and_dtypes(agent_name):
    agent = networks.make_agent(agent_name, NUM_ACTIONS)

    outputs, _ = agent.unroll(random_inputs(agent_name, (TIME, BATCH)), agent.initial_state(BATCH))

    assert outputs.policy_logits.shape == (TIME, BATCH, NUM_ACTIONS)
    assert outputs.policy_logits.dtype == tf.float32
    assert outputs.baseline.shape == (TIME, BATCH)
    assert outputs.baseline.dtype == tf.float32


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_state_and_recurrence(agent_name):
    agent = networks.make_agent(agent_name, NUM_ACTIONS)
    assert agent.is_recurrent == (agent_name in RECURRENT_AGENTS)
    if agent.is_recurrent:
        state = agent.initial_state(BATCH)
        assert isinstance(state, snt.LSTMState)
        assert [s.shape for s in state] == [(BATCH, 256), (BATCH, 256)]
        assert not any(np.any(s.numpy()) for s in state)
    else:
        assert agent.initial_state(BATCH) == ()


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_unroll_equals_steps(agent_name):
    agent = built_agent(agent_name)
    inputs = random_inputs(agent_name, (TIME, BATCH))
    inputs.done[1, 0] = True  # Episode boundary mid-sequence in one batch row.
    state = agent.initial_state(BATCH)

    unrolled, unrolled_state = agent.unroll(inputs, state)
    stepped, stepped_state = step_through(agent, inputs, state)

    assert_nests_close(unrolled, stepped)
    assert_nests_close(unrolled_state, stepped_state)


@pytest.mark.parametrize("agent_name", RECURRENT_AGENTS)
def test_lstm_reset_on_done(agent_name):
    agent = built_agent(agent_name)
    inputs = random_inputs(agent_name, (TIME, BATCH))
    state = agent.initial_state(BATCH)
    no_reset, _ = agent.unroll(inputs, state)
    inputs.done[1, 0] = True

    with_reset, _ = agent.unroll(inputs, state)
    # Row 0 restarted at t=1 must match a fresh unroll of its new episode.
    fresh, _ = agent.unroll(time_slice(inputs, 1), state)

    for field in networks.AgentOutput._fields:
        reset, plain = getattr(with_reset, field).numpy(), getattr(no_reset, field).numpy()
        np.testing.assert_allclose(reset[1:, 0], getattr(fresh, field)[:, 0], atol=1e-5)
        # The state carried from t=0 really matters, so a missing reset would be caught.
        assert np.max(np.abs(reset[1:, 0] - plain[1:, 0])) > 1e-3
        # Before the boundary and in the other row nothing changes.
        np.testing.assert_array_equal(reset[0], plain[0])
        np.testing.assert_allclose(reset[:, 1], plain[:, 1], atol=1e-6)


@pytest.mark.parametrize("agent_name", RECURRENT_AGENTS)
def test_lstm_step_reset_on_done(agent_name):
    agent = built_agent(agent_name)
    inputs = random_inputs(agent_name, (BATCH,))
    carried = agent(inputs, agent.initial_state(BATCH))[1]
    inputs.done[:] = True

    from_carried, _ = agent(inputs, carried)
    from_initial, _ = agent(inputs, agent.initial_state(BATCH))

    assert_nests_close(from_carried, from_initial, atol=0)


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_variables_created_once(agent_name):
    agent = networks.make_agent(agent_name, NUM_ACTIONS)
    # Variables are created lazily, on the first call; Sonnet refuses to list them before.
    with pytest.raises(ValueError, match="does not currently contain any"):
        agent.trainable_variables  # noqa: B018

    networks.build_variables(agent, *observation_spec(agent_name))
    variables = agent.trainable_variables
    assert len(variables) == EXPECTED_NUM_VARIABLES[agent_name]
    assert len(agent.variables) == len(variables)  # No non-trainable state.
    assert len({v.name for v in variables}) == len(variables)  # Readable, unique names.

    agent(random_inputs(agent_name, (BATCH,)), agent.initial_state(BATCH))
    agent.unroll(random_inputs(agent_name, (TIME, BATCH)), agent.initial_state(BATCH))
    assert [v.ref() for v in agent.trainable_variables] == [v.ref() for v in variables]


def test_layer_sizes():
    shapes = {
        name: {v.name: tuple(v.shape) for v in built_agent(name).trainable_variables}
        for name in (
            "SimpleConvNetAgent",
            "ShallowConvNetAgent",
            "ShallowConvNetLastActionAgent",
            "ResNetLSTMAgent",
            "ShallowLSTMAgent",
            "MLPAgent",
        )
    }
    # 84 -> 20 -> 9 -> 7 (VALID convs), 64 channels.
    assert shapes["SimpleConvNetAgent"]["simple_conv_net_agent/dqn_torso/linear/w:0"] == (
        7 * 7 * 64,
        512,
    )
    # 84 -> 20 -> 9, 32 channels.
    assert shapes["ShallowConvNetAgent"]["shallow_conv_net_agent/shallow_torso/linear/w:0"] == (
        9 * 9 * 32,
        256,
    )
    # The same, and the one-hot previous action.
    last_action = shapes["ShallowConvNetLastActionAgent"]
    assert last_action["shallow_conv_net_last_action_agent/shallow_torso/linear/w:0"] == (
        9 * 9 * 32 + NUM_ACTIONS,
        256,
    )
    lstm = shapes["ResNetLSTMAgent"]
    # 84 -> 42 -> 21 -> 11 (stride-2 SAME pools), 32 channels.
    assert lstm["res_net_lstm_agent/res_net_torso/linear/w:0"] == (11 * 11 * 32, 256)
    # Torso features, one-hot previous action and reward, into 4 gates of 256.
    assert lstm["res_net_lstm_agent/lstm/w_i:0"] == (256 + NUM_ACTIONS + 1, 4 * 256)
    assert lstm["res_net_lstm_agent/policy_baseline_head/policy/w:0"] == (256, NUM_ACTIONS)
    shallow_lstm = shapes["ShallowLSTMAgent"]
    assert shallow_lstm["shallow_lstm_agent/shallow_torso/linear/w:0"] == (9 * 9 * 32, 256)
    assert shallow_lstm["shallow_lstm_agent/lstm/w_i:0"] == (256 + NUM_ACTIONS + 1, 4 * 256)
    assert shapes["MLPAgent"]["mlp_agent/mlp_torso/linear_0/w:0"] == (VECTOR_SHAPE[0], 64)


def _logits_for_prev_actions(agent, inputs, prev_actions, done):
    inputs = inputs._replace(
        prev_action=np.asarray(prev_actions, np.int32), done=np.asarray(done, bool)
    )
    output, _ = agent(inputs, agent.initial_state(len(prev_actions)))
    return output.policy_logits.numpy()


def test_last_action_agent_sees_the_previous_action_except_at_a_game_start():
    agent = built_agent("ShallowConvNetLastActionAgent")
    one = random_inputs("ShallowConvNetLastActionAgent", (1,))
    # The same frame four times; only the previous action and done differ.
    frames = one._replace(
        observation=np.repeat(one.observation, 4, axis=0),
        reward=np.zeros(4, np.float32),
    )
    logits = _logits_for_prev_actions(agent, frames, [0, 3, 0, 3], [False, False, True, True])
    assert np.abs(logits[0] - logits[1]).max() > 1e-6
    # A game's first step: the action before it belongs to another game and is not seen.
    np.testing.assert_array_equal(logits[2], logits[3])
    # Unrolled, the same: [T=2, B=2].
    unrolled = frames._replace(
        observation=frames.observation.reshape((2, 2, *FRAME_SHAPE)),
        prev_action=np.array([[0, 3], [0, 3]], np.int32),
        reward=np.zeros((2, 2), np.float32),
        done=np.array([[False, False], [True, True]]),
    )
    outputs, _ = agent.unroll(unrolled, ())
    np.testing.assert_allclose(outputs.policy_logits.numpy().reshape(4, -1), logits, atol=1e-5)


def test_plain_shallow_agent_ignores_the_previous_action():
    agent = built_agent("ShallowConvNetAgent")
    one = random_inputs("ShallowConvNetAgent", (1,))
    frames = one._replace(observation=np.repeat(one.observation, 2, axis=0))
    logits = _logits_for_prev_actions(agent, frames, [0, 3], [False, False])
    np.testing.assert_array_equal(logits[0], logits[1])


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_initial_policy_near_uniform(agent_name):
    agent = built_agent(agent_name)
    outputs, _ = agent.unroll(random_inputs(agent_name, (TIME, BATCH)), agent.initial_state(BATCH))
    probs = tf.nn.softmax(outputs.policy_logits).numpy()
    np.testing.assert_allclose(probs, 1.0 / NUM_ACTIONS, atol=0.05)


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_gradients_reach_every_variable(agent_name):
    agent = built_agent(agent_name)
    inputs = random_inputs(agent_name, (TIME, BATCH))
    with tf.GradientTape() as tape:
        outputs, _ = agent.unroll(inputs, agent.initial_state(BATCH))
        loss = tf.reduce_sum(outputs.policy_logits) + tf.reduce_sum(outputs.baseline)
    grads = tape.gradient(loss, agent.trainable_variables)
    missing = [v.name for v, g in zip(agent.trainable_variables, grads, strict=True) if g is None]
    assert not missing


@pytest.mark.parametrize("agent_name", ALL_AGENTS)
def test_checkpoint_round_trip(agent_name, tmp_path):
    agent = built_agent(agent_name)
    path = tf.train.Checkpoint(agent=agent).save(str(tmp_path / "ckpt"))

    inputs = random_inputs(agent_name, (TIME, BATCH))
    inputs.done[1, 0] = True
    expected, _ = agent.unroll(inputs, agent.initial_state(BATCH))
    restored = built_agent(agent_name)
    before, _ = restored.unroll(inputs, restored.initial_state(BATCH))
    assert not np.allclose(before.baseline, expected.baseline)  # Fresh weights differ.

    tf.train.Checkpoint(agent=restored).restore(path).assert_consumed()

    actual, _ = restored.unroll(inputs, restored.initial_state(BATCH))
    assert_nests_close(actual, expected, atol=0)


@pytest.mark.parametrize("agent_name", ["MLPAgent", "ResNetAgent", "ResNetLSTMAgent"])
def test_unroll_in_tf_function(agent_name):
    agent = built_agent(agent_name)
    inputs = tf.nest.map_structure(tf.constant, random_inputs(agent_name, (TIME, BATCH)))
    inputs = inputs._replace(done=tf.constant([[False, False], [True, False], [False, True]]))
    state = agent.initial_state(BATCH)
    eager = agent.unroll(inputs, state)

    static_time = tf.function(agent.unroll)
    assert_nests_close(static_time(inputs, state), eager)

    # Unknown T at trace time takes the while-loop path.
    input_spec = tf.nest.map_structure(
        lambda x: tf.TensorSpec([None, *x.shape[1:]], x.dtype), inputs
    )
    state_spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, state)
    dynamic_time = tf.function(agent.unroll, input_signature=(input_spec, state_spec))
    assert_nests_close(dynamic_time(inputs, state), eager)


def test_make_agent_is_case_insensitive():
    assert type(networks.make_agent("resnetlstmagent", 3)) is networks.ResNetLSTMAgent
    assert type(networks.make_agent("MLPAGENT", 3)) is networks.MLPAgent
    for name, cls in networks.AGENTS.items():
        agent = networks.make_agent(name, 7)
        assert type(agent) is cls and agent.num_actions == 7


def test_make_agent_unknown_name_lists_choices():
    with pytest.raises(ValueError) as error:
        networks.make_agent("TransformerAgent", 3)
    message = str(error.value)
    assert "\n" not in message
    assert "TransformerAgent" in message and "--agent_name" in message
    for name in networks.AGENTS:
        assert name in message


def test_dummy_inputs():
    step = networks.dummy_inputs(FRAME_SHAPE, np.uint8, batch_size=3)
    assert step.observation.shape == (3, *FRAME_SHAPE) and step.observation.dtype == tf.uint8
    assert (step.prev_action.dtype, step.reward.dtype, step.done.dtype) == (
        tf.int32,
        tf.float32,
        tf.bool,
    )
    sequence = networks.dummy_inputs(VECTOR_SHAPE, "float32", batch_size=3, time=4)
    assert all(x.shape[:2] == (4, 3) for x in sequence)
    assert sequence.observation.shape == (4, 3, *VECTOR_SHAPE)


@pytest.mark.parametrize("agent_name", networks.LOW_PRECISION_AGENTS)
def test_a_bfloat16_agent_keeps_float32_weights_and_computes_close_to_float32(agent_name, tmp_path):
    """Its variables are the float32 agent's, by name, shape and dtype (a checkpoint passes
    between them both ways); its outputs, from the same weights, are float32 and within
    bfloat16's rounding of the float32 agent's, and not equal to them (it did compute in
    bfloat16)."""
    exact = built_agent(agent_name)
    low = networks.make_agent(agent_name, NUM_ACTIONS, "bfloat16")
    networks.build_variables(low, *observation_spec(agent_name))
    assert [(v.name, v.shape, v.dtype) for v in low.variables] == [
        (v.name, v.shape, v.dtype) for v in exact.variables
    ]
    path = tf.train.Checkpoint(agent=exact).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(agent=low).restore(path).assert_consumed()
    inputs = random_inputs(agent_name, (TIME, BATCH))
    expected, _ = exact.unroll(inputs, exact.initial_state(BATCH))
    actual, _ = tf.function(low.unroll)(inputs, low.initial_state(BATCH))
    assert actual.policy_logits.dtype == tf.float32 and actual.baseline.dtype == tf.float32
    for mine, theirs in zip(actual, expected, strict=True):
        scale = float(np.abs(theirs).max())
        np.testing.assert_allclose(mine, theirs, atol=0.05 * scale + 1e-3)
        assert not np.array_equal(mine, theirs)
    with tf.GradientTape() as tape:
        outputs, _ = low.unroll(inputs, low.initial_state(BATCH))
        loss = tf.reduce_sum(outputs.policy_logits) + tf.reduce_sum(outputs.baseline)
    gradients = tape.gradient(loss, low.trainable_variables)
    assert all(g is not None and g.dtype == tf.float32 for g in gradients)
    assert all(bool(np.isfinite(g.numpy()).all()) for g in gradients)


@pytest.mark.parametrize("agent_name", ["MLPAgent", "ResNetAgent", "ResNetLSTMAgent"])
def test_an_agent_without_a_bfloat16_torso_refuses_it_in_one_line(agent_name):
    with pytest.raises(ValueError, match=f"--compute_dtype=bfloat16: {agent_name} computes in"):
        networks.make_agent(agent_name, 3, "bfloat16")
    with pytest.raises(ValueError, match="--compute_dtype=float16: must be float32 or bfloat16"):
        networks.make_agent("SimpleConvNetAgent", 3, "float16")
