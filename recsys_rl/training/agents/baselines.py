"""The baselines TSCAC is compared with (DESIGN 3.1), on the same data, networks and updates.

* ``BehaviourCloningAgent``: maximum likelihood of the logged actions.
* ``RCPOAgent`` (Reward Constrained Policy Optimisation, Tessler, Mankowitz & Mannor, ICLR 2019,
  offline): the actor maximises a Lagrangian reward, watch time + sum_i lambda_i * auxiliary_i (hate with
  a minus sign), and each lambda_i grows while the policy's discounted value of signal i falls short of
  the behaviour's and shrinks otherwise. As in the paper, the multipliers run on a slower timescale than
  the actor (``losses.SlowMultipliers``: a step every ``multiplier_every`` batches on the averaged gaps),
  and the gap is the discounted constraint value, estimated by a per-signal critic as
  E[Q_i(s, pi(s)) - Q_i(s, a_logged)] (the paper estimates it from on-policy returns, which offline
  training does not have).
  - ``critic="single"``: one critic head on the Lagrangian reward trains the actor, as in the original
    RCPO; a separate per-signal constraint critic serves only the multipliers.
  - ``critic="multi"``: one head per signal (the multi-task critic); the actor maximises the
    lambda-weighted sum of heads, and the same heads give the gaps.
  - ``critic="main"``: one head on watch time and no multipliers: the single-objective actor-critic.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import tensorflow as tf
from tf_agents.agents import tf_agent

from recsys_rl import signals
from recsys_rl.training.agents.base import AgentConfig, FeedAgent, gammas_for
from recsys_rl.training.agents.data import TransitionStatistics
from recsys_rl.training.agents.losses import SlowMultipliers

AUXILIARY = tuple(s for s in signals.FEED_SIGNALS if s != signals.FEED_MAIN_SIGNAL)
_AUX_INDEX = [signals.FEED_SIGNALS.index(s) for s in AUXILIARY]
# numpy, not a tf.constant: a tensor at import starts TensorFlow's runtime (its thread pools, the CUDA
# probe) in every process that imports the agents, and a process forked after that hangs in TensorFlow
_AUX_SIGNS = np.array([signals.get(s).direction.sign for s in AUXILIARY], np.float32)

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
        self._slow = SlowMultipliers(
            len(AUXILIARY),
            0.0 if critic == "main" else config.initial_multiplier,
            config.multiplier_learning_rate,
            config.constraint_slack,
            config.multiplier_every,
            name="lagrange",
        )
        self._multipliers = self._slow.values
        self._actor_optimizer.build(self._actor.trainable_variables)
        self._critic_optimizer.build(self._critic.trainable_variables)
        if critic == "single":  # per-signal values for the multipliers only; the actor never reads them
            self._constraint_critic = self._new_critic(AUXILIARY)
            self._constraint_target = self._new_target(self._constraint_critic)
            self._constraint_optimizer = tf.keras.optimizers.Adam(config.critic_learning_rate)
            self._constraint_optimizer.build(self._constraint_critic.trainable_variables)
            self._constraint_gammas = gammas_for(AUXILIARY, config)

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
        if self._kind == "single":
            constraint_losses = self._critic_update(
                self._constraint_critic,
                self._constraint_target,
                self._constraint_optimizer,
                experience,
                tf.gather(scaled, _AUX_INDEX, axis=1),
                self._constraint_gammas,
                next_mean[None],
                [0] * len(AUXILIARY),
            )
            extra.update({f"constraint_critic/{s}": constraint_losses[i] for i, s in enumerate(AUXILIARY)})
        if self._kind != "main":
            gaps = self._constraint_gaps(experience)
            self._slow.observe(gaps)
            for i, name in enumerate(AUXILIARY):
                extra[f"multiplier/{name}"] = self._multipliers[i]
                extra[f"constraint_gap/{name}"] = gaps[i]
        self.train_step_counter.assign_add(1)
        return tf_agent.LossInfo(loss=tf.reduce_sum(critic_losses) + actor_loss, extra=extra)

    def _constraint_gaps(self, experience) -> tf.Tensor:
        """Per auxiliary signal, how much better (+) or worse (-) the policy's discounted value is than the
        logged actions': E[Q_i(s, pi(s)) - Q_i(s, a_logged)], in the critic's reward units."""
        if self._kind == "multi":
            advantage = tf.gather(self._advantage(self._critic, experience, self._actor), _AUX_INDEX, axis=1)
        else:
            advantage = self._advantage(self._constraint_critic, experience, self._actor)
        return -tf.reduce_mean(advantage, axis=0) * _AUX_SIGNS
