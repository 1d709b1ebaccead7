"""The actor: steps a vector of environments with the policy and cuts the stream into unrolls.

An unroll holds `T + 1` time steps for each of the actor's `B` environments. Consecutive unrolls
overlap by one step, as in IMPALA: the last step of one unroll is the first step of the next, so the
learner can bootstrap from it and evaluate the policy on every action exactly once. That step's
action is taken only when the next unroll begins; an actor may decide it again in between, with
newer weights (`Actor.decide_first_step_again`), and then the two unrolls agree on its
observation, reward and `done` but not on its action and logits (the first unroll's, never taken,
are never trained on).

What each time step of an unroll holds is told in `impala.trajectory`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import networks
from impala import envs
from impala.trajectory import Steps, Unroll


class Actor:
    """Runs the behaviour policy on a vector of environments, producing overlapping unrolls.

    The policy runs on the whole batch of environments at once; recurrent state is carried across
    unrolls. Weights are set from outside (`set_weights`), between unrolls.
    """

    def __init__(
        self,
        env: envs.VectorEnvironment,
        agent: networks.Agent,
        unroll_length: int,
        seed: int,
    ):
        """Creates the actor and resets the environments.

        Args:
          env: the environments to step; the actor does not own them (the caller closes them).
          agent: the policy network; its variables are created here.
          unroll_length: T, the number of new time steps in each unroll.
          seed: seeds action sampling.
        """
        if unroll_length < 1:
            raise ValueError(f"unroll_length must be at least 1, got {unroll_length}")
        self._env = env
        self._agent = agent
        self._unroll_length = unroll_length
        self._rng = tf.random.Generator.from_seed(seed)
        self._policy = tf.function(self._policy_step, autograph=False)  # no tensor control flow
        self._core_state = agent.initial_state(env.num_envs)
        self.weight_version = -1
        first = env.reset()
        self._last_step = self._act(
            prev_action=np.zeros(env.num_envs, np.int32),
            reward=first.reward,
            done=np.ones(env.num_envs, bool),  # every environment starts an episode
            observation=first.observation,
        )

    @property
    def variables(self) -> tuple[tf.Variable, ...]:
        return self._agent.variables

    def set_weights(self, weights: list[np.ndarray], version: int) -> None:
        """Loads learner weights (in `variables` order) tagged with the learner's version."""
        for variable, value in zip(self._agent.variables, weights, strict=True):
            variable.assign(value)
        self.weight_version = version

    def unroll(self) -> Unroll:
        """Steps the environments T times and returns the T + 1 step unroll."""
        initial_state = tf.nest.map_structure(lambda t: t.numpy(), self._core_state_before_last)
        time_steps = [self._last_step]
        for _ in range(self._unroll_length):
            previous = time_steps[-1]
            env_output = self._env.step(previous.action)
            time_steps.append(
                self._act(
                    prev_action=previous.action,
                    reward=env_output.reward,
                    done=env_output.done,
                    observation=env_output.observation,
                )
            )
        self._last_step = time_steps[-1]
        return Unroll(
            agent_state=initial_state,
            steps=Steps(*(np.stack(field) for field in zip(*time_steps, strict=True))),
            weight_version=self.weight_version,
        )

    def decide_first_step_again(self) -> None:
        """Decides the next unroll's first step again, with the weights set now.

        The unroll just returned decided that step as its last one, with the weights it was
        acted with; its action is taken only when the next unroll begins, and the learner trains
        on an unroll's steps 0 to T - 1 (step T only bootstraps: its observation, not its
        action), so deciding it again changes nothing the sent unroll says. Synchronous
        collection does before each unroll whose first step an older version decided
        (`first_step_version`), so that every step the learner trains on was decided with the
        weights it holds (else the first of each unroll's T steps was one version behind); so
        does the first unroll, whose first step the initial random weights decided."""
        last = self._last_step
        self._core_state = self._core_state_before_last
        self._last_step = self._act(last.prev_action, last.reward, last.done, last.observation)

    def pop_episode_stats(self) -> list[envs.EpisodeStats]:
        """Episodes that really finished (whole games) since the last call."""
        return self._env.pop_episode_stats()

    def _act(self, prev_action, reward, done, observation) -> Steps:
        # The state before this step is what the learner must start from if this step opens
        # the next unroll; the version deciding it, that of the next unroll's first step (whose
        # action is taken when that unroll begins: see `decide_first_step_again`).
        self._core_state_before_last = self._core_state
        self.first_step_version = self.weight_version
        inputs = networks.make_input(prev_action, reward, done, observation)
        action, logits, self._core_state = self._policy(inputs, self._core_state)
        return Steps(
            prev_action=np.asarray(prev_action, np.int32),
            reward=np.asarray(reward, np.float32),
            done=np.asarray(done, bool),
            observation=np.asarray(observation),
            action=action.numpy(),
            policy_logits=logits.numpy(),
        )

    def _policy_step(self, inputs: networks.AgentInput, core_state):
        output, core_state = self._agent(inputs, core_state)
        seed = self._rng.make_seeds(1)[:, 0]
        action = tf.random.stateless_categorical(output.policy_logits, 1, seed=seed)
        return tf.cast(tf.squeeze(action, 1), tf.int32), output.policy_logits, core_state
