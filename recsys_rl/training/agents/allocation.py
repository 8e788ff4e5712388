"""Live-stream allocation: the Supervised-Learning-enhanced Multi-Group Actor-Critic (SL-MGAC, DESIGN 3.2).

Per feed request that has a live candidate the policy decides whether to insert it (a Bernoulli actor).
The agent learns offline from logged allocation transitions (``recsys_rl.training.agents.specs``):

* **Multi-group state decomposition.** Actor and critic each encode the state with a shared encoder and
  route it through one tower per user activity group (``GroupRoutedEncoder``); populations as different
  as daily heavy users and rare visitors no longer share one set of tower weights, which the paper
  credits with less variance of the values and of the policy. (In the simulated world,
  ``bench/allocation_quality.py`` finds no less variance over 10 training seeds, neither from the towers
  nor from the supervised heads below: the README's allocation section.)
* **Supervised multi-task critic.** Per action (don't insert, insert) the critic predicts the immediate
  live watch time, the displaced short-video watch time, the gift value and the chance that the session
  ends (supervised losses on logged outcomes), and feeds those predictions to a value head that outputs a
  categorical return distribution over fixed atoms (C51) for two returns: the main (live watch time with
  the anti-greedy penalty) and the platform usage. Layer normalisation throughout.
* **Anti-greedy reward term (our design; only its purpose is public).** An insertion is penalised by the
  short-video time it is expected to displace beyond the live time it is expected to earn:

      r_main = live_watch_time - beta * insert * max(0, D_hat(s) - L_hat(s))

  where D_hat and L_hat are the upstream ranker's predictions in the state (the video watch an insertion
  displaces and the live watch it earns, in seconds scaled by the live-watch reward std), and beta is
  ``anti_greedy_weight``. It charges only insertions that are expected to cost the feed more than they
  bring the live stream, so the main return stops rewarding allocation for its own sake; a predicted
  term (not the realised live watch) keeps the penalty free of the outcome's noise. The critic's own
  supervised heads predicted D_hat and L_hat at first; in ``bench/allocation_quality.py``'s protocol
  (20,000 users' logs, 5 seeds) that left SL-MGAC's total usage below greedy's frontier at its own live
  watch, by 1.5 +- 1.1 s on the world the logs came from and 2.3 +- 1.0 s on the evaluation worlds,
  where the ranker's predictions put it on the frontier (+0.0 +- 1.0 and -0.3 +- 1.0 s). Chosen on the
  logs' world. Why, those runs do not show; one difference is that a head sees an insertion's outcome
  only where the logging policy inserted, and the ranker predicts every candidate.
* **Platform usage constraint, with a learned Lagrange multiplier.** The usage reward of a decision is
  the time the user spends in the app until the next allocation decision, live plus short video:

      u = live_watch_time + 100 * (session_watch(s') - session_watch(s))   (0 video time after the last)

  (``session_watch`` is the state's seconds-of-video-so-far feature / 100, so the difference is the
  short-video time watched in between, including the pages an early exit never shows.) The constraint is
  E_pi[Q_usage] >= E_logged[Q_usage] (usage must not fall below the logging policy's, whose insert
  probability at each state comes from the logged action's propensity); the multiplier lambda grows
  while the actor's usage value is below the logging policy's and shrinks otherwise, as in RCPO
  (``recsys_rl.training.agents.baselines``).
* **Actor.** Maximises the critic's advantage of inserting, A_main + lambda * A_usage, weighted by its
  insert probability (the exact policy gradient for one binary action given the critic), plus a
  supervised term: the cross-entropy of its probability with the logged allocation, which keeps an
  offline policy on the data's support.

Variants for comparison: without group routing (``groups=1``: the single-group actor-critic) and without
the supervised heads (the value head reads the towers alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.policies import actor_policy
from tf_agents.trajectories import trajectory
from tf_agents.utils import common

from recsys_rl import signals
from recsys_rl.state import ACTIVITY_GROUPS, LIVE_PREDICTION_SCALE, LIVE_STATE_FEATURES
from recsys_rl.training.agents.base import FeedAgent, _in_cross_replica_context, init_offline_agent
from recsys_rl.training.agents.data import TransitionStatistics
from recsys_rl.training.agents.losses import batch_mean, multiplier_step
from recsys_rl.training.agents.networks import (
    SUPERVISED_TARGETS,
    AllocationCriticNetwork,
    BernoulliActorNetwork,
)
from recsys_rl.training.agents.specs import (
    LOG_PROPENSITY_KEY,
    allocation_action_spec,
    allocation_transition_spec,
    live_observation_spec,
    live_time_step_spec,
)

VALUES: tuple[str, ...] = ("main", "usage")
_LIVE = signals.LIVE_SIGNALS.index("live_watch_time")
_GIFT = signals.LIVE_SIGNALS.index("gift")
_DISPLACED = signals.LIVE_SIGNALS.index("video_watch_displaced")
_SESSION_WATCH = LIVE_STATE_FEATURES.index("session_watch")
_PRED_LIVE = LIVE_STATE_FEATURES.index("pred_live_watch_time")
_PRED_DISPLACED = LIVE_STATE_FEATURES.index("pred_video_watch_displaced")
#: The largest anti-greedy penalty of one insertion, per unit of beta and in live-watch stds, that the main
#: return's support makes room for below ``main_support``'s floor: a larger beta must not push the returns
#: of costly insertions onto the floor, where the clipped projection would stop telling them apart. On the
#: logging policy's states of the simulated world (5,000 users, one day) the penalty per unit of beta has
#: median 0.03, 99th percentile 0.59, 99.9th 0.93 and maximum 1.07 stds.
PENALTY_SUPPORT_STDS = 1.0


@dataclass(frozen=True)
class AllocationConfig:
    """SL-MGAC's network sizes and update settings (DESIGN 3.2); the variants read what they use.

    Time rewards (live watch, displaced video, usage) are divided by one scale, the live-watch reward
    std of the training data, so the anti-greedy term and the Lagrangian mix seconds with seconds.
    """

    shared_hidden: tuple[int, ...] = (64,)  # shared encoder of actor and critic (each its own)
    tower_hidden: tuple[int, ...] = (32,)  # each group's tower
    head_hidden: int = 32  # the value head's hidden layer
    atoms: int = 51  # categorical support of each return distribution
    # main return range, in live-watch stds, before the anti-greedy penalty: the agent lowers its floor by
    # anti_greedy_weight * PENALTY_SUPPORT_STDS (``main_atoms``)
    main_support: tuple[float, float] = (-2.0, 20.0)
    usage_support: tuple[float, float] = (-2.0, 40.0)  # usage return range, in live-watch stds
    # Short: usage reacts to an allocation within a few pages (displacement, an early exit); a longer
    # horizon adds the noise of every later page to the usage advantage.
    usage_discount: float = 0.9
    actor_learning_rate: float = 3e-4
    critic_learning_rate: float = 1e-3
    target_update_tau: float = 0.01
    epsilon: float = 0.05  # insert probability kept in [eps, 1 - eps]: served propensities stay usable
    # beta of the anti-greedy term: 16, the weight bench/allocation_quality.py chose on its logs' world at
    # 8d02ef0 from 8, 16, 32 and 64 (SL-MGAC +1.3, +1.6, +1.2, +0.9 s against greedy's frontier there)
    anti_greedy_weight: float = 16.0
    supervised_weight: float = 1.0  # weight of the critic's supervised losses beside the TD losses
    actor_supervised_weight: float = 0.1  # weight of the actor's cross-entropy with the logged allocation
    multiplier_learning_rate: float = 0.01
    initial_multiplier: float = 1.0
    usage_slack: float = 0.0  # allowed usage cost of the insertions, in live-watch stds per decision

    def __post_init__(self) -> None:
        for name in ("shared_hidden", "tower_hidden"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"{name} should list positive layer sizes, but is {getattr(self, name)}")
        if self.atoms < 2:
            raise ValueError(f"atoms should be at least 2, but is {self.atoms}")
        for name in ("main_support", "usage_support"):
            low, high = getattr(self, name)
            if not low < high:
                raise ValueError(
                    f"{name} should be (low, high) with low < high, but is {getattr(self, name)}"
                )
        positive = (
            "head_hidden",
            "actor_learning_rate",
            "critic_learning_rate",
            "multiplier_learning_rate",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} should be positive, but is {getattr(self, name)}")
        non_negative = (
            "anti_greedy_weight",
            "supervised_weight",
            "actor_supervised_weight",
            "initial_multiplier",
            "usage_slack",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} should be >= 0, but is {getattr(self, name)}")
        if not 0 <= self.usage_discount < 1:
            raise ValueError(f"usage_discount should be in [0, 1), but is {self.usage_discount}")
        if not 0 < self.target_update_tau <= 1:
            raise ValueError(f"target_update_tau should be in (0, 1], but is {self.target_update_tau}")
        if not 0 < self.epsilon < 0.5:
            raise ValueError(f"epsilon should be in (0, 0.5), but is {self.epsilon}")


#: The algorithms of ``recsys_rl.training.agents.algorithms`` this agent implements:
#: (group routing, supervised).
VARIANTS: dict[str, tuple[bool, bool]] = {
    "sl-mgac": (True, True),
    "sl-mgac-nosl": (True, False),
    "ac-single-group": (False, True),
}


# -- the pieces as plain functions of tensors ---------------------------------------------------------------


def categorical_projection(
    next_probs: tf.Tensor, atoms: tf.Tensor, rewards: tf.Tensor, discounts: tf.Tensor
) -> tf.Tensor:
    """Project the distribution of r + discount * Z onto the fixed ``atoms`` (the C51 target).

    ``next_probs`` (B, N) are the probabilities of Z' on ``atoms`` (N,), evenly spaced; ``rewards`` and
    ``discounts`` (B,) (discount 0 after the last step). Each shifted atom r + d z_j is clipped to
    [z_0, z_{N-1}] and its mass split between the two nearest atoms in proportion to closeness.
    """
    n = tf.shape(atoms)[0]
    v_min, v_max = atoms[0], atoms[-1]
    delta = (v_max - v_min) / tf.cast(n - 1, tf.float32)
    shifted = tf.clip_by_value(rewards[:, None] + discounts[:, None] * atoms[None, :], v_min, v_max)
    position = (shifted - v_min) / delta  # (B, N) fractional atom index of each shifted atom
    # mass of shifted atom j on atom i: max(0, 1 - |position_j - i|)
    closeness = 1.0 - tf.abs(position[:, None, :] - tf.cast(tf.range(n), tf.float32)[None, :, None])
    return tf.einsum("bij,bj->bi", tf.nn.relu(closeness), next_probs)


def main_atoms(config: AllocationConfig) -> np.ndarray:
    """The main return's atoms: ``main_support`` with its floor lowered by the largest penalty an insertion
    carries at the config's anti-greedy weight (``PENALTY_SUPPORT_STDS``)."""
    low, high = config.main_support
    return np.linspace(low - config.anti_greedy_weight * PENALTY_SUPPORT_STDS, high, config.atoms)


def anti_greedy_penalty(inserted: tf.Tensor, displaced: tf.Tensor, live: tf.Tensor) -> tf.Tensor:
    """insert * max(0, D_hat - L_hat): the predicted video time an insertion displaces beyond the
    predicted live time it earns (see the module docstring); zero for a decision not to insert."""
    return inserted * tf.nn.relu(displaced - live)


def usage_rewards(
    live_watch: tf.Tensor, observations: tf.Tensor, next_observations: tf.Tensor, continues: tf.Tensor
) -> tf.Tensor:
    """Seconds in the app from this decision to the next: live watch + the short-video time in between
    (from the states' ``session_watch``); after the session's last decision only the live watch."""
    video = 100.0 * (next_observations[:, _SESSION_WATCH] - observations[:, _SESSION_WATCH])
    return live_watch + continues * tf.nn.relu(video)


def expected_values(logits: tf.Tensor, atoms: tf.Tensor) -> tf.Tensor:
    """Means of categorical distributions (..., V, N) over per-value atoms (V, N): (..., V)."""
    return tf.reduce_sum(tf.nn.softmax(logits, axis=-1) * atoms, axis=-1)


class CriticLosses(NamedTuple):
    distributional: tf.Tensor  # (V,) cross-entropy of each return distribution with its projected target
    supervised: tf.Tensor  # (4,) per SUPERVISED_TARGETS (zeros without supervised heads)
    total: tf.Tensor


class ActorLosses(NamedTuple):
    advantage: tf.Tensor  # -E[p * (A_main + lambda A_usage)] / its scale
    supervised: tf.Tensor  # cross-entropy with the logged allocation
    total: tf.Tensor
    insert_probability: tf.Tensor  # (B,) the actor's p(s) the losses were computed with


def _checked(record: NamedTuple, name: str) -> NamedTuple:
    """The record with every field checked for NaN/inf; the error names the loss and the field."""
    return type(record)(
        *(
            tf.debugging.check_numerics(v, f"{name}/{field}")
            for field, v in zip(record._fields, record, strict=True)
        )
    )


class SLMGACAgent(tf_agent.TFAgent):
    """SL-MGAC (see the module docstring) as a TF-Agents agent on logged allocation transitions."""

    def __init__(
        self,
        stats: TransitionStatistics,
        config: AllocationConfig,
        *,
        group_routing: bool = True,
        supervised: bool = True,
        train_step_counter: tf.Variable | None = None,
        name: str = "SLMGAC",
    ) -> None:
        tf.Module.__init__(self, name=name)
        self._config = config
        self._supervised = supervised
        groups = len(ACTIVITY_GROUPS) if group_routing else 1
        self._time_scale = float(stats.reward_std[_LIVE])
        self._gift_scale = float(stats.reward_std[_GIFT])
        common_args = {
            "state_mean": stats.state_mean,
            "state_std": stats.state_std,
            "shared": config.shared_hidden,
            "tower": config.tower_hidden,
            "groups": groups,
        }
        self._actor = BernoulliActorNetwork(
            live_observation_spec(),
            initial_rate=float(stats.action_mean[0]),
            epsilon=config.epsilon,
            name="allocation_actor",
            **common_args,
        )
        self._actor.create_variables()
        self._critic = AllocationCriticNetwork(
            live_observation_spec(),
            values=len(VALUES),
            atoms=config.atoms,
            head_hidden=config.head_hidden,
            supervised=supervised,
            name="allocation_critic",
            **common_args,
        )
        self._critic.create_variables()
        self._target_critic = self._critic.copy(name="allocation_target_critic")
        self._target_critic.create_variables()
        common.soft_variables_update(self._critic.variables, self._target_critic.variables, 1.0)
        self._atoms = tf.constant(
            np.stack(
                [
                    main_atoms(config),
                    np.linspace(*config.usage_support, config.atoms),
                ]
            ),
            tf.float32,
        )
        self._gammas = tf.constant(
            [signals.get(signals.LIVE_MAIN_SIGNAL).default_discount, config.usage_discount], tf.float32
        )
        self._multiplier = tf.Variable(config.initial_multiplier, trainable=False, name="usage_multiplier")
        self._actor_optimizer = tf.keras.optimizers.Adam(config.actor_learning_rate)
        self._critic_optimizer = tf.keras.optimizers.Adam(config.critic_learning_rate)
        self._actor_optimizer.build(self._actor.trainable_variables)
        self._critic_optimizer.build(self._critic.trainable_variables)
        policy = actor_policy.ActorPolicy(
            live_time_step_spec(), allocation_action_spec(), self._actor, clip=False
        )
        init_offline_agent(self, policy, allocation_transition_spec(), train_step_counter)

    @property
    def actor(self) -> BernoulliActorNetwork:
        return self._actor

    @property
    def critic(self) -> AllocationCriticNetwork:
        return self._critic

    @property
    def config(self) -> AllocationConfig:
        return self._config

    @property
    def multiplier(self) -> tf.Variable:
        return self._multiplier

    @property
    def atoms(self) -> tf.Tensor:
        """(V, N): the support of the main and the usage return distributions, in live-watch stds."""
        return self._atoms

    def train_kwargs(self, step: int) -> dict:
        return {}

    # -- rewards ----------------------------------------------------------------------------------------

    def rewards(self, experience: trajectory.Transition) -> tf.Tensor:
        """(B, V) scaled rewards of the main (anti-greedy penalised live watch) and the usage return;
        the penalty from the upstream predictions in the state (see the module docstring)."""
        obs, nxt = experience.time_step.observation, experience.next_time_step.observation
        reward = experience.next_time_step.reward
        live = reward[:, _LIVE] / self._time_scale
        inserted = experience.action_step.action[:, 0]
        live_hat = obs[:, _PRED_LIVE] * LIVE_PREDICTION_SCALE[0] / self._time_scale
        displaced_hat = obs[:, _PRED_DISPLACED] * LIVE_PREDICTION_SCALE[2] / self._time_scale
        penalty = anti_greedy_penalty(inserted, displaced_hat, live_hat)
        main = live - self._config.anti_greedy_weight * penalty
        usage = (
            usage_rewards(reward[:, _LIVE], obs, nxt, experience.next_time_step.discount) / self._time_scale
        )
        return tf.stack([main, usage], axis=1)

    def _supervised_labels(self, experience: trajectory.Transition) -> tf.Tensor:
        reward = experience.next_time_step.reward
        return tf.stack(
            [
                reward[:, _LIVE] / self._time_scale,
                reward[:, _DISPLACED] / self._time_scale,
                reward[:, _GIFT] / self._gift_scale,
                1.0 - experience.next_time_step.discount,  # the session ended
            ],
            axis=1,
        )

    # -- losses -----------------------------------------------------------------------------------------

    def critic_losses(self, experience: trajectory.Transition, *, training: bool = False) -> CriticLosses:
        """Distributional TD loss of each return and the supervised losses, at the logged actions."""
        obs, nxt = experience.time_step.observation, experience.next_time_step.observation
        action = tf.cast(experience.action_step.action[:, 0] > 0.5, tf.int32)
        (logits, predictions), _ = self._critic(obs, training=training)
        rewards = self.rewards(experience)
        (next_logits, _), _ = self._target_critic(nxt)
        p_next = tf.stop_gradient(self._actor.insert_probability(nxt))
        next_probs = tf.nn.softmax(next_logits, axis=-1)  # (B, 2, V, N)
        mixture = (1.0 - p_next)[:, None, None] * next_probs[:, 0] + p_next[:, None, None] * next_probs[:, 1]
        continues = experience.next_time_step.discount
        targets = tf.stack(
            [
                categorical_projection(
                    mixture[:, v], self._atoms[v], rewards[:, v], self._gammas[v] * continues
                )
                for v in range(len(VALUES))
            ],
            axis=1,
        )  # (B, V, N)
        logged_logits = tf.gather(logits, action, axis=1, batch_dims=1)  # (B, V, N)
        distributional = -tf.reduce_mean(
            tf.reduce_sum(tf.stop_gradient(targets) * tf.nn.log_softmax(logged_logits, axis=-1), axis=-1),
            axis=0,
        )
        supervised = tf.zeros([len(SUPERVISED_TARGETS)])
        if self._supervised:
            logged = tf.gather(predictions, action, axis=1, batch_dims=1)  # (B, 4)
            labels = self._supervised_labels(experience)
            regression = tf.reduce_mean(
                tf.keras.losses.huber(labels[:, :3, None], logged[:, :3, None]), axis=0
            )
            exit_loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=labels[:, 3], logits=logged[:, 3])
            )
            supervised = tf.concat([regression, exit_loss[None]], axis=0)
        total = tf.reduce_sum(distributional) + self._config.supervised_weight * tf.reduce_sum(supervised)
        return _checked(CriticLosses(distributional, supervised, total), "critic")

    def action_values(self, observations: tf.Tensor) -> tf.Tensor:
        """(B, 2, V): the critic's expected main and usage returns of each action."""
        (logits, _), _ = self._critic(observations)
        return expected_values(logits, self._atoms)

    def actor_losses(self, experience: trajectory.Transition, q: tf.Tensor | None = None) -> ActorLosses:
        """The advantage term and the supervised (logged-allocation) term of the actor."""
        obs = experience.time_step.observation
        q = tf.stop_gradient(self.action_values(obs) if q is None else q)
        advantage = q[:, 1, :] - q[:, 0, :]  # (B, V)
        combined = advantage[:, 0] + self._multiplier * advantage[:, 1]
        scale = batch_mean(tf.abs(combined)) + 1e-6
        p = self._actor.insert_probability(obs)
        advantage_loss = -tf.reduce_mean(p * combined) / scale
        logged = experience.action_step.action[:, 0]
        supervised = -tf.reduce_mean(logged * tf.math.log(p) + (1.0 - logged) * tf.math.log1p(-p))
        total = advantage_loss + self._config.actor_supervised_weight * supervised
        return _checked(ActorLosses(advantage_loss, supervised, total, p), "actor")

    @staticmethod
    def usage_gap(
        q: tf.Tensor, insert_probability: tf.Tensor, logged_insert_probability: tf.Tensor
    ) -> tf.Tensor:
        """E_pi[Q_usage] - E_logged[Q_usage] over the batch: the mean of (p(s) - mu(s)) * (Q_usage(s,
        insert) - Q_usage(s, skip)) for the critic's values ``q`` (B, 2, V), the policy's insert
        probability p and the logging policy's mu. Below zero the policy's allocation costs usage the
        logged one did not: the constraint is broken. (Against never inserting, a policy that allocates
        exactly as the logs did would count as breaking it.)"""
        difference = tf.stop_gradient(insert_probability) - logged_insert_probability
        return tf.reduce_mean(difference * (q[:, 1, 1] - q[:, 0, 1]))

    @staticmethod
    def logged_insert_probability(experience) -> tf.Tensor:
        """The logging policy's probability of inserting at each logged state, from the logged action and
        its log-propensity."""
        logged = experience.action_step.action[:, 0]
        probability = tf.exp(experience.action_step.info[LOG_PROPENSITY_KEY])
        return tf.where(logged > 0.5, probability, 1.0 - probability)

    # -- one step ---------------------------------------------------------------------------------------

    def _train(self, experience, weights=None):
        del weights
        with tf.GradientTape() as tape:
            critic = self.critic_losses(experience, training=True)
        FeedAgent._apply(critic.total, tape, self._critic.trainable_variables, self._critic_optimizer)
        q = tf.stop_gradient(self.action_values(experience.time_step.observation))
        with tf.GradientTape() as tape:
            actor = self.actor_losses(experience, q)
        FeedAgent._apply(actor.total, tape, self._actor.trainable_variables, self._actor_optimizer)
        p = tf.stop_gradient(actor.insert_probability)
        gap = self.usage_gap(q, p, self.logged_insert_probability(experience))
        config = self._config
        self._multiplier.assign(
            multiplier_step(self._multiplier, gap, config.multiplier_learning_rate, config.usage_slack)
        )
        tau = self._config.target_update_tau
        _in_cross_replica_context(
            lambda: common.soft_variables_update(self._critic.variables, self._target_critic.variables, tau)
        )
        self.train_step_counter.assign_add(1)
        extra = {f"critic/{name}": critic.distributional[i] for i, name in enumerate(VALUES)}
        if self._supervised:
            extra.update(
                {f"supervised/{name}": critic.supervised[i] for i, name in enumerate(SUPERVISED_TARGETS)}
            )
        extra.update(
            {
                "actor/advantage": actor.advantage,
                "actor/supervised": actor.supervised,
                "multiplier/usage": tf.identity(self._multiplier),
                "constraint_gap/usage": gap,
                "insert_rate": tf.reduce_mean(p),
            }
        )
        return tf_agent.LossInfo(loss=critic.total + actor.total, extra=extra)

    def _initialize(self):
        return tf.no_op()

    def _loss(self, experience, weights=None, training=False):
        raise NotImplementedError("SL-MGAC reports its losses from train(); see critic_losses/actor_losses")
