"""Two-Stage Constrained Actor-Critic (TSCAC, DESIGN 3.1) for feed ranking, offline, as a TF-Agents agent.

Stage one fits one actor per auxiliary signal (click, like, follow, comment, share, hate), each
maximising its own signal under its own critic head. Stage two fits the main actor to the closed-form
optimum of "maximise the watch-time advantage while staying close (KL) to every stage-one actor and to
the behaviour policy":

    pi*(a|s)  ~  beta^(l_b/L) * prod_i pi_i(a|s)^(l_i/L) * exp(A_main(s, a) / L),  L = l_b + sum_i l_i

by likelihood on the logged actions with weights pi*/beta, normalised per batch. Advantages and lambdas
are in reward units (each signal's Q in its per-step reward standard deviations), as in the closed form;
stage one's temperature is ``behaviour_lambda`` in the same units. The critic (one head
per signal, each with its own discount) learns all along; head i evaluates stage-one actor i and the
watch-time head evaluates the main actor. The training job runs stage one for the first
``stage_one_steps`` steps and stage two after.

``deterministic=True`` (algorithm ``tscac-dpg``) is a deterministic-policy-gradient variant of ours, not
the authors' public code: each actor's mean maximises its critic head at the actor's mean plus
behaviour cloning, and the main actor also stays close to the stage-one actors' means. Its actors serve
their mean with the fixed ``initial_std``. (The authors' code trains one stage-one actor on a fixed
weighted sum of the heads and weighs the main actor's closeness with a Gaussian kernel.)
"""

from __future__ import annotations

import tensorflow as tf
from tf_agents.agents import tf_agent

from recsys_rl import signals
from recsys_rl.training.agents import losses
from recsys_rl.training.agents.base import AgentConfig, FeedAgent, gammas_for
from recsys_rl.training.agents.data import TransitionStatistics

MAIN = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)
AUXILIARY = tuple(s for s in signals.FEED_SIGNALS if s != signals.FEED_MAIN_SIGNAL)
STAGE_ONE, STAGE_TWO = 1, 2


class TSCACAgent(FeedAgent):
    def __init__(
        self,
        stats: TransitionStatistics,
        config: AgentConfig,
        *,
        stage_one_steps: int,
        deterministic: bool = False,
        train_step_counter: tf.Variable | None = None,
    ) -> None:
        self.learns_std = not deterministic
        self._deterministic = deterministic
        self._stage_one_steps = stage_one_steps
        super().__init__(
            stats,
            config,
            train_step_counter=train_step_counter,
            name="TSCACDeterministicPolicyGradient" if deterministic else "TSCAC",
        )
        self._aux_actors = [self._new_actor(f"aux_actor_{s}", learn_std=not deterministic) for s in AUXILIARY]
        self._aux_optimizer = tf.keras.optimizers.Adam(config.actor_learning_rate)
        self._critic = self._new_critic(signals.FEED_SIGNALS, config.funnel)
        self._target_critic = self._new_target(self._critic)
        self._critic_optimizer = tf.keras.optimizers.Adam(config.critic_learning_rate)
        self._gammas = gammas_for(signals.FEED_SIGNALS, config)
        # head j bootstraps from policy j: 0 is the main actor, 1.. the stage-one actors in AUXILIARY order
        self._head_policy = [
            0 if s == signals.FEED_MAIN_SIGNAL else 1 + AUXILIARY.index(s) for s in signals.FEED_SIGNALS
        ]
        self._aux_heads = [signals.FEED_SIGNALS.index(s) for s in AUXILIARY]
        for optimizer, actors in (
            (self._actor_optimizer, [self._actor]),
            (self._aux_optimizer, self._aux_actors),
            (self._critic_optimizer, [self._critic]),
        ):
            optimizer.build([v for a in actors for v in a.trainable_variables])

    @property
    def aux_actors(self):
        return self._aux_actors

    def train_kwargs(self, step: int) -> dict:
        return {"stage": STAGE_ONE if step < self._stage_one_steps else STAGE_TWO}

    def _means(self, actors, observations: tf.Tensor) -> tf.Tensor:
        return tf.stack([actor.mean_and_std(observations)[0] for actor in actors])

    def _train(self, experience, weights=None, stage: int = STAGE_TWO):
        del weights  # every logged transition counts once; the closed-form weights come from the data
        observations = experience.time_step.observation
        next_actions = self._means([self._actor, *self._aux_actors], experience.next_time_step.observation)
        critic_losses = self._critic_update(
            self._critic,
            self._target_critic,
            self._critic_optimizer,
            experience,
            self._scaled_rewards(experience),
            self._gammas,
            next_actions,
            self._head_policy,
        )
        extra = {f"critic/{s}": critic_losses[i] for i, s in enumerate(signals.FEED_SIGNALS)}
        if stage == STAGE_ONE:
            actor_loss = self._stage_one(experience, extra)
        else:
            actor_loss = self._stage_two(experience, observations, extra)
        self.train_step_counter.assign_add(1)
        total = tf.reduce_sum(critic_losses) + actor_loss
        return tf_agent.LossInfo(loss=total, extra=extra)

    def _stage_one(self, experience, extra: dict) -> tf.Tensor:
        """Each stage-one actor learns its own signal (sign-corrected: hate is minimised).

        The critic is evaluated once at the logged actions and once at all six actors' means together,
        rather than twice per actor: stage one is the costlier stage.
        """
        observations = experience.time_step.observation
        action = experience.action_step.action
        behaviour = self._behaviour_log_prob(experience)
        total = tf.constant(0.0)
        with tf.GradientTape() as tape:
            means = self._means(self._aux_actors, observations)  # (M, B, K)
            q_at_means = self._q_at(self._critic, observations, means)  # (M, B, S)
            q_logged, _ = self._critic((observations, action))
            for i, (name, head, actor) in enumerate(
                zip(AUXILIARY, self._aux_heads, self._aux_actors, strict=True)
            ):
                sign = float(signals.get(name).direction.sign)
                if self._deterministic:
                    loss = losses.deterministic_actor_loss(
                        sign * q_at_means[i, :, head], means[i], action, self._config.bc_weight
                    )
                else:
                    advantage = tf.stop_gradient(sign * (q_logged[:, head] - q_at_means[i, :, head]))
                    log_w = losses.closed_form_log_weights(
                        advantage, behaviour, None, None, self._config.behaviour_lambda
                    )
                    weights = losses.normalised_weights(log_w, self._config.max_weight)
                    dist, _ = actor(observations, training=True)
                    loss = losses.weighted_log_likelihood_loss(dist.log_prob(action), weights)
                extra[f"actor/{name}"] = loss
                total += loss
        variables = [v for a in self._aux_actors for v in a.trainable_variables]
        self._apply(total, tape, variables, self._aux_optimizer)
        return total

    def _stage_two(self, experience, observations, extra: dict) -> tf.Tensor:
        if self._deterministic:
            anchors = self._means(self._aux_actors, observations)
            loss = self._deterministic_step(
                self._actor,
                self._actor_optimizer,
                self._critic,
                experience,
                tf.one_hot(MAIN, len(signals.FEED_SIGNALS)),
                anchors,
            )
        else:
            loss, max_share = self._actor_fit(experience, observations)
            extra["weights/max_share"] = max_share
        extra["actor/main"] = loss
        return loss

    def _actor_fit(self, experience, observations):
        advantage = self._advantage(self._critic, experience, self._actor)[:, MAIN]
        action = experience.action_step.action
        prior_log_probs = tf.stack([a(observations)[0].log_prob(action) for a in self._aux_actors], axis=1)
        log_w = stage_two_log_weights(
            advantage,
            self._behaviour_log_prob(experience),
            prior_log_probs,
            self._config,
        )
        return self._weighted_likelihood_step(self._actor, self._actor_optimizer, experience, log_w)


def stage_two_log_weights(advantage, behaviour_log_prob, prior_log_probs, config: AgentConfig) -> tf.Tensor:
    """TSCAC's stage-two log-weights with every auxiliary prior at ``config.aux_lambda``.

    The lambdas are in reward units: ``advantage`` is the critic's, in units of the main signal's
    per-step reward standard deviation (a fixed statistic of the dataset), never rescaled by the batch.
    A row's weight is then the closed form's exp(A / L) whatever else the batch holds, and a lambda
    means the same in every batch and run on that data.
    """
    lambdas = tf.fill([len(AUXILIARY)], tf.constant(config.aux_lambda, tf.float32))
    return losses.closed_form_log_weights(
        tf.stop_gradient(advantage),
        behaviour_log_prob,
        tf.stop_gradient(prior_log_probs),
        lambdas,
        config.behaviour_lambda,
    )
