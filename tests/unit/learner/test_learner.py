"""The IMPALA loss terms, reward clipping, the learning-rate schedule and the optimisation step."""

import dataclasses
import re

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import networks
from impala import run_tls, trajectory, transport
from impala.configs import GameConfig, LearnerConfig, LearnerJobConfig, preset_config
from impala.learner import allreduce, loss, optimise, start
from impala.learner import reports as learner_reports
from impala.learner import state as learner_state
from impala.learner import steps as learner_steps
from impala.trajectory import Steps

# The paper's preset (V-trace's own policy gradient, RMSProp, a learning rate falling from the
# start), with changes: the tests of the paper's loss and schedules.
PAPER = preset_config("paper")


def _batch(rng, num_steps=5, batch_size=3, obs_dim=4, num_actions=3):
    shape = (num_steps + 1, batch_size)
    return trajectory.Batch(
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
        loss.clip_rewards(rewards, "abs_one"), [-1, -0.5, 0, 0.5, 1], rtol=1e-6
    )
    np.testing.assert_allclose(loss.clip_rewards(rewards, "none"), rewards)
    soft = loss.clip_rewards(rewards, "soft_asymmetric").numpy()
    np.testing.assert_allclose(soft[4], 5 * np.tanh(2.0), rtol=1e-6)
    np.testing.assert_allclose(soft[0], 0.3 * 5 * np.tanh(-2.0), rtol=1e-6)
    assert abs(soft[0]) < abs(soft[4])  # negatives are squashed harder


def test_loss_terms_by_hand():
    # Two actions, uniform policy: entropy log 2 per step.
    logits = tf.zeros([2, 1, 2])
    np.testing.assert_allclose(loss.compute_entropy_loss(logits), -2 * np.log(2), rtol=1e-6)
    np.testing.assert_allclose(loss.compute_baseline_loss(tf.constant([[1.0], [-2.0]])), 2.5)
    # -log(0.5) * advantage, summed.
    pg_loss = loss.compute_policy_gradient_loss(
        logits, tf.constant([[0], [1]]), tf.constant([[1.0], [3.0]])
    )
    np.testing.assert_allclose(pg_loss, np.log(2) * 4, rtol=1e-6)


def test_policy_gradient_loss_does_not_differentiate_advantages():
    advantages = tf.Variable([[1.0, 2.0]])
    logits = tf.Variable(tf.zeros([1, 2, 3]))
    with tf.GradientTape(persistent=True) as tape:
        pg_loss = loss.compute_policy_gradient_loss(logits, tf.constant([[0, 2]]), advantages)
    assert tape.gradient(pg_loss, advantages) is None
    assert tape.gradient(pg_loss, logits) is not None


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _reference_loss(steps, logits, values, config, proximal_logits=None):
    """The IMPALA loss written out step by step in float64 NumPy, from the paper (section 4.2).

    `logits` [T + 1, B, A] and `values` [T + 1, B] are the learner's outputs on `steps`. Time step
    t holds the observation x_t, the action a_t chosen there and the reward r_t paid on the way
    into x_t, so a_t is paid by r_{t+1}. With PPO's clip centred on the learner, its ratio is
    pi / pi_prox (`proximal_logits` [T, B, A], default the learner's own: a batch's first step)
    and each term is weighted by min(1, pi_prox / mu). Returns the policy-gradient, baseline and
    entropy terms, d(total)/d(logits[:-1]), d(total)/d(values[:-1]) and the ratios the clip
    acts on [T, B].
    """
    num_steps = len(steps.action) - 1
    gamma, lam = config.discounting, config.vtrace_lambda
    log_pi = _log_softmax(logits.astype(np.float64))
    log_mu = _log_softmax(steps.policy_logits.astype(np.float64))
    centred_on_learner = config.policy_clip and config.policy_clip_center == "learner"
    if proximal_logits is None:
        proximal_logits = logits[:-1]
    log_prox = _log_softmax(proximal_logits.astype(np.float64)) if centred_on_learner else log_mu
    clip_ratios = np.zeros(log_pi.shape[:2])[:-1]
    pg_terms, baseline_terms, entropy_terms = [], [], []
    grad_logits = np.zeros_like(log_pi[:-1])
    times = np.arange(num_steps + 1)
    advantages = np.zeros(grad_logits.shape[:2])
    # Only the baseline term reaches the values: the targets and advantages are constants.
    grad_values = np.zeros(grad_logits.shape[:2])
    for b in range(steps.action.shape[1]):
        a = steps.action[:, b]
        rho = np.exp(log_pi[times, b, a] - log_mu[times, b, a])
        reward = np.clip(steps.reward[:, b].astype(np.float64), -1, 1)
        discount = np.where(steps.done[:, b], 0.0, gamma)  # [t] applies to the move into x_t
        v = values[:, b].astype(np.float64)
        vs = np.zeros(num_steps + 1)
        vs[num_steps] = v[num_steps]  # the bootstrap
        for s in reversed(range(num_steps)):
            delta = min(1.0, rho[s]) * (reward[s + 1] + discount[s + 1] * v[s + 1] - v[s])
            trace = lam * min(1.0, rho[s])
            vs[s] = v[s] + delta + discount[s + 1] * trace * (vs[s + 1] - v[s + 1])
        for s in range(num_steps):
            # With PPO's surrogate the ratio weights the policy term instead.
            weight = 1.0 if config.policy_clip else min(1.0, rho[s])
            advantages[s, b] = weight * (reward[s + 1] + discount[s + 1] * vs[s + 1] - v[s])
            baseline_terms.append(0.5 * (vs[s] - v[s]) ** 2)
            grad_values[s, b] = -config.baseline_cost * (vs[s] - v[s])
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    for b in range(steps.action.shape[1]):
        a = steps.action[:, b]
        for s in range(num_steps):
            pi = np.exp(log_pi[s, b])
            advantage = advantages[s, b]
            # d(-log pi(a))/dlogits = pi - onehot(a); d(-H)/dlogits = pi * (log pi + H).
            grad_log_pi = pi - np.eye(len(pi))[a[s]]
            if config.policy_clip:
                eps = config.policy_clip
                ratio = np.exp(log_pi[s, b, a[s]] - log_prox[s, b, a[s]])
                clip_ratios[s, b] = ratio
                weight = min(1.0, np.exp(log_prox[s, b, a[s]] - log_mu[s, b, a[s]]))
                unclipped = ratio * advantage
                clipped = np.clip(ratio, 1 - eps, 1 + eps) * advantage
                pg_terms.append(-weight * min(unclipped, clipped))
                # d ratio = ratio * d log pi(a); the clipped branch, when smaller, is flat.
                active = unclipped <= clipped
                grad_logits[s, b] = weight * advantage * ratio * grad_log_pi if active else 0.0
            else:
                pg_terms.append(-log_pi[s, b, a[s]] * advantage)
                grad_logits[s, b] = advantage * grad_log_pi
            entropy = -np.sum(pi * log_pi[s, b])
            entropy_terms.append(-entropy)
            grad_logits[s, b] += config.entropy_cost * pi * (log_pi[s, b] + entropy)
    return (
        np.sum(pg_terms),
        config.baseline_cost * np.sum(baseline_terms),
        config.entropy_cost * np.sum(entropy_terms),
        grad_logits,
        grad_values,
        clip_ratios,
    )


class _FixedOutputAgent(networks.Agent):
    """Outputs its variables as logits [T + 1, B, A] and values [T + 1, B], whatever it sees."""

    def __init__(self, logits, values):
        super().__init__(logits.shape[-1], name="fixed_output_agent")
        self.logits = tf.Variable(logits, dtype=tf.float32)
        self.values = tf.Variable(values, dtype=tf.float32)

    def __call__(self, inputs, state):
        raise NotImplementedError

    def unroll(self, inputs, state):
        return networks.AgentOutput(self.logits, self.values), state


@pytest.mark.parametrize(
    "seed,vtrace_lambda,normalize,policy_clip,center,proximal",
    [
        (0, 1.0, False, 0.0, "behaviour", False),
        (1, 1.0, False, 0.0, "behaviour", False),
        (2, 1.0, False, 0.0, "behaviour", False),
        (3, 0.8, True, 0.0, "behaviour", False),
        (4, 0.95, True, 0.2, "behaviour", False),
        (5, 1.0, False, 0.1, "behaviour", False),
        # A batch's first step (the clip centred on the current policy) and a later one.
        (6, 0.95, True, 0.1, "learner", False),
        (7, 0.95, True, 0.2, "learner", True),
        (8, 1.0, False, 0.1, "learner", True),
    ],
)
def test_compute_loss_against_an_independent_reference(
    seed, vtrace_lambda, normalize, policy_clip, center, proximal
):
    """Every term and the gradient reaching the logits, against `_reference_loss`.

    Fails if the policy gradient used the value targets instead of its own advantages, the
    behaviour instead of the target logits, the wrong sign or time shift, or let gradients into
    the advantages; if a cost were dropped from its term; or if a learner-centred clip took its
    ratio or its weight against the wrong policy.
    """
    rng = np.random.default_rng(seed)
    batch = _batch(rng, num_steps=6, batch_size=4)
    logits = rng.normal(size=(7, 4, 3)).astype(np.float32)
    values = rng.normal(size=(7, 4)).astype(np.float32)
    # The learner's policy some steps ago: between the behaviour's and today's.
    proximal_logits = (
        (0.5 * logits[:-1] + 0.5 * batch.steps.policy_logits[:-1]).astype(np.float32)
        if proximal
        else None
    )
    config = LearnerConfig(
        baseline_cost=0.3,
        entropy_cost=0.05,
        discounting=0.9,
        vtrace_lambda=vtrace_lambda,
        normalize_advantages=normalize,
        policy_clip=policy_clip,
        policy_clip_center=center,
    )
    agent = _FixedOutputAgent(logits, values)
    with tf.GradientTape() as tape:
        terms = loss.compute_loss(
            agent, batch, config, None if proximal_logits is None else tf.constant(proximal_logits)
        )
    grad_logits, grad_values = (
        gradient.numpy() for gradient in tape.gradient(terms.total, [agent.logits, agent.values])
    )

    pg, baseline, entropy, expected_grad, expected_grad_values, clip_ratios = _reference_loss(
        batch.steps, logits, values, config, proximal_logits
    )
    np.testing.assert_allclose(terms.policy_gradient, pg, rtol=1e-4)
    np.testing.assert_allclose(terms.baseline, baseline, rtol=1e-4)
    np.testing.assert_allclose(terms.entropy, entropy, rtol=1e-4)
    np.testing.assert_allclose(terms.total, pg + baseline + entropy, rtol=1e-4)
    np.testing.assert_allclose(grad_logits[:-1], expected_grad, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad_values[:-1], expected_grad_values, rtol=1e-4, atol=1e-5)
    # The bootstrap step is only evaluated: no gradient comes from it.
    np.testing.assert_array_equal(grad_logits[-1], 0.0)
    np.testing.assert_array_equal(grad_values[-1], 0.0)
    np.testing.assert_allclose(terms.target_logits, logits[:-1])
    # The statistic: the share of the T x B ratios that a clip acts on (pi / mu for V-trace's).
    if policy_clip:
        clipped = np.abs(clip_ratios - 1) > policy_clip
    else:
        taken = batch.steps.action[:-1, :, None]
        log_pi = np.take_along_axis(_log_softmax(logits[:-1].astype(np.float64)), taken, -1)
        log_mu = np.take_along_axis(_log_softmax(batch.steps.policy_logits[:-1]), taken, -1)
        clipped = np.exp(log_pi - log_mu) > 1
    if center == "learner" and not proximal:
        assert clipped.mean() == 0  # the first step's ratios are all 1
    else:
        assert 0 < clipped.mean() < 1
    np.testing.assert_allclose(terms.clipped_fraction, clipped.mean(), rtol=1e-6)


def test_policy_clip_flattens_the_objective_where_the_ratio_left_its_range():
    """A ratio of 2 with a positive advantage is clipped at 1.2: no gradient, loss -1.2 * A;
    with a negative advantage the unclipped term is the smaller one and keeps its gradient."""
    log_rhos = tf.Variable(np.log([[2.0, 2.0, 1.0]]).astype(np.float32))
    advantages = tf.constant([[1.5, -1.5, 1.0]])
    with tf.GradientTape() as tape:
        policy_loss = loss.compute_clipped_policy_loss(log_rhos, advantages, 0.2)
    np.testing.assert_allclose(policy_loss, -(1.2 * 1.5 + 2.0 * -1.5 + 1.0), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(policy_loss, log_rhos), [[0.0, 3.0, -1.0]], rtol=1e-6)


def test_policy_gradient_raises_the_probability_of_a_rewarded_action():
    """One step, one environment: the action that was paid +1 becomes likelier, by the sign."""
    steps = Steps(
        prev_action=np.zeros((2, 1), np.int32),
        reward=np.array([[0.0], [1.0]], np.float32),
        done=np.array([[True], [True]]),  # the episode ends after the action: no bootstrap
        observation=np.zeros((2, 1, 4), np.float32),
        action=np.array([[2], [0]], np.int32),
        policy_logits=np.zeros((2, 1, 3), np.float32),
    )
    agent = _FixedOutputAgent(np.zeros((2, 1, 3), np.float32), np.zeros((2, 1), np.float32))
    config = dataclasses.replace(PAPER, entropy_cost=0.0, baseline_cost=0.0)
    with tf.GradientTape() as tape:
        total = loss.compute_loss(agent, trajectory.Batch((), steps), config).total
    gradient = tape.gradient(total, agent.logits).numpy()[0, 0]
    # Gradient descent moves the logits against the gradient: action 2 up, the others down.
    np.testing.assert_allclose(-gradient, [-1 / 3, -1 / 3, 2 / 3], rtol=1e-5)


def test_learning_rate_anneals_linearly_to_zero():
    config = dataclasses.replace(PAPER, learning_rate=0.001, total_environment_frames=1000)
    assert float(optimise.annealed_learning_rate(config, 0)) == pytest.approx(0.001)
    assert float(optimise.annealed_learning_rate(config, 250)) == pytest.approx(0.00075)
    assert float(optimise.annealed_learning_rate(config, 1000)) == 0.0
    assert float(optimise.annealed_learning_rate(config, 5000)) == 0.0
    # A horizon of its own: a run stopped at its budget trains with a longer run's schedule.
    longer = dataclasses.replace(config, learning_rate_anneal_frames=4000)
    assert float(optimise.annealed_learning_rate(longer, 1000)) == pytest.approx(0.00075)
    assert float(optimise.annealed_learning_rate(longer, 4000)) == 0.0
    # A budget longer than the anneal anneals over the budget: no frames trained at a rate of 0.
    longer_budget = dataclasses.replace(longer, total_environment_frames=8000)
    assert float(optimise.annealed_learning_rate(longer_budget, 4000)) == pytest.approx(0.0005)
    assert float(optimise.annealed_learning_rate(longer_budget, 8000)) == 0.0


def test_with_a_cooldown_the_learning_rate_holds_then_falls_to_zero_at_the_anneals_end():
    config = dataclasses.replace(
        PAPER, learning_rate=0.001, total_environment_frames=1000, learning_rate_cooldown_frames=400
    )
    for frames, rate in [(0, 0.001), (600, 0.001), (700, 0.00075), (900, 0.00025), (1000, 0.0)]:
        assert float(optimise.annealed_learning_rate(config, frames)) == pytest.approx(rate)
    assert float(optimise.annealed_learning_rate(config, 5000)) == 0.0
    # An anneal longer than the budget ends it, not the budget: a run stopped at its budget
    # trains with a longer run's schedule, here into its cooldown.
    longer = dataclasses.replace(
        config, total_environment_frames=3700, learning_rate_anneal_frames=4000
    )
    assert float(optimise.annealed_learning_rate(longer, 3600)) == pytest.approx(0.001)
    assert float(optimise.annealed_learning_rate(longer, 3800)) == pytest.approx(0.0005)
    # A cooldown as long as the anneal or longer (a short run of a long-cooldown schedule)
    # falls from the start, as without one.
    for cooldown in (1000, 10**9):
        whole = dataclasses.replace(config, learning_rate_cooldown_frames=cooldown)
        assert float(optimise.annealed_learning_rate(whole, 250)) == pytest.approx(0.00075)


@pytest.mark.parametrize(
    "cooldown,flag",
    [
        ({"learning_rate_cooldown_frames": 3_000_000}, "--learning_rate_cooldown_frames=3000000"),
        ({"learning_rate_cooldown_fraction": 0.15}, "--learning_rate_cooldown_fraction=0.15"),
    ],
)
def test_a_cooldown_that_would_begin_after_the_budget_is_a_one_line_error(cooldown, flag):
    # Meant for a 10M-frame budget, on a 200M-frame horizon: the rate would never fall.
    with pytest.raises(ValueError) as raised:
        LearnerConfig(
            total_environment_frames=10_000_000,
            learning_rate_anneal_frames=200_000_000,
            **cooldown,
        )
    message = str(raised.value)
    assert message.startswith(f"{flag}: the learning rate would begin to fall at ")
    assert "after the --total_environment_frames=10000000 budget" in message
    assert message.endswith(
        "give --learning_rate_anneal_frames=0 for a cooldown that ends with the budget, or "
        "--learning_rate_cooldown_fraction=0 to anneal over the whole horizon"
    )
    assert "\n" not in message
    # Over the budget itself, the same cooldowns end with the run.
    LearnerConfig(total_environment_frames=10_000_000, **cooldown)


def test_a_cooldown_given_as_a_share_of_the_anneal_scales_with_the_budget():
    # On a 10M-frame budget, 0.3 is the 3M-frame cooldown exactly, at every frame count.
    share = LearnerConfig(
        learning_rate=0.001,
        total_environment_frames=10_000_000,
        learning_rate_cooldown_fraction=0.3,
    )
    frames = dataclasses.replace(
        share, learning_rate_cooldown_fraction=0.0, learning_rate_cooldown_frames=3_000_000
    )
    for at in (0, 6_999_999, 7_000_000, 7_654_321, 9_999_999, 10_000_000, 10**9):
        assert float(optimise.annealed_learning_rate(share, at)) == float(
            optimise.annealed_learning_rate(frames, at)
        )
    # On a 200M-frame budget it holds for 140M frames, then falls over the last 60M.
    longer = dataclasses.replace(share, total_environment_frames=200_000_000)
    for at, rate in [(10_000_000, 0.001), (140_000_000, 0.001), (170_000_000, 0.0005)]:
        assert float(optimise.annealed_learning_rate(longer, at)) == pytest.approx(rate)
    # A share of 1 falls from the start, PPO's schedule.
    whole = dataclasses.replace(share, learning_rate_cooldown_fraction=1.0)
    assert float(optimise.annealed_learning_rate(whole, 2_500_000)) == pytest.approx(0.00075)
    # A cooldown in frames takes the share's place.
    both = dataclasses.replace(share, learning_rate_cooldown_frames=1_000_000)
    assert float(optimise.annealed_learning_rate(both, 8_500_000)) == pytest.approx(0.001)
    assert float(optimise.annealed_learning_rate(both, 9_500_000)) == pytest.approx(0.0005)


def test_the_entropy_weight_follows_its_schedule_and_then_stays():
    constant = LearnerConfig(entropy_cost=0.02, entropy_cost_final=0.005)
    assert float(optimise.scheduled_entropy_cost(constant, 10**9)) == pytest.approx(0.02)
    scheduled = LearnerConfig(
        entropy_cost=0.02, entropy_cost_final=0.005, entropy_cost_anneal_frames=1000
    )
    for frames, weight in [(0, 0.02), (400, 0.014), (1000, 0.005), (10**9, 0.005)]:
        assert float(optimise.scheduled_entropy_cost(scheduled, frames)) == pytest.approx(weight)


def test_a_step_weighs_the_entropy_bonus_as_the_schedule_says_at_its_frames():
    rng = np.random.default_rng(4)
    batch = _batch(rng)
    # The loss is taken before the update, so fresh agents with the same weights show the
    # weight alone: a quarter of the way from 0.02 to 0.0, then past the schedule's end.
    entropy_terms = {}
    for name, entropy_cost_anneal_frames, frames in [
        ("constant", 0, 0),
        ("quarter", 4000, 1000),
        ("after", 4000, 9000),
    ]:
        config = LearnerConfig(
            entropy_cost=0.02,
            entropy_cost_final=0.004,
            entropy_cost_anneal_frames=entropy_cost_anneal_frames,
        )
        stats = optimise.Trainer(_mlp_agent(seed=5), config).step(batch, frames=frames)
        entropy_terms[name] = (stats["loss/entropy"], stats["entropy_cost"])
    constant, constant_weight = entropy_terms["constant"]
    assert constant < 0 and constant_weight == pytest.approx(0.02)
    assert entropy_terms["quarter"][1] == pytest.approx(0.016)
    assert entropy_terms["quarter"][0] == pytest.approx(constant * 0.8, rel=1e-5)
    assert entropy_terms["after"][1] == pytest.approx(0.004)
    assert entropy_terms["after"][0] == pytest.approx(constant * 0.2, rel=1e-5)


def test_step_reduces_loss_on_a_fixed_batch():
    rng = np.random.default_rng(1)
    agent = _mlp_agent()
    batch = _batch(rng, num_steps=8, batch_size=4)
    config = dataclasses.replace(
        PAPER, learning_rate=0.01, entropy_cost=0.0, total_environment_frames=10**9
    )
    trainer = optimise.Trainer(agent, config)
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
        config = dataclasses.replace(PAPER, gradients_clipping=clip, reward_clipping="none")
        stats = optimise.Trainer(agent, config).step(batch, frames=0)
        assert stats["gradient_norm"] > 1.0  # the unclipped norm is reported
        after = [v.numpy() for v in agent.trainable_variables]
        deltas[clip] = sum(np.sum(np.abs(a - b)) for a, b in zip(after, before, strict=True))
    assert deltas[1e-3] < deltas[-1.0]


def _reuse_by_hand(logits, values, batch, config, proximal_logits):
    """`config.batch_reuse` steps written out, each centred on `proximal_logits(first logits)`
    (None: on the policy of the step itself)."""
    agent = _FixedOutputAgent(logits, values)
    optimizer = optimise.make_optimizer(config, tf.Variable(config.learning_rate))
    centre = proximal_logits(tf.constant(logits[:-1]))
    for _ in range(config.batch_reuse):
        with tf.GradientTape() as tape:
            terms = loss.compute_loss(agent, batch, config, centre)
        gradients = tape.gradient(terms.total, agent.trainable_variables)
        gradients, _ = tf.clip_by_global_norm(gradients, config.gradients_clipping)
        optimizer.apply(gradients, agent.trainable_variables)
    return agent.logits.numpy()


def test_a_learner_centred_clip_holds_the_batchs_first_policy_through_its_steps():
    """Every step on a batch clips around the learner's policy as the batch arrived, not
    around the policy of the step before (which would never clip) nor the behaviour's."""
    rng = np.random.default_rng(9)
    batch = _batch(rng, num_steps=6, batch_size=4)
    logits = rng.normal(size=(7, 4, 3)).astype(np.float32)
    values = rng.normal(size=(7, 4)).astype(np.float32)
    config = LearnerConfig(
        optimizer="adam",
        learning_rate=0.2,  # large enough that a few steps carry ratios past the clip
        epsilon=1e-5,
        decay=0.999,
        policy_clip=0.1,
        policy_clip_center="learner",
        normalize_advantages=True,
        batch_reuse=3,
        total_environment_frames=10**9,
    )
    agent = _FixedOutputAgent(logits, values)
    stats = optimise.Trainer(agent, config).learn(batch, frames=0)
    assert stats["clipped_fraction"] > 0  # the last step's ratios left the clip's range

    held = _reuse_by_hand(logits, values, batch, config, lambda first: first)
    np.testing.assert_allclose(agent.logits.numpy(), held, rtol=1e-5, atol=1e-6)
    recentred = _reuse_by_hand(logits, values, batch, config, lambda first: None)
    assert np.abs(held - recentred).max() > 1e-3


def _minibatches_by_hand(agent, batch, config, seed):
    """`config.batch_reuse` passes over `batch` written out: each pass takes the trajectories
    in a new order of a generator seeded `seed`, `config.num_batches_per_epoch` at a time, one
    step each, clipped at the minibatch's share of the threshold and, with a learner-centred
    clip, centred on the policy before the batch's first step."""
    optimizer = optimise.make_optimizer(config, tf.Variable(config.learning_rate))
    size, parts = batch.steps.reward.shape[1], config.num_batches_per_epoch
    inputs = networks.make_input(*(batch.steps[i] for i in (0, 1, 2, 3)))
    centre = agent.unroll(inputs, ())[0].policy_logits[:-1].numpy()
    order = np.random.default_rng(seed)
    for _ in range(config.batch_reuse):
        shuffled = order.permutation(size)
        for part in np.split(shuffled, parts):
            minibatch = batch._replace(steps=Steps(*(x[:, part] for x in batch.steps)))
            proximal = centre[:, part] if config.policy_clip_center == "learner" else None
            with tf.GradientTape() as tape:
                terms = loss.compute_loss(agent, minibatch, config, proximal)
            gradients = tape.gradient(terms.total, agent.trainable_variables)
            threshold = config.gradients_clipping * len(part) / size
            gradients, _ = tf.clip_by_global_norm(gradients, threshold)
            optimizer.apply(gradients, agent.trainable_variables)
    return [v.numpy() for v in agent.trainable_variables]


@pytest.mark.parametrize("centre", ["behaviour", "learner"])
def test_minibatches_take_every_trajectory_once_a_pass_in_a_new_order(centre):
    rng = np.random.default_rng(11)
    batch = _batch(rng, num_steps=6, batch_size=8)
    config = LearnerConfig(
        batch_reuse=3,
        num_batches_per_epoch=4,
        learning_rate=0.05,
        gradients_clipping=2.0,  # below the norms here: each minibatch clips at its share
        policy_clip_center=centre,
        total_environment_frames=10**9,
    )
    agent = _mlp_agent(seed=5)
    trainer = optimise.Trainer(agent, config, seed=7)
    stats = trainer.learn(batch, frames=0)
    assert int(trainer.optimizer.step) == 12 and stats["skipped_steps"] == 0
    assert stats["gradient_norm"] > 2.0 * 2 / 8
    by_hand = _minibatches_by_hand(_mlp_agent(seed=5), batch, config, seed=7)
    # Twelve Adam steps in a traced function and eagerly differ by float32 rounding only.
    for mine, theirs in zip(agent.trainable_variables, by_hand, strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs, rtol=1e-4, atol=2e-5)
    # The next batch is taken in another order: the same weights and batch, another seed,
    # give other weights.
    other = _mlp_agent(seed=5)
    optimise.Trainer(other, config, seed=8).learn(batch, frames=0)
    moved = [
        np.abs(a.numpy() - b).max() for a, b in zip(other.trainable_variables, by_hand, strict=True)
    ]
    assert max(moved) > 1e-4


def test_one_minibatch_a_pass_is_the_whole_batch_as_before():
    rng = np.random.default_rng(12)
    batch = _batch(rng, num_steps=6, batch_size=4)
    config = LearnerConfig(batch_reuse=2, total_environment_frames=10**9)
    weights = []
    for learn in ("learn", "step"):
        agent = _mlp_agent(seed=6)
        trainer = optimise.Trainer(agent, config, seed=1)
        if learn == "learn":
            trainer.learn(batch, frames=0)
        else:
            trainer.step(batch, frames=0)
            trainer.step(batch, frames=0)
        weights.append([v.numpy() for v in agent.trainable_variables])
    for first, second in zip(*weights, strict=True):
        np.testing.assert_array_equal(first, second)


def _lstm_agent_and_steps(rng, batch_size):
    """A ShallowLSTMAgent and [4, batch_size] steps of Atari-sized observations."""
    tf.random.set_seed(4)
    agent = networks.make_agent("ShallowLSTMAgent", 3)
    networks.build_variables(agent, (84, 84, 4), np.uint8)
    steps = _batch(rng, num_steps=3, batch_size=batch_size).steps
    observations = rng.integers(0, 255, (4, batch_size, 84, 84, 4)).astype(np.uint8)
    return agent, steps._replace(observation=observations)


def test_minibatches_of_a_recurrent_agent_take_their_trajectories_state():
    rng = np.random.default_rng(13)
    agent, steps = _lstm_agent_and_steps(rng, batch_size=4)
    state = tf.nest.map_structure(
        lambda x: tf.constant(rng.normal(size=x.shape).astype(np.float32)),
        agent.initial_state(4),
    )
    batch = trajectory.Batch(agent_state=state, steps=steps)
    part = tf.constant([2, 0])
    taken = optimise.trajectories(batch, part)
    for mine, whole in zip(tf.nest.flatten(taken.agent_state), tf.nest.flatten(state), strict=True):
        np.testing.assert_array_equal(mine.numpy(), tf.gather(whole, part).numpy())
    np.testing.assert_array_equal(taken.steps.observation, steps.observation[:, [2, 0]])
    config = LearnerConfig(num_batches_per_epoch=2, batch_reuse=1, total_environment_frames=10**9)
    stats = optimise.Trainer(agent, config).learn(batch, frames=0)
    assert stats["skipped_steps"] == 0 and np.isfinite(stats["loss/total"])


def test_outputs_its_actors_would_be_refused_for_are_found_on_a_batch():
    """A PBT copy is checked with it: weights whose logits pass the bound an actor's chunk is
    refused for would leave the learners waiting for a batch that never comes."""
    agent = _mlp_agent()
    batch = _batch(np.random.default_rng(0))
    assert learner_steps.outputs_out_of_bounds(agent, batch) is None
    (head,) = [v for v in agent.trainable_variables if v.name.endswith("policy/w:0")]
    kept = head.numpy()
    for weights, said in [(kept * 1e5, "reach"), (np.full_like(kept, np.nan), "not finite")]:
        head.assign(weights)
        problem = learner_steps.outputs_out_of_bounds(agent, batch)
        head.assign(kept)
        assert problem.startswith("its policy logits on the last batch ") and said in problem

    recurrent, steps = _lstm_agent_and_steps(np.random.default_rng(13), batch_size=2)
    state = tf.nest.map_structure(
        lambda x: tf.fill(x.shape, 5e6), recurrent.initial_state(2)
    )  # an LSTM's cell keeps what it had, scaled by its forget gate: past the bound of 1e6
    problem = learner_steps.outputs_out_of_bounds(
        recurrent, trajectory.Batch(agent_state=state, steps=steps._replace(done=steps.done * 0))
    )
    assert problem and problem.startswith("its recurrent state on the last batch reach")


def test_create_optimizer_slots_keeps_weights():
    agent = _mlp_agent()
    before = [v.numpy() for v in agent.trainable_variables]
    trainer = optimise.Trainer(agent, LearnerConfig())
    trainer.create_optimizer_slots()
    assert trainer.optimizer.variables  # slots exist
    for variable, value in zip(agent.trainable_variables, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)
    assert float(trainer.learning_rate) == pytest.approx(LearnerConfig().learning_rate)


def test_set_hyperparameters_moves_the_schedules_at_the_next_step_without_a_new_trace():
    """What population-based training changes between steps, the learning rate and the entropy
    cost the schedules start from, takes effect at the next step, in the step traced before."""
    rng = np.random.default_rng(10)
    batch = _batch(rng)
    config = dataclasses.replace(
        PAPER, learning_rate=0.001, entropy_cost=0.01, total_environment_frames=1000
    )
    trainer = optimise.Trainer(_mlp_agent(seed=5), config)
    trainer.create_optimizer_slots()  # as the learner does: no variable is made in the step
    # At the budget's end the rate is 0: the weights stay as they are, so that the entropy term
    # shows its weight alone.
    before = trainer.step(batch, frames=1000)
    trainer.set_hyperparameters(learning_rate=0.004, entropy_cost=0.03)
    after = trainer.step(batch, frames=1000)
    assert (before["entropy_cost"], after["entropy_cost"]) == pytest.approx((0.01, 0.03))
    assert after["loss/entropy"] == pytest.approx(3 * before["loss/entropy"], rel=1e-5)
    halfway = trainer.step(batch, frames=500)
    assert halfway["learning_rate"] == pytest.approx(0.002)  # half of the new base rate
    assert trainer._train_step.experimental_get_tracing_count() == 1
    # A value the flag would refuse is refused in its line, and changes nothing.
    with pytest.raises(ValueError, match=r"^--learning_rate=-1\.0: must be a finite number > 0$"):
        trainer.set_hyperparameters(learning_rate=-1.0)
    with pytest.raises(TypeError):
        trainer.set_hyperparameters(batch_size=8)  # not one a run changes while it goes
    assert trainer.hyperparameters == optimise.Hyperparameters(0.004, 0.03)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("batch_size", 0, "--batch_size=0: must be at least 1"),
        ("reward_clipping", "tanh", "--reward_clipping=tanh: must be one of"),
        ("discounting", 1.5, "--discounting=1.5"),
        ("vtrace_lambda", -0.5, "--vtrace_lambda=-0.5: must be in [0, 1]"),
        ("policy_clip", 1.0, "--policy_clip=1.0: must be in [0, 1)"),
        ("learning_rate_anneal_frames", -1, "--learning_rate_anneal_frames=-1: must be >= 0"),
        ("learning_rate_cooldown_frames", -1, "--learning_rate_cooldown_frames=-1: must be >= 0"),
        (
            "learning_rate_cooldown_fraction",
            1.5,
            "--learning_rate_cooldown_fraction=1.5: must be in [0, 1]",
        ),
        (
            "learning_rate_cooldown_fraction",
            float("nan"),
            "--learning_rate_cooldown_fraction=nan: must be in [0, 1]",
        ),
        ("policy_clip", float("nan"), "--policy_clip=nan: must be in [0, 1)"),
        ("policy_clip_center", "mu", "--policy_clip_center=mu: must be one of behaviour, learner"),
        ("epsilon", 0.0, "--epsilon=0.0"),
        ("epsilon", float("inf"), "--epsilon=inf: must be a finite number > 0"),
        ("learning_rate", float("nan"), "--learning_rate=nan: must be a finite number > 0"),
        ("learning_rate", float("inf"), "--learning_rate=inf: must be a finite number > 0"),
        ("entropy_cost", float("inf"), "--entropy_cost=inf: must be a finite number >= 0"),
        (
            "entropy_cost_final",
            -0.01,
            "--entropy_cost_final=-0.01: must be a finite number >= 0",
        ),
        ("entropy_cost_final", float("nan"), "--entropy_cost_final=nan: must be a finite number"),
        ("entropy_cost_final", float("inf"), "--entropy_cost_final=inf: must be a finite number"),
        (
            "entropy_cost_anneal_frames",
            -1,
            "--entropy_cost_anneal_frames=-1: must be >= 0 (0: --entropy_cost throughout)",
        ),
        ("baseline_cost", float("nan"), "--baseline_cost=nan: must be a finite number >= 0"),
        ("gradients_clipping", float("nan"), "--gradients_clipping=nan: must be a number"),
        ("decay", float("nan"), "--decay=nan: must be in [0, 1)"),
        ("discounting", float("nan"), "--discounting=nan: must be in [0, 1]"),
    ],
)
def test_config_errors_name_the_flag(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LearnerConfig(**{field: value})


def test_adam_is_a_choice_and_batch_reuse_takes_that_many_steps():
    rng = np.random.default_rng(4)
    batch = _batch(rng, num_steps=8, batch_size=4)
    config = LearnerConfig(
        optimizer="adam", epsilon=1e-8, decay=0.999, batch_reuse=3, entropy_cost=0.0
    )
    trainer = optimise.Trainer(_mlp_agent(), config)
    assert isinstance(trainer.optimizer, snt.optimizers.Adam)
    first = trainer.learn(batch, frames=0)
    assert int(trainer.optimizer.step) == 3
    for _ in range(10):
        last = trainer.learn(batch, frames=0)
    assert int(trainer.optimizer.step) == 33
    assert last["loss/baseline"] < first["loss/baseline"]
    with pytest.raises(ValueError, match="--optimizer=sgd: must be one of rmsprop, adam"):
        LearnerConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="--batch_reuse=0: must be at least 1"):
        LearnerConfig(batch_reuse=0)
    with pytest.raises(ValueError, match="--num_batches_per_epoch=0: must be at least 1"):
        LearnerConfig(num_batches_per_epoch=0)
    with pytest.raises(
        ValueError, match=r"--num_batches_per_epoch=3: must divide --batch_size=16 \(minibatches"
    ):
        LearnerConfig(num_batches_per_epoch=3)
    with pytest.raises(ValueError, match=r"--momentum=0\.9: is RMSProp.s; --optimizer=adam"):
        LearnerConfig(optimizer="adam", momentum=0.9)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "queue_capacity",
            3,
            "--queue_capacity=3: must be 0 or at least --batch_size=16, or no batch ever fills",
        ),
        ("keep_checkpoints", 0, "--keep_checkpoints=0: must be at least 1"),
        (
            "keep_checkpoint_every_frames",
            float("inf"),
            "--keep_checkpoint_every_frames=inf: must be 0 (none) or a finite number of frames",
        ),
        ("save_every_secs", float("nan"), "--save_every_secs=nan: must be a finite number > 0"),
        ("num_action_repeats", 0, "--num_action_repeats=0: must be at least 1"),
        ("seed", -1, "--seed=-1: must be >= 0"),
        ("repeat_action_probability", 1.0, "--repeat_action_probability=1.0: must be a number"),
        ("frame_skip", True, "--frame_skip=True: must be 0 (the default: 4, DeepMind's) or"),
        ("frame_pooling", "", "--frame_pooling='': must be one of max, last (max: the maximum"),
        ("replay_parameters", "[", "--replay_parameters: not JSON (Expecting value at"),
        (
            "replay_parameters",
            '[{"type": "standard", "capacity": 9, "sample_ratio": 1}]',
            "--replay_parameters: needs exactly one queue replay",
        ),
        (
            "replay_parameters",
            '[{"type": "queue", "capacity": 1, "sample_ratio": 0.99},'
            ' {"type": "standard", "capacity": 9, "sample_ratio": 0.01}]',
            "--replay_parameters: replay 2 (standard): a sample_ratio of 0.01 gives no "
            "trajectory of a batch of 16",
        ),
    ],
)
def test_a_learner_refuses_its_job_flags_in_the_launchers_line(field, value, message):
    # The learner's own check, for a learner started by hand: the launchers give the same line.
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        _learner_job(**{field: value})


def test_with_replays_the_queues_capacity_is_its_entrys():
    replays = (
        '[{"type": "queue", "capacity": 3, "sample_ratio": 0.25},'
        ' {"type": "standard", "capacity": 9, "sample_ratio": 0.75}]'
    )
    assert [r.type for r in _learner_job(replay_parameters=replays).replays] == [
        "queue",
        "standard",
    ]
    # The default mixes: half of each batch replayed uniformly; '' takes every trajectory fresh.
    assert [r.type for r in _learner_job().replays] == ["queue", "standard"]
    assert _learner_job(replay_parameters="").replays == ()
    with pytest.raises(ValueError, match=r"^--queue_capacity=32: with --replay_parameters the"):
        _learner_job(replay_parameters=replays, queue_capacity=32)


_GAME_SETTINGS = {field.name for field in dataclasses.fields(GameConfig)}


def _learner_job(**settings) -> LearnerJobConfig:
    """A learner's job config with these job and game settings."""
    game = {name: value for name, value in settings.items() if name in _GAME_SETTINGS}
    job = {name: value for name, value in settings.items() if name not in _GAME_SETTINGS}
    return LearnerJobConfig(
        game=GameConfig(**game),
        agent_name="MLPAgent",
        learner_hosts=("localhost:8001",),
        learner=LearnerConfig(batch_size=16),
        secret_file="secret",
        **job,
    )


def test_a_learner_refuses_sticky_actions_its_actors_would_refuse():
    # Else a run of a non-Atari id with sticky actions would wait for ever on actors that quit.
    config = _learner_job(level_name="CartPole-v1", repeat_action_probability=0.25)
    with pytest.raises(ValueError, match=r"^--repeat_action_probability=0\.25: .*not an Atari id"):
        start.build_agent(config)


def _learner_environment(level_name: str, **settings):
    """What a learner's `build_agent` read from the environment it built with `settings`."""
    return start.build_agent(_learner_job(level_name=level_name, **settings))[0]


def test_a_learner_builds_its_environment_with_the_frame_skip():
    # Its identity's frames per step, which actors must match, and the refusal of other ids.
    assert _learner_environment("PongNoFrameskip-v4", frame_skip=0).frames_per_step == 4
    assert _learner_environment("PongNoFrameskip-v4", frame_skip=3).frames_per_step == 3
    with pytest.raises(ValueError, match=r"^--frame_skip=3: .*not an Atari id"):
        _learner_environment("CartPole-v1", frame_skip=3)


def test_a_learner_builds_its_environment_with_the_frame_pooling():
    # Its identity's frame pooling, which actors must match, and the refusal of other ids.
    for frame_pooling in ("max", "last"):
        built = _learner_environment("PongNoFrameskip-v4", frame_pooling=frame_pooling)
        assert built.frame_pooling == frame_pooling
    with pytest.raises(ValueError, match=r"^--frame_pooling=last: .*not an Atari id"):
        _learner_environment("CartPole-v1", frame_pooling="last")


def _run_tls(tmp_path, monkeypatch, rank, chief_digest=None):
    """Learner `rank`'s `load_run_tls` for a run folder in `tmp_path`, learner 0 holding a
    bundle of this digest of its authority (None: this learner's own)."""
    monkeypatch.setattr(allreduce, "wait_for_learners", lambda name: None)
    monkeypatch.setattr(
        allreduce, "broadcast_object_from_chief", lambda value: chief_digest or value
    )
    config = LearnerJobConfig(
        game=GameConfig(level_name="CartPole-v1"),
        agent_name="MLPAgent",
        learner_hosts=("localhost:8001", "localhost:8002"),
        logdir=str(tmp_path),
        transport_tls=True,
    )
    topology = allreduce.Topology(rank=rank, size=2, local_rank=rank)
    lines = []
    material = start.load_run_tls(config, str(tmp_path), topology, lines.append)
    return material, lines


def test_learner_0_makes_the_tls_bundle_beside_the_secret_and_the_others_read_it(
    tmp_path, monkeypatch
):
    path = run_tls.path_in(str(tmp_path))
    with pytest.raises(run_tls.TlsError, match="no TLS bundle here"):
        _run_tls(tmp_path, monkeypatch, rank=1)
    made, reports = _run_tls(tmp_path, monkeypatch, rank=0)
    assert reports == [
        f"TLS bundle created in {path} (owner-only); actors read it beside their --secret_file"
    ]
    assert run_tls.load(path) == made
    assert _run_tls(tmp_path, monkeypatch, rank=1)[0] == made
    with pytest.raises(run_tls.TlsError, match="learner 1 holds another TLS bundle than learner 0"):
        _run_tls(tmp_path, monkeypatch, rank=1, chief_digest="0" * 64)


# The flags' defaults (PPO's surrogate clipped around the behaviour policy, Adam), three steps a
# batch.
FLAG_DEFAULTS = LearnerConfig(batch_reuse=3)


def _behaviour_logits(batch, logit):
    """`batch` with behaviour logits of -`logit` on the action taken and +`logit` on another:
    mu(a) is e^(-2 logit) at most, finite numbers all, actions in range."""
    steps = batch.steps
    logits = np.full(steps.policy_logits.shape, -logit, np.float32)
    other = (steps.action + 1) % logits.shape[-1]
    np.put_along_axis(logits, other[..., None], np.float32(logit), axis=-1)
    return batch._replace(steps=steps._replace(policy_logits=logits))


def _trainer_state(agent, trainer):
    return [v.numpy().copy() for v in [*agent.variables, *trainer.optimizer.variables]]


def _built_trainer(config, every_learner=None):
    agent = _mlp_agent(seed=7)
    trainer = optimise.Trainer(agent, config, every_learner=every_learner)
    trainer.create_optimizer_slots()  # as the learner does, so that their state can be compared
    return agent, trainer


@pytest.mark.parametrize("logit", [1e30, trajectory.MAX_ABS_POLICY_LOGIT, 25.0])
def test_a_batch_whose_loss_or_gradients_are_not_finite_is_skipped_and_counted(logit):
    """The issue's attack: behaviour logits of +-1e30. Under the flags' defaults pi / mu =
    exp(2e30) is inf and, applied, the step made every weight NaN. Within the transport's bound
    (1e3), and at 25 where only the gradient's norm overflows, the step is not finite either:
    it is skipped, weights and optimizer state untouched, and counted."""
    rng = np.random.default_rng(5)
    sound = _batch(rng, num_steps=20, batch_size=16)
    agent, trainer = _built_trainer(FLAG_DEFAULTS)
    before = _trainer_state(agent, trainer)
    stats = trainer.learn(_behaviour_logits(sound, logit), frames=0)
    assert stats["skipped_steps"] == 3  # each of the batch's steps
    assert not np.isfinite(stats["loss/total"]) or not np.isfinite(stats["gradient_norm"])
    for value, was in zip(_trainer_state(agent, trainer), before, strict=True):
        np.testing.assert_array_equal(value, was)
    # The learner goes on: a sound batch trains as before.
    stats = trainer.learn(sound, frames=0)
    assert stats["skipped_steps"] == 0 and np.isfinite(stats["loss/total"])
    after = _trainer_state(agent, trainer)
    assert all(np.isfinite(value).all() for value in after)
    assert not np.array_equal(after[0], before[0])


def test_finite_steps_are_applied_whatever_the_behaviour_logits():
    """V-trace uses pi / mu clipped at 1 only, so the paper's loss is finite on the issue's
    batch: it is applied, as before. The skip is for steps that are not finite, nothing more."""
    rng = np.random.default_rng(6)
    batch = _behaviour_logits(_batch(rng, num_steps=20, batch_size=16), 1e30)
    agent, trainer = _built_trainer(PAPER)
    before = _trainer_state(agent, trainer)
    stats = trainer.step(batch, frames=0)
    assert stats["skipped_steps"] == 0 and np.isfinite(stats["gradient_norm"])
    after = _trainer_state(agent, trainer)
    assert all(np.isfinite(value).all() for value in after)
    assert not np.array_equal(after[0], before[0])


def test_a_learner_skips_a_step_another_learner_found_not_finite():
    """Horovod: each learner's loss is its own; the step is applied only where every learner's
    is finite (`allreduce.every_learner`), so all skip it together and stay identical. Here the
    other learners answer that one of theirs was not."""
    flags = []

    def another_learners_loss_was_not(flag):
        flags.append(flag)
        return tf.constant(False)

    rng = np.random.default_rng(8)
    agent, trainer = _built_trainer(PAPER, every_learner=another_learners_loss_was_not)
    before = _trainer_state(agent, trainer)
    assert trainer.step(_batch(rng), frames=0)["skipped_steps"] == 1
    for value, was in zip(_trainer_state(agent, trainer), before, strict=True):
        np.testing.assert_array_equal(value, was)
    assert flags and flags[0].dtype == tf.bool  # asked once as the step was traced


class _Games:
    """A service's `pop_episodes`: games with these returns, 100 frames each."""

    def __init__(self, returns):
        self._returns = np.asarray(returns, np.float64)

    def pop_episodes(self):
        count = len(self._returns)
        return transport.EpisodeBatch(
            actor_task=np.zeros(count, np.int32),
            episode_return=self._returns,
            episode_steps=np.full(count, 25),
            episode_frames=np.full(count, 100),
            start_frames=np.full(count, -1),
        )


def test_the_learner_leaves_out_and_counts_games_whose_return_is_absurd(monkeypatch):
    """The issue's game with a return of 1e30 made `best_mean_return` 5e28 (the transport now
    refuses it too): the learner's own statistics leave out and count what is not finite or
    beyond `MAX_ABS_EPISODE_RETURN`."""
    monkeypatch.setattr(allreduce, "gather_from_learners", lambda values, name: values)
    counters = learner_state.Counters()
    returns = [21.0, 1e30, float("nan"), -float("inf"), -trajectory.MAX_ABS_EPISODE_RETURN]
    episodes = learner_steps.gather_episodes(_Games(returns), counters)
    np.testing.assert_array_equal(episodes[:, 0], [21.0, -trajectory.MAX_ABS_EPISODE_RETURN])
    assert counters.episodes_ignored == 3
    assert learner_reports.skipped_text(counters) == ""
    counters.skipped_steps = 6
    assert learner_reports.skipped_text(counters) == " (6 steps skipped: not finite)"


def test_asynchronous_gradients_apply_each_steps_gradients_at_the_next_step():
    """--grad_workers_communication=asynchronous, with one learner (the all-reduce averages
    over itself): a step applies the gradients kept at the step before, so after two steps the
    weights are those one step of the synchronous trainer gives on the first batch; `flush`
    applies the second's. A non-finite kept step is skipped when it would be applied."""
    rng = np.random.default_rng(12)
    first, second = _batch(rng), _batch(rng)
    config = LearnerConfig(batch_reuse=1)
    synchronous = optimise.Trainer(_mlp_agent(seed=3), config)
    synchronous.create_optimizer_slots()
    agent = _mlp_agent(seed=3)
    trainer = optimise.Trainer(agent, config, delayed_reduce=lambda gradients: gradients)
    trainer.create_optimizer_slots()
    assert trainer.delays_gradients and not synchronous.delays_gradients
    initial = [v.numpy() for v in agent.trainable_variables]

    stats = trainer.step(first, frames=0)  # nothing kept yet: nothing applied
    assert stats["skipped_steps"] == 0 and stats["gradient_norm"] == 0
    for variable, value in zip(agent.trainable_variables, initial, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)
    expected = synchronous.step(first, frames=0)
    trainer.step(second, frames=0)  # applies the first batch's gradients
    for mine, theirs in zip(
        agent.trainable_variables, synchronous._agent.trainable_variables, strict=True
    ):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-7)
    assert expected["skipped_steps"] == 0
    applied = [v.numpy() for v in agent.trainable_variables]
    assert trainer.flush() == 0  # the second batch's, kept: applied now
    assert any(
        not np.array_equal(v.numpy(), a)
        for v, a in zip(agent.trainable_variables, applied, strict=True)
    )
    flushed = [v.numpy() for v in agent.trainable_variables]
    assert trainer.flush() == 0  # nothing kept: nothing changes
    for variable, value in zip(agent.trainable_variables, flushed, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)

    # A batch whose gradients are not finite is kept, then skipped when its turn comes.
    poisoned = _batch(rng)
    logits = np.full(poisoned.steps.policy_logits.shape, -1e30, np.float32)
    np.put_along_axis(logits, ((poisoned.steps.action + 1) % 3)[..., None], 1e30, axis=-1)
    poisoned = poisoned._replace(steps=poisoned.steps._replace(policy_logits=logits))
    assert trainer.step(poisoned, frames=0)["skipped_steps"] == 0  # kept, not yet applied
    assert trainer.step(first, frames=0)["skipped_steps"] == 1
    for variable, value in zip(agent.trainable_variables, flushed, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_the_policy_lag_counts_versions_ahead_of_the_learners_as_zero():
    """An actor's made-up version (2^62), or one from before the learner restarted from an
    earlier checkpoint, must not offset the real lag of the others into a negative mean."""
    from impala.learner.steps import policy_lag

    assert policy_lag(10, np.array([7, 9])) == 2.0
    assert policy_lag(10, np.array([7, 9, 2**62, 12])) == 1.0  # (3 + 1 + 0 + 0) / 4
    assert np.isnan(policy_lag(10, np.array([], np.int64)))
