"""The baselines TSCAC is judged against (recsys_rl.training.agents.baselines), one training step by hand.

TSCAC's benchmark verdict (bench/policy_quality.py, issue 16) is that it beats RCPO, RCPO with a
multi-task critic and the watch-time-only actor-critic; a baseline that trained on the wrong reward, signs
or multipliers would make that verdict meaningless. So every quantity of one step is recomputed here in
float64 numpy from the agent's networks as they were before it: the critics' rewards (the Lagrangian for
RCPO, one head per signal for RCPO-MC, watch time alone for the actor-critic), their TD targets and
losses, the actor's deterministic objective with its head coefficients, the constraint gaps and the
multipliers' step, and behaviour cloning's likelihood. Signs and discounts are written by hand.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from feed_batches import AUXILIARY, SIGN, SMALL, batch, moved, stats, values

from recsys_rl import signals
from recsys_rl.training.agents.factory import build_agent
from recsys_rl.training.agents.specs import feed_transition_spec

FEED = ("watch_time", "click", "like", "follow", "comment", "share", "hate")
# each signal's default discount (recsys_rl.signals), written out: watch time looks furthest ahead
DISCOUNT = {
    "watch_time": 0.95,
    "click": 0.9,
    "like": 0.9,
    "follow": 0.9,
    "comment": 0.9,
    "share": 0.9,
    "hate": 0.9,
}
REWARD_STD = np.array([20.0, 0.5, 0.3, 0.1, 0.2, 0.15, 0.05])  # one per FEED signal
# a multiplier step on every batch, so that one step shows it; a distinct start per constraint
CONFIG = dataclasses.replace(SMALL, multiplier_every=1, initial_multiplier=0.7, multiplier_learning_rate=0.5)


@pytest.fixture(autouse=True)
def seeded():
    tf.keras.utils.set_random_seed(0)


def _q(critic, observations, actions) -> np.ndarray:
    return critic((observations, actions))[0].numpy().astype(np.float64)


def _mean(actor, observations) -> np.ndarray:
    return actor.mean_and_std(observations)[0].numpy()


class _Before:
    """What one step reads, taken before it: the batch, its scaled rewards and the actor's means."""

    def __init__(self, agent, logged) -> None:
        self.obs = logged.time_step.observation
        self.next_obs = logged.next_time_step.observation
        self.action = logged.action_step.action.numpy()
        self.continues = logged.next_time_step.discount.numpy().astype(np.float64)
        self.scaled = logged.next_time_step.reward.numpy().astype(np.float64) / REWARD_STD
        self.mean = _mean(agent.actor, self.obs)
        self.next_mean = _mean(agent.actor, self.next_obs)
        self.multipliers = agent.multipliers.numpy().astype(np.float64)

    def column(self, name: str) -> np.ndarray:
        return self.scaled[:, FEED.index(name)]

    def critic_losses(self, critic, target, rewards: np.ndarray, names) -> np.ndarray:
        """Per head: mean of half the squared TD error, targets bootstrapped at the actor's next mean."""
        gammas = np.array([DISCOUNT[n] for n in names])
        targets = rewards + gammas * self.continues[:, None] * _q(target, self.next_obs, self.next_mean)
        return np.mean(0.5 * (_q(critic, self.obs, self.action) - targets) ** 2, axis=0)

    def actor_loss(self, critic, coefficients: np.ndarray) -> float:
        """The deterministic objective at the actor's mean on the critic after its step."""
        value = _q(critic, self.obs, self.mean) @ coefficients
        bc = CONFIG.bc_weight * np.mean(np.sum((self.mean - self.action) ** 2, axis=-1))
        return float(-value.mean() / (np.abs(value).mean() + 1e-6) + bc)


def _gaps(critic, agent, before: _Before, columns) -> np.ndarray:
    """E[Q_i(s, mu(s)) - Q_i(s, a_logged)] per constraint, hate's sign flipped: + where the policy (after
    its step) does better than the logs, on the critic after its step."""
    after = _mean(agent.actor, before.obs)
    gain = _q(critic, before.obs, after) - _q(critic, before.obs, before.action)
    return gain[:, columns].mean(axis=0) * np.array([SIGN[n] for n in AUXILIARY])


def _stepped(multipliers: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    return np.maximum(multipliers - CONFIG.multiplier_learning_rate * (gaps + CONFIG.constraint_slack), 0.0)


def _agent(algorithm: str, config=CONFIG):
    return build_agent(algorithm, stats(REWARD_STD), config, stage_one_steps=0)


def test_rcpo_trains_one_critic_on_the_lagrangian_reward_and_its_multipliers_on_a_constraint_critic():
    agent = _agent("rcpo")
    logged = batch()
    before = _Before(agent, logged)
    lagrangian = before.column("watch_time") + sum(
        m * SIGN[n] * before.column(n) for m, n in zip(before.multipliers, AUXILIARY, strict=True)
    )
    # the Lagrangian reward is mostly watch time: it takes watch time's discount
    critic_loss = before.critic_losses(
        agent._critic, agent._target_critic, lagrangian[:, None], ["watch_time"]
    )
    aux = np.stack([before.column(n) for n in AUXILIARY], axis=1)
    constraint_losses = before.critic_losses(
        agent._constraint_critic, agent._constraint_target, aux, AUXILIARY
    )

    info = agent.train(logged)

    np.testing.assert_allclose(float(info.extra["critic/lagrangian"]), critic_loss[0], rtol=1e-4)
    for i, name in enumerate(AUXILIARY):
        np.testing.assert_allclose(
            float(info.extra[f"constraint_critic/{name}"]), constraint_losses[i], rtol=1e-4, err_msg=name
        )
    actor_loss = before.actor_loss(agent._critic, np.ones(1))
    np.testing.assert_allclose(float(info.extra["actor/main"]), actor_loss, rtol=1e-4)
    gaps = _gaps(agent._constraint_critic, agent, before, list(range(len(AUXILIARY))))
    _check_multipliers(agent, info, before, gaps)
    np.testing.assert_allclose(float(info.loss), critic_loss[0] + actor_loss, rtol=1e-4)


def test_rcpo_with_a_multi_task_critic_weighs_its_heads_by_the_multipliers():
    agent = _agent("rcpo-mc")
    logged = batch()
    before = _Before(agent, logged)
    losses = before.critic_losses(agent._critic, agent._target_critic, before.scaled, FEED)

    info = agent.train(logged)

    for i, name in enumerate(FEED):
        np.testing.assert_allclose(float(info.extra[f"critic/{name}"]), losses[i], rtol=1e-4, err_msg=name)
    coefficients = np.array([1.0] + [m * SIGN[n] for m, n in zip(before.multipliers, AUXILIARY, strict=True)])
    actor_loss = before.actor_loss(agent._critic, coefficients)
    assert abs(actor_loss - before.actor_loss(agent._critic, np.eye(len(FEED))[0])) > 1e-3  # they matter
    np.testing.assert_allclose(float(info.extra["actor/main"]), actor_loss, rtol=1e-4)
    gaps = _gaps(agent._critic, agent, before, [FEED.index(n) for n in AUXILIARY])
    _check_multipliers(agent, info, before, gaps)
    np.testing.assert_allclose(float(info.loss), losses.sum() + actor_loss, rtol=1e-4)


def _check_multipliers(agent, info, before: _Before, gaps: np.ndarray) -> None:
    """The gaps reported and the multipliers after one step of the slow timescale (every batch here)."""
    assert np.all(np.abs(gaps) > 1e-4), gaps  # the batch tells a sign flip apart
    expected = _stepped(before.multipliers, gaps)
    assert len(set(np.round(expected, 6))) > 1  # not every multiplier at the same value
    for i, name in enumerate(AUXILIARY):
        np.testing.assert_allclose(float(info.extra[f"constraint_gap/{name}"]), gaps[i], rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(float(info.extra[f"multiplier/{name}"]), expected[i], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(agent.multipliers.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_the_watch_time_actor_critic_has_one_head_and_no_constraints():
    agent = _agent("ac-main")
    logged = batch()
    before = _Before(agent, logged)
    loss = before.critic_losses(agent._critic, agent._target_critic, before.scaled[:, :1], ["watch_time"])

    info = agent.train(logged)

    assert agent._critic.signal_names == ("watch_time",)
    assert not any(k.startswith(("multiplier/", "constraint")) for k in info.extra)
    np.testing.assert_array_equal(agent.multipliers.numpy(), np.zeros(len(AUXILIARY)))
    np.testing.assert_allclose(float(info.extra["critic/watch_time"]), loss[0], rtol=1e-4)
    np.testing.assert_allclose(
        float(info.extra["actor/main"]), before.actor_loss(agent._critic, np.ones(1)), rtol=1e-4
    )


@pytest.mark.parametrize("algorithm", ["rcpo", "rcpo-mc"])
def test_the_multipliers_wait_for_their_period_then_step_on_the_averaged_gaps(algorithm):
    """Two timescales: nothing moves the multipliers until the period's last batch."""
    agent = _agent(algorithm, dataclasses.replace(CONFIG, multiplier_every=3))
    start = agent.multipliers.numpy().copy()
    reported = []
    for step in range(3):
        info = agent.train(batch(seed=step))
        reported.append([float(info.extra[f"constraint_gap/{n}"]) for n in AUXILIARY])
        if step < 2:
            np.testing.assert_array_equal(agent.multipliers.numpy(), start)
    np.testing.assert_allclose(
        agent.multipliers.numpy(), _stepped(start, np.mean(reported, axis=0)), rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize("algorithm", ["rcpo", "rcpo-mc", "ac-main"])
def test_each_critic_steps_and_its_target_follows_by_tau(algorithm):
    config = dataclasses.replace(CONFIG, target_update_tau=0.25)
    agent = _agent(algorithm, config)
    pairs = [(agent._critic, agent._target_critic)]
    if algorithm == "rcpo":
        pairs.append((agent._constraint_critic, agent._constraint_target))
    for critic, target in pairs:
        np.testing.assert_array_equal(values(critic)[0], values(target)[0])  # targets start as copies
    before = [(values(critic), values(target)) for critic, target in pairs]
    actor = values(agent.actor)

    agent.train(batch())

    assert moved(actor, agent.actor)
    for (critic, target), (critic_before, target_before) in zip(pairs, before, strict=True):
        assert moved(critic_before, critic)
        for c, t_before, t in zip(
            critic.trainable_variables, target_before, target.trainable_variables, strict=True
        ):
            np.testing.assert_allclose(t.numpy(), 0.75 * t_before + 0.25 * c.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["rcpo", "rcpo-mc", "ac-main", "bc"])
def test_each_baseline_counts_its_steps_on_the_counter_it_is_given(algorithm):
    """The training loop checkpoints its own counter: the agent must step that one, not one of its own."""
    counter = tf.Variable(3, dtype=tf.int64)
    agent = build_agent(algorithm, stats(REWARD_STD), CONFIG, stage_one_steps=0, train_step_counter=counter)
    agent.train(batch())
    assert agent.train_step_counter is counter and int(counter.numpy()) == 4


@pytest.mark.parametrize("algorithm", ["rcpo", "rcpo-mc", "ac-main"])
def test_deterministic_baselines_serve_a_fixed_std(algorithm):
    assert not any("log_std" in v.name for v in _agent(algorithm).actor.trainable_variables)


def test_only_the_multi_task_critic_takes_the_configured_funnel():
    """A funnel orders per-signal heads; RCPO's one Lagrangian head and the watch-time head have none."""
    config = dataclasses.replace(CONFIG, funnel=("click", "like", "follow"))
    assert _agent("rcpo-mc", config)._critic._funnel == (1, 2, 3)
    assert _agent("rcpo", config)._critic._funnel == ()
    assert _agent("ac-main", config)._critic._funnel == ()


def test_behaviour_cloning_maximises_the_logged_actions_likelihood_evenly():
    agent = _agent("bc")
    logged = batch()
    log_prob = agent.actor(logged.time_step.observation)[0].log_prob(logged.action_step.action).numpy()

    info = agent.train(logged)

    np.testing.assert_allclose(float(info.loss), -np.mean(log_prob.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(float(info.extra["actor/main"]), float(info.loss))
    assert any("log_std" in v.name for v in agent.actor.trainable_variables)  # it fits the spread too


def test_the_hand_written_signal_order_is_the_registrys():
    """Every column above is read by FEED's order: it must be the one the agents use."""
    assert signals.FEED_SIGNALS == FEED


# -- what every feed agent shares (training/agents/base.py), on RCPO --------------------------------------


def test_the_served_policy_clips_its_actions_to_the_action_specs_bounds():
    agent = _agent("rcpo")
    mean_layer = agent.actor._mean
    mean_layer.kernel.assign(tf.zeros_like(mean_layer.kernel))
    mean_layer.bias.assign(tf.fill(mean_layer.bias.shape, 50.0))  # far beyond the bound of 8
    logged = batch(n=4)
    step = agent.policy.action(logged.time_step)
    np.testing.assert_array_equal(step.action.numpy(), np.full((4, len(FEED)), 8.0, np.float32))


def test_an_offline_agent_serves_and_collects_with_one_policy_and_trains_on_feed_transitions():
    agent = _agent("rcpo")
    assert agent.collect_policy is agent.policy
    assert agent.training_data_spec == feed_transition_spec()
    counter = agent.train_step_counter
    assert counter.dtype == tf.int64 and counter.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA


def test_feed_agents_have_no_separate_loss():
    with pytest.raises(NotImplementedError, match=r"report their losses from train\(\)"):
        _agent("rcpo").loss(batch())


@pytest.mark.parametrize(("trunk", "shared"), [("shared", True), ("independent", False)])
def test_the_critic_takes_the_configured_trunk(trunk, shared):
    critic = _agent("rcpo-mc", dataclasses.replace(CONFIG, critic_trunk=trunk))._critic
    first = critic._torso[0].kernel
    assert first.shape.rank == (2 if shared else 3)
