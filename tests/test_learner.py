"""The IMPALA loss terms, reward clipping, the learning-rate schedule and the optimisation step."""

import numpy as np
import pytest
import tensorflow as tf

import learner
import networks
import vtrace
from actor import Steps
from learner import LearnerConfig


def _batch(rng, num_steps=5, batch_size=3, obs_dim=4, num_actions=3):
    shape = (num_steps + 1, batch_size)
    return learner.Batch(
        agent_state=(),
        steps=Steps(
            prev_action=rng.integers(0, num_actions, shape).astype(np.int32),
            reward=rng.normal(size=shape).astype(np.float32) * 3,
            done=rng.uniform(size=shape) < 0.2,
            observation=rng.normal(size=(*shape, obs_dim)).astype(np.float32),
            action=rng.integers(0, num_actions, shape).astype(np.int32),
            policy_logits=rng.normal(size=(*shape, num_actions)).astype(np.float32),
        ),
    )


def _mlp_agent(num_actions=3, obs_dim=4, seed=0):
    tf.random.set_seed(seed)
    agent = networks.make_agent("MLPAgent", num_actions)
    inputs = networks.AgentInput(
        prev_action=tf.zeros([1], tf.int32),
        reward=tf.zeros([1]),
        done=tf.zeros([1], tf.bool),
        observation=tf.zeros([1, obs_dim]),
    )
    agent(inputs, agent.initial_state(1))
    return agent


def test_clip_rewards():
    rewards = tf.constant([-10.0, -0.5, 0.0, 0.5, 10.0])
    np.testing.assert_allclose(
        learner.clip_rewards(rewards, "abs_one"), [-1, -0.5, 0, 0.5, 1], rtol=1e-6
    )
    np.testing.assert_allclose(learner.clip_rewards(rewards, "none"), rewards)
    soft = learner.clip_rewards(rewards, "soft_asymmetric").numpy()
    np.testing.assert_allclose(soft[4], 5 * np.tanh(2.0), rtol=1e-6)
    np.testing.assert_allclose(soft[0], 0.3 * 5 * np.tanh(-2.0), rtol=1e-6)
    assert abs(soft[0]) < abs(soft[4])  # negatives are squashed harder


def test_loss_terms_by_hand():
    # Two actions, uniform policy: entropy log 2 per step.
    logits = tf.zeros([2, 1, 2])
    np.testing.assert_allclose(learner.compute_entropy_loss(logits), -2 * np.log(2), rtol=1e-6)
    np.testing.assert_allclose(learner.compute_baseline_loss(tf.constant([[1.0], [-2.0]])), 2.5)
    # -log(0.5) * advantage, summed.
    loss = learner.compute_policy_gradient_loss(
        logits, tf.constant([[0], [1]]), tf.constant([[1.0], [3.0]])
    )
    np.testing.assert_allclose(loss, np.log(2) * 4, rtol=1e-6)


def test_policy_gradient_loss_does_not_differentiate_advantages():
    advantages = tf.Variable([[1.0, 2.0]])
    logits = tf.Variable(tf.zeros([1, 2, 3]))
    with tf.GradientTape(persistent=True) as tape:
        loss = learner.compute_policy_gradient_loss(logits, tf.constant([[0, 2]]), advantages)
    assert tape.gradient(loss, advantages) is None
    assert tape.gradient(loss, logits) is not None


def test_compute_loss_matches_vtrace_on_the_shifted_batch():
    rng = np.random.default_rng(0)
    agent = _mlp_agent()
    batch = _batch(rng)
    config = LearnerConfig(baseline_cost=0.5, entropy_cost=0.01, discounting=0.9)
    terms = learner.compute_loss(agent, batch, config)

    steps = batch.steps
    inputs = networks.AgentInput(steps.prev_action, steps.reward, steps.done, steps.observation)
    outputs, _ = agent.unroll(inputs, ())
    returns = vtrace.from_logits(
        behaviour_policy_logits=steps.policy_logits[:-1],
        target_policy_logits=outputs.policy_logits[:-1],
        actions=steps.action[:-1],
        discounts=(~steps.done[1:]).astype(np.float32) * 0.9,
        rewards=np.clip(steps.reward[1:], -1, 1),
        values=outputs.baseline[:-1],
        bootstrap_value=outputs.baseline[-1],
    )
    expected_baseline = 0.5 * 0.5 * np.sum((returns.vs - outputs.baseline[:-1]) ** 2)
    np.testing.assert_allclose(terms.baseline, expected_baseline, rtol=1e-5)
    np.testing.assert_allclose(
        terms.total, terms.policy_gradient + terms.baseline + terms.entropy, rtol=1e-6
    )


def test_learning_rate_anneals_linearly_to_zero():
    config = LearnerConfig(learning_rate=0.001, total_environment_frames=1000)
    assert float(learner.annealed_learning_rate(config, 0)) == pytest.approx(0.001)
    assert float(learner.annealed_learning_rate(config, 250)) == pytest.approx(0.00075)
    assert float(learner.annealed_learning_rate(config, 1000)) == 0.0
    assert float(learner.annealed_learning_rate(config, 5000)) == 0.0


def test_step_reduces_loss_on_a_fixed_batch():
    rng = np.random.default_rng(1)
    agent = _mlp_agent()
    batch = _batch(rng, num_steps=8, batch_size=4)
    config = LearnerConfig(learning_rate=0.01, entropy_cost=0.0, total_environment_frames=10**9)
    trainer = learner.Learner(agent, config)
    first = trainer.step(batch, frames=0)
    for _ in range(30):
        last = trainer.step(batch, frames=0)
    assert last["loss/baseline"] < 0.5 * first["loss/baseline"]
    assert first["learning_rate"] == pytest.approx(0.01)


def test_gradient_clipping_bounds_the_update():
    rng = np.random.default_rng(2)
    batch = _batch(rng)
    batch = batch._replace(steps=batch.steps._replace(reward=batch.steps.reward * 1000))
    deltas = {}
    for clip in (1e-3, -1.0):
        agent = _mlp_agent(seed=3)
        before = [v.numpy() for v in agent.trainable_variables]
        config = LearnerConfig(gradients_clipping=clip, reward_clipping="none", momentum=0.0)
        stats = learner.Learner(agent, config).step(batch, frames=0)
        assert stats["gradient_norm"] > 1.0  # the unclipped norm is reported
        after = [v.numpy() for v in agent.trainable_variables]
        deltas[clip] = sum(np.sum(np.abs(a - b)) for a, b in zip(after, before, strict=True))
    assert deltas[1e-3] < deltas[-1.0]


def test_create_optimizer_slots_keeps_weights():
    agent = _mlp_agent()
    before = [v.numpy() for v in agent.trainable_variables]
    trainer = learner.Learner(agent, LearnerConfig())
    trainer.create_optimizer_slots()
    assert trainer.optimizer.variables  # slots exist
    for variable, value in zip(agent.trainable_variables, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)
    assert float(trainer.learning_rate) == pytest.approx(LearnerConfig().learning_rate)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("batch_size", 0, "--batch_size=0: must be at least 1"),
        ("reward_clipping", "tanh", "--reward_clipping=tanh: must be one of"),
        ("discounting", 1.5, "--discounting=1.5"),
        ("epsilon", 0.0, "--epsilon=0.0"),
    ],
)
def test_config_errors_name_the_flag(field, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        LearnerConfig(**{field: value})
