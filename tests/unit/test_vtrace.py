"""V-trace against a slow reference written like the paper, hand-worked cases and properties."""

import numpy as np
import pytest
import tensorflow as tf

import vtrace


def _shaped_arange(*shape):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(*shape)


def _softmax(logits):
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _reference_vtrace(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold=1.0,
    clip_pg_rho_threshold=1.0,
    lambda_=1.0,
):
    """The definition in section 4.1 of the IMPALA paper, summed term by term (O(T^2)).

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t
    delta_t = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)),
    c_i = lambda min(1, rho_i)  (remark 2).
    """
    rhos = np.exp(log_rhos.astype(np.float64))
    clipped = rhos if clip_rho_threshold is None else np.minimum(clip_rho_threshold, rhos)
    cs = lambda_ * np.minimum(1.0, rhos)
    values_next = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped * (rewards + discounts * values_next - values)
    num_steps = len(log_rhos)
    vs = np.zeros_like(rhos)
    for s in range(num_steps):
        total = np.array(values[s], dtype=np.float64)
        weight = np.ones_like(total)
        for t in range(s, num_steps):
            total = total + weight * deltas[t]
            weight = weight * discounts[t] * cs[t]
        vs[s] = total
    vs_next = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg_clipped = rhos if clip_pg_rho_threshold is None else np.minimum(clip_pg_rho_threshold, rhos)
    pg_advantages = pg_clipped * (rewards + discounts * vs_next - values)
    return vs, pg_advantages


def _random_inputs(rng, num_steps, batch_size, extra=()):
    shape = (num_steps, batch_size, *extra)
    # Log-ratios spread so that rhos fall both below and above the clipping thresholds.
    log_rhos = rng.uniform(-2.0, 2.0, size=shape).astype(np.float32)
    discounts = np.full(shape, 0.9, dtype=np.float32)
    # Episode boundaries: discount 0 inside the trace.
    discounts[rng.uniform(size=shape) < 0.15] = 0.0
    return dict(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rng.normal(size=shape).astype(np.float32),
        values=rng.normal(size=shape).astype(np.float32),
        bootstrap_value=rng.normal(size=shape[1:]).astype(np.float32),
    )


@pytest.mark.parametrize("num_steps,batch_size", [(1, 1), (2, 3), (5, 2), (20, 8), (40, 1)])
@pytest.mark.parametrize(
    "clip_rho,clip_pg_rho,lambda_",
    [(1.0, 1.0, 1.0), (0.5, 2.0, 1.0), (None, None, 1.0), (3.7, None, 1.0), (1.0, 1.0, 0.9)],
)
def test_matches_reference(num_steps, batch_size, clip_rho, clip_pg_rho, lambda_):
    rng = np.random.default_rng(num_steps * 100 + batch_size)
    inputs = _random_inputs(rng, num_steps, batch_size)
    rhos = np.exp(inputs["log_rhos"])
    if num_steps * batch_size >= 10:
        assert (rhos < 0.5).any() and (rhos > 3.7).any(), (
            "test must exercise both sides of clipping"
        )

    clips = dict(clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho, lambda_=lambda_)
    out = vtrace.from_importance_weights(**inputs, **clips)
    vs, pg_advantages = _reference_vtrace(**inputs, **clips)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg_advantages, rtol=1e-5, atol=1e-5)


def test_extra_trailing_dimensions():
    rng = np.random.default_rng(7)
    inputs = _random_inputs(rng, num_steps=6, batch_size=2, extra=(3, 2))
    out = vtrace.from_importance_weights(**inputs)
    vs, pg_advantages = _reference_vtrace(**inputs)
    assert out.vs.shape == (6, 2, 3, 2)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg_advantages, rtol=1e-5, atol=1e-5)


def test_hand_worked_two_steps():
    # rho_0 = 2 (clipped to 1 in deltas, c_0 = 1), rho_1 = 0.5 (c_1 = 0.5), gamma = 0.5.
    # V = [1, 2], bootstrap 4, r = [1, 1].
    # delta_1 = 0.5 * (1 + 0.5*4 - 2) = 0.5        -> v_1 = 2 + 0.5 = 2.5
    # delta_0 = 1.0 * (1 + 0.5*2 - 1) = 1.0        -> v_0 = 1 + 1.0 + 0.5*1*0.5 = 2.25
    # pg_0 = min(1, 2) * (1 + 0.5*2.5 - 1) = 1.25;  pg_1 = 0.5 * (1 + 0.5*4 - 2) = 0.5
    out = vtrace.from_importance_weights(
        log_rhos=np.log([[2.0], [0.5]]).astype(np.float32),
        discounts=[[0.5], [0.5]],
        rewards=[[1.0], [1.0]],
        values=[[1.0], [2.0]],
        bootstrap_value=[4.0],
    )
    np.testing.assert_allclose(out.vs.numpy(), [[2.25], [2.5]], rtol=1e-6)
    np.testing.assert_allclose(out.pg_advantages.numpy(), [[1.25], [0.5]], rtol=1e-6)


def test_on_policy_without_clipping_is_n_step_return():
    # With rho = 1 everywhere, v_s is the discounted n-step return bootstrapped from V(x_T).
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    out = vtrace.from_importance_weights(
        log_rhos=np.zeros((3, 1), np.float32),
        discounts=np.full((3, 1), 0.9, np.float32),
        rewards=rewards,
        values=np.full((3, 1), 123.0, np.float32),  # must not matter on-policy
        bootstrap_value=[10.0],
    )
    expected_v0 = 1.0 + 0.9 * 2.0 + 0.81 * 3.0 + 0.729 * 10.0
    np.testing.assert_allclose(out.vs.numpy()[0, 0], expected_v0, rtol=1e-6)


def test_lambda_zero_gives_one_step_targets():
    # With lambda = 0 the trace stops after one step: v_s = V(x_s) + delta_s, whatever the rhos.
    rng = np.random.default_rng(11)
    inputs = _random_inputs(rng, num_steps=6, batch_size=3)
    out = vtrace.from_importance_weights(**inputs, lambda_=0.0)
    rhos = np.minimum(1.0, np.exp(inputs["log_rhos"]))
    values_next = np.concatenate([inputs["values"][1:], inputs["bootstrap_value"][None]])
    one_step = inputs["rewards"] + inputs["discounts"] * values_next - inputs["values"]
    np.testing.assert_allclose(out.vs.numpy(), inputs["values"] + rhos * one_step, atol=1e-5)


@pytest.mark.parametrize("lambda_", [-0.1, 1.5, float("nan")])
def test_lambda_outside_unit_interval_raises(lambda_):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="lambda_ must be in"):
        vtrace.from_importance_weights(**_random_inputs(rng, 2, 1), lambda_=lambda_)


def test_episode_boundary_cuts_the_trace():
    rng = np.random.default_rng(3)
    inputs = _random_inputs(rng, num_steps=10, batch_size=4)
    inputs["discounts"][:] = 0.99
    inputs["discounts"][4] = 0.0  # the episode ends after step 4
    base = vtrace.from_importance_weights(**inputs)

    perturbed = {k: v.copy() for k, v in inputs.items()}
    perturbed["rewards"][5:] += 100.0
    perturbed["values"][5:] -= 50.0
    perturbed["bootstrap_value"] += 1000.0
    after = vtrace.from_importance_weights(**perturbed)

    np.testing.assert_allclose(after.vs.numpy()[:5], base.vs.numpy()[:5], rtol=1e-6)
    np.testing.assert_allclose(
        after.pg_advantages.numpy()[:5], base.pg_advantages.numpy()[:5], rtol=1e-6
    )
    assert not np.allclose(after.vs.numpy()[5:], base.vs.numpy()[5:])


def test_no_gradient_through_targets():
    rng = np.random.default_rng(0)
    inputs = {k: tf.Variable(v) for k, v in _random_inputs(rng, 5, 3).items()}
    with tf.GradientTape(persistent=True) as tape:
        out = vtrace.from_importance_weights(**inputs)
        total = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
    for name, variable in inputs.items():
        assert tape.gradient(total, variable) is None, name


def test_from_logits_agrees_with_from_importance_weights():
    rng = np.random.default_rng(11)
    num_steps, batch_size, num_actions = 7, 4, 5
    behaviour_logits = rng.normal(size=(num_steps, batch_size, num_actions)).astype(np.float32)
    target_logits = rng.normal(size=(num_steps, batch_size, num_actions)).astype(np.float32)
    actions = rng.integers(0, num_actions, size=(num_steps, batch_size)).astype(np.int32)
    inputs = _random_inputs(rng, num_steps, batch_size)
    del inputs["log_rhos"]

    out = vtrace.from_logits(
        behaviour_policy_logits=behaviour_logits,
        target_policy_logits=target_logits,
        actions=actions,
        clip_rho_threshold=1.0,
        clip_pg_rho_threshold=1.0,
        **inputs,
    )

    def taken(probs):
        return np.take_along_axis(probs, actions[..., None], axis=-1)[..., 0]

    target_log_probs = np.log(taken(_softmax(target_logits)))
    behaviour_log_probs = np.log(taken(_softmax(behaviour_logits)))
    np.testing.assert_allclose(out.target_action_log_probs, target_log_probs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        out.behaviour_action_log_probs, behaviour_log_probs, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        out.log_rhos, target_log_probs - behaviour_log_probs, rtol=1e-5, atol=1e-5
    )

    from_weights = vtrace.from_importance_weights(log_rhos=out.log_rhos, **inputs)
    np.testing.assert_allclose(out.vs, from_weights.vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages, from_weights.pg_advantages, rtol=1e-5, atol=1e-5)


def test_log_probs_from_logits_and_actions():
    logits = _shaped_arange(3, 2, 4) / 10.0
    actions = np.array([[0, 3], [1, 2], [3, 0]], np.int64)
    log_probs = vtrace.log_probs_from_logits_and_actions(logits, actions)
    expected = np.log(np.take_along_axis(_softmax(logits), actions[..., None], axis=-1)[..., 0])
    np.testing.assert_allclose(log_probs.numpy(), expected, rtol=1e-6)


def test_works_inside_tf_function():
    rng = np.random.default_rng(5)
    inputs = _random_inputs(rng, num_steps=20, batch_size=3)
    compiled = tf.function(vtrace.from_importance_weights)
    out = compiled(**{k: tf.constant(v) for k, v in inputs.items()})
    vs, pg_advantages = _reference_vtrace(**inputs)
    np.testing.assert_allclose(out.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg_advantages, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name,shape,message",
    [
        ("discounts", (5, 2, 1), "discounts must have rank 2"),
        ("rewards", (5,), "rewards must have rank 2"),
        ("values", (5, 2, 3), "values must have rank 2"),
        ("bootstrap_value", (5, 2), "bootstrap_value must have rank 1"),
    ],
)
def test_inconsistent_ranks_raise(name, shape, message):
    inputs = _random_inputs(np.random.default_rng(1), num_steps=5, batch_size=2)
    inputs[name] = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match=message):
        vtrace.from_importance_weights(**inputs)


def test_logits_rank_must_match_actions():
    with pytest.raises(ValueError, match="policy_logits must have rank 3"):
        vtrace.log_probs_from_logits_and_actions(
            np.zeros((5, 2), np.float32), np.zeros((5, 2), int)
        )


@pytest.mark.parametrize("threshold", [0.0, -1.0])
def test_non_positive_threshold_raises(threshold):
    inputs = _random_inputs(np.random.default_rng(2), num_steps=3, batch_size=2)
    with pytest.raises(ValueError, match="clip_rho_threshold must be positive or None"):
        vtrace.from_importance_weights(**inputs, clip_rho_threshold=threshold)
