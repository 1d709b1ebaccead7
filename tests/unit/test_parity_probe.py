"""benchmarks.parity_probe: a linear probe scored on games it was not fitted on."""

import numpy as np
import pytest

from benchmarks import parity_probe


def _loss(w, x, y, l2):
    """The probe's objective written out: class-balanced log loss plus the ridge on the
    weights (not the bias)."""
    z = np.hstack([x, np.ones((len(x), 1))]) @ w
    log_p, log_not_p = -np.logaddexp(0, -z), -np.logaddexp(0, z)
    per_example = -(y * log_p + (1 - y) * log_not_p)
    balanced = 0.5 * per_example[y].mean() + 0.5 * per_example[~y].mean()
    return balanced + 0.5 * l2 * np.sum(w[:-1] ** 2)


@pytest.mark.parametrize("separable", [True, False])
def test_the_probe_minimises_its_objective(separable):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    y = x @ [1.0, -2.0, 0.0, 0.5, 0.0] > (0.3 if separable else rng.normal(0, 2, 300))
    w = parity_probe.fit_probe(x, y, l2=0.01)
    # Classes of unequal size, each weighted to half the loss. At the minimum each weight's
    # finite-difference slope is 0 and a step off costs loss.
    for i in range(len(w)):
        step = np.eye(len(w))[i] * 1e-5
        slope = (_loss(w + step, x, y, 0.01) - _loss(w - step, x, y, 0.01)) / 2e-5
        assert abs(slope) < 1e-6
        assert _loss(w + 1e3 * step, x, y, 0.01) > _loss(w, x, y, 0.01)
    # The ridge keeps separable data's weights finite, and the direction is the one that made y.
    assert np.abs(w).max() < 100
    cosine = w[:4] @ [1.0, -2.0, 0.0, 0.5] / np.linalg.norm(w[:4]) / np.sqrt(5.25)
    assert cosine > 0.9


def test_a_probe_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        parity_probe.fit_probe(np.ones((4, 2)), np.zeros(4, bool))


def test_balanced_accuracy_weighs_each_class_alike():
    labels = np.array([True] * 8 + [False] * 2)
    # All odd right, one of two even right: (1 + 0.5) / 2.
    outputs = np.array([1.0] * 8 + [1.0, -1.0])
    assert parity_probe.balanced_accuracy(outputs, labels) == 0.75
    # Saying "odd" always is chance, whatever the classes' sizes.
    assert parity_probe.balanced_accuracy(np.ones(10), labels) == 0.5


def test_games_begun_on_the_same_frame_share_a_fold_and_every_fold_holds_both_parities():
    starts = np.arange(32)
    folds = parity_probe.folds_of(np.concatenate([starts, starts]))
    assert (folds[:32] == folds[32:]).all()
    for fold in range(parity_probe.FOLDS):
        assert set(starts[folds[:32] == fold] % 2) == {0, 1}
    parity_probe.check_starts(starts)


@pytest.mark.parametrize("starts", [[2, 4, 6, 8] * 8, [1, 3, 9, 11, 17, 19, 25, 27] + [0] * 8])
def test_too_few_games_of_a_parity_is_a_one_line_error(starts):
    with pytest.raises(ValueError) as error:
        parity_probe.check_starts(np.array(starts))
    assert "too few of one parity" in str(error.value) and "\n" not in str(error.value)


def _games(rng, starts, steps, signal):
    """Features for each step of games begun on `starts`: a noisy copy of the parity scaled by
    `signal`, and noise."""
    odd = np.repeat(np.asarray(starts) % 2 == 1, steps)
    return np.column_stack(
        [signal * (2.0 * odd - 1) + rng.normal(size=len(odd)), rng.normal(size=(len(odd), 3))]
    )


def test_the_score_tells_a_readable_parity_from_noise():
    rng = np.random.default_rng(1)
    starts = rng.integers(1, 31, 64)
    strong = parity_probe.score(_games(rng, starts, 10, 3.0), starts)
    assert strong.steps_right > 0.95 and strong.games_right == strong.games == 64
    noise = parity_probe.score(_games(rng, starts, 10, 0.0), starts)
    assert 0.4 < noise.steps_right < 0.6
    assert noise.games_right < 48


def test_a_probe_cannot_score_by_recognising_a_start_it_saw():
    # A feature naming each game's start frame tells the parity of every game whose start the
    # probe was fitted on; held out by start frame, it tells nothing.
    rng = np.random.default_rng(2)
    starts = np.repeat(np.arange(1, 31), 2)
    one_hot = np.repeat(np.eye(31)[starts], 5, axis=0)
    result = parity_probe.score(one_hot + 0.01 * rng.normal(size=one_hot.shape), starts)
    assert result.steps_right < 0.65


@pytest.mark.parametrize("agent_name", ["ShallowConvNetAgent", "ShallowConvNetLastActionAgent"])
def test_the_torso_features_are_those_the_agents_heads_read(agent_name):
    import networks
    from impala import envs

    agent = networks.make_agent(agent_name, 6)
    networks.build_variables(agent, (84, 84, 4), "uint8")
    rng = np.random.default_rng(3)
    observation = rng.integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    prev_action = np.array([5, 2, 4])
    done = np.array([True, False, False])  # a game's first step shows no action
    step = envs.StepOutput(np.zeros(3, np.float32), done, observation)
    features = parity_probe._torso_features(agent, step, prev_action)
    output, _ = agent(networks.make_input(prev_action, step.reward, done, observation), ())
    np.testing.assert_allclose(
        agent._head(features).policy_logits.numpy(), output.policy_logits.numpy(), rtol=1e-5
    )
