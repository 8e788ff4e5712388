"""The baselines TSCAC is compared with (DESIGN 3.1), on the same data, networks and updates.

* ``BehaviourCloningAgent``: maximum likelihood of the logged actions.
* ``RCPOAgent`` (Reward Constrained Policy Optimisation, offline): the actor maximises a Lagrangian
  reward, watch time + sum_i lambda_i * auxiliary_i (hate with a minus sign), and each lambda_i grows
  while the policy falls short of the behaviour policy on signal i and shrinks otherwise.
  - ``critic="single"``: one critic head on the Lagrangian reward, as in the original RCPO. The
    shortfall of signal i is estimated per batch with self-normalised importance weights on the
    immediate rewards (the only per-signal estimate a single critic leaves).
  - ``critic="multi"``: one head per signal (the multi-task critic); the actor maximises the
    lambda-weighted sum of heads, and the shortfall of signal i is the head's mean gap between the
    actor's action and the logged one.
  - ``critic="main"``: one head on watch time and no multipliers: the single-objective actor-critic.
"""

from __future__ import annotations

from typing import Literal

import tensorflow as tf
from tf_agents.agents import tf_agent

from recsys_rl import signals
from recsys_rl.training.agents.base import AgentConfig, FeedAgent, gammas_for
from recsys_rl.training.agents.data import TransitionStatistics

AUXILIARY = tuple(s for s in signals.FEED_SIGNALS if s != signals.FEED_MAIN_SIGNAL)
_AUX_INDEX = [signals.FEED_SIGNALS.index(s) for s in AUXILIARY]
_AUX_SIGNS = tf.constant([signals.get(s).direction.sign for s in AUXILIARY], tf.float32)

CriticKind = Literal["single", "multi", "main"]


class BehaviourCloningAgent(FeedAgent):
    def __init__(
        self,
        stats: TransitionStatistics,
        config: AgentConfig,
        *,
        train_step_counter: tf.Variable | None = None,
    ) -> None:
        super().__init__(stats, config, train_step_counter=train_step_counter, name="BehaviourCloning")
        self._actor_optimizer.build(self._actor.trainable_variables)

    def _train(self, experience, weights=None):
        del weights
        uniform = tf.zeros_like(self._behaviour_log_prob(experience))
        loss, _ = self._weighted_likelihood_step(self._actor, self._actor_optimizer, experience, uniform)
        self.train_step_counter.assign_add(1)
        return tf_agent.LossInfo(loss=loss, extra={"actor/main": loss})


class RCPOAgent(FeedAgent):
    learns_std = False

    def __init__(
        self,
        stats: TransitionStatistics,
        config: AgentConfig,
        *,
        critic: CriticKind,
        train_step_counter: tf.Variable | None = None,
    ) -> None:
        names = {"single": "RCPO", "multi": "RCPOMultiCritic", "main": "ActorCriticWatchTime"}
        super().__init__(stats, config, train_step_counter=train_step_counter, name=names[critic])
        self._kind = critic
        heads = {
            "single": ("lagrangian",),
            "multi": signals.FEED_SIGNALS,
            "main": (signals.FEED_MAIN_SIGNAL,),
        }
        self._heads = heads[critic]
        # the Lagrangian reward is dominated by watch time, so it takes watch time's discount
        gamma_names = (signals.FEED_MAIN_SIGNAL,) if critic == "single" else self._heads
        self._gammas = gammas_for(gamma_names, config)
        self._critic = self._new_critic(self._heads, config.funnel if critic == "multi" else ())
        self._target_critic = self._new_target(self._critic)
        self._critic_optimizer = tf.keras.optimizers.Adam(config.critic_learning_rate)
        initial = 0.0 if critic == "main" else config.initial_multiplier
        self._multipliers = tf.Variable(
            tf.fill([len(AUXILIARY)], initial), trainable=False, name="multipliers"
        )
        self._actor_optimizer.build(self._actor.trainable_variables)
        self._critic_optimizer.build(self._critic.trainable_variables)

    @property
    def multipliers(self) -> tf.Variable:
        return self._multipliers

    def _head_coefficients(self) -> tf.Tensor:
        if self._kind != "multi":
            return tf.ones([1])
        aux = self._multipliers * _AUX_SIGNS
        return tf.tensor_scatter_nd_update(
            tf.ones([len(signals.FEED_SIGNALS)]), [[i] for i in _AUX_INDEX], aux
        )

    def _critic_rewards(self, scaled: tf.Tensor) -> tf.Tensor:
        main = scaled[:, signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)]
        if self._kind == "multi":
            return scaled
        if self._kind == "main":
            return main[:, None]
        aux = tf.gather(scaled, _AUX_INDEX, axis=1)
        return (main + tf.linalg.matvec(aux, self._multipliers * _AUX_SIGNS))[:, None]

    def _train(self, experience, weights=None):
        del weights
        observations = experience.time_step.observation
        scaled = self._scaled_rewards(experience)
        next_mean, _ = self._actor.mean_and_std(experience.next_time_step.observation)
        critic_losses = self._critic_update(
            self._critic,
            self._target_critic,
            self._critic_optimizer,
            experience,
            self._critic_rewards(scaled),
            self._gammas,
            next_mean[None],
            [0] * len(self._heads),
        )
        actor_loss = self._deterministic_step(
            self._actor, self._actor_optimizer, self._critic, experience, self._head_coefficients()
        )
        extra = {f"critic/{name}": critic_losses[i] for i, name in enumerate(self._heads)}
        extra["actor/main"] = actor_loss
        if self._kind != "main":
            gaps = self._constraint_gaps(experience, observations, scaled)
            step = self._config.multiplier_learning_rate * (gaps + self._config.constraint_slack)
            self._multipliers.assign(tf.nn.relu(self._multipliers - step))
            for i, name in enumerate(AUXILIARY):
                extra[f"multiplier/{name}"] = self._multipliers[i]
                extra[f"constraint_gap/{name}"] = gaps[i]
        self.train_step_counter.assign_add(1)
        return tf_agent.LossInfo(loss=tf.reduce_sum(critic_losses) + actor_loss, extra=extra)

    def _constraint_gaps(self, experience, observations, scaled) -> tf.Tensor:
        """Per auxiliary signal, how much better (+) or worse (-) the policy does than the logged actions."""
        if self._kind == "multi":
            advantage = self._advantage(self._critic, experience, self._actor)  # logged minus policy
            return -tf.reduce_mean(tf.gather(advantage, _AUX_INDEX, axis=1), axis=0) * _AUX_SIGNS
        dist, _ = self._actor(observations)
        log_ratio = dist.log_prob(experience.action_step.action) - self._behaviour_log_prob(experience)
        ratio = tf.nn.softmax(log_ratio)  # self-normalised importance weights
        aux = tf.gather(scaled, _AUX_INDEX, axis=1)
        return (tf.linalg.matvec(aux, ratio, transpose_a=True) - tf.reduce_mean(aux, axis=0)) * _AUX_SIGNS
