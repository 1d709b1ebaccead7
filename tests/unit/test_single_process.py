"""--job_name=local: the actor and the learner in one process, taking turns."""

import numpy as np

import networks
from impala import single_process
from impala.configs import GameConfig, LearnerConfig


def _catch(log_every_secs, **learner):
    """Catch with the MLP agent and the learner settings given."""
    return single_process.LocalConfig(
        game=GameConfig(level_name="impala/Catch-v0"),
        agent_name="MLPAgent",
        log_every_secs=log_every_secs,
        learner=LearnerConfig(**learner),
    )


def test_trains_to_its_budget_and_reports_the_games_played():
    config = _catch(
        0.0, batch_size=4, unroll_length=10, learning_rate=0.001, total_environment_frames=2000
    )
    lines = []
    env, agent = single_process.build(config)
    before = [v.numpy().copy() for v in agent.trainable_variables]
    with env:
        progress = single_process.train(config, env, agent, report=lines.append)
    assert env.num_envs == 4  # one actor stepping a whole batch of environments
    assert progress.done and progress.frames == 2000  # 50 batches of 4 x 10 steps
    assert lines[0].startswith("training MLPAgent on impala/Catch-v0 in one process: 40 ")
    assert len(lines) == 51  # the start, then one progress line per batch here
    # Catch games last 9 steps: every environment finished several, each scoring -1 or +1.
    assert progress.episodes >= 4 * 4
    assert -1.0 <= progress.mean_return <= 1.0
    after = agent.trainable_variables
    assert any(not (b == a.numpy()).all() for b, a in zip(before, after, strict=True))


def test_plays_with_the_sticky_actions_and_frame_skip_it_is_given():
    config = single_process.LocalConfig(
        game=GameConfig(
            level_name="PongNoFrameskip-v4", repeat_action_probability=0.25, frame_skip=3
        ),
        agent_name="MLPAgent",
        learner=LearnerConfig(batch_size=2),
    )
    env, _ = single_process.build(config)
    with env:
        assert env.config.repeat_action_probability == 0.25
        assert env.frames_per_step == 3


def test_every_step_it_trains_on_was_decided_with_the_weights_it_trains(monkeypatch):
    """No policy lag, the first step of each unroll included (decided again after each update,
    not kept from the weights before): the behaviour logits are the network's under the weights
    each batch is learned with."""
    seen = []

    class Recording(single_process.Trainer):
        def learn(self, batch, frames):
            seen.append((batch, [v.numpy().copy() for v in self._agent.variables]))
            return super().learn(batch, frames)

    monkeypatch.setattr(single_process, "Trainer", Recording)
    config = _catch(
        1e9, batch_size=2, unroll_length=5, learning_rate=0.01, total_environment_frames=100
    )
    env, agent = single_process.build(config)
    with env:
        single_process.train(config, env, agent, report=lambda line: None)
    assert len(seen) == 10
    for batch, weights in seen:
        for variable, value in zip(agent.variables, weights, strict=True):
            variable.assign(value)
        steps = batch.steps
        inputs = networks.AgentInput(steps.prev_action, steps.reward, steps.done, steps.observation)
        outputs, _ = agent.unroll(inputs, batch.agent_state)
        np.testing.assert_allclose(outputs.policy_logits[:-1], steps.policy_logits[:-1], atol=1e-5)
