"""SL-MGAC's losses and update step (recsys_rl.training.agents.allocation) against plain numpy.

Each equation of the module docstring is computed here again from the networks' raw outputs, in float64
and without TensorFlow: the C51 target from the target critic's distributions mixed by the actor's insert
probability at the next state, the cross-entropy at the logged action, the supervised labels and losses,
the actor's advantage and cross-entropy terms, the usage gap and the Lagrange step, and the target
network's Polyak average. The training tests elsewhere only see that the losses are finite and move the
weights; a sign or an index wrong in any of these would pass them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf
from allocation_batches import SMALL, batch, stats

from recsys_rl import signals
from recsys_rl.state import LIVE_STATE_FEATURES
from recsys_rl.training.agents.allocation import AllocationConfig, SLMGACAgent, expected_values
from recsys_rl.training.agents.factory import build_allocation_agent
from recsys_rl.training.agents.specs import allocation_transition_spec


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def project(probs: np.ndarray, atoms: np.ndarray, reward: float, discount: float) -> np.ndarray:
    """The C51 projection one atom at a time: each shifted atom's mass to its two neighbours."""
    out = np.zeros_like(atoms)
    delta = atoms[1] - atoms[0]
    for p, z in zip(probs, atoms, strict=True):
        position = (np.clip(reward + discount * z, atoms[0], atoms[-1]) - atoms[0]) / delta
        low = int(np.floor(position))
        if low == len(atoms) - 1:
            out[low] += p
        else:
            out[low] += p * (low + 1 - position)
            out[low + 1] += p * (position - low)
    return out


def huber(error: np.ndarray) -> np.ndarray:
    return np.where(np.abs(error) <= 1.0, 0.5 * error**2, np.abs(error) - 0.5)


def actor_losses_by_hand(
    q: np.ndarray, p: np.ndarray, logged: np.ndarray, multiplier: float
) -> tuple[float, float]:
    """The actor's scaled Lagrangian advantage term and its cross-entropy with the logged allocation."""
    combined = (q[:, 1, 0] - q[:, 0, 0]) + multiplier * (q[:, 1, 1] - q[:, 0, 1])
    advantage = -np.mean(p * combined) / (np.mean(np.abs(combined)) + 1e-6)
    return advantage, -np.mean(logged * np.log(p) + (1 - logged) * np.log1p(-p))


def agent_and_batch(algorithm: str = "sl-mgac", config: AllocationConfig = SMALL, n: int = 32):
    tf.keras.utils.set_random_seed(3)
    agent = build_allocation_agent(algorithm, stats(), config)
    agent.train(batch(n, seed=7))  # the target critic now differs from the critic
    return agent, batch(n, seed=3)  # a batch with gifts


@pytest.mark.parametrize("algorithm", ["sl-mgac", "sl-mgac-nosl"])
def test_the_critic_losses_are_the_projected_cross_entropy_and_the_supervised_fits(algorithm):
    config = replace(SMALL, supervised_weight=0.7)
    agent, experience = agent_and_batch(algorithm, config)
    obs = experience.time_step.observation
    nxt = experience.next_time_step.observation
    (logits, predictions), _ = agent.critic(obs)
    (next_logits, _), _ = agent._target_critic(nxt)
    logits, predictions, next_logits = logits.numpy(), predictions.numpy(), next_logits.numpy()
    p_next = agent.actor.insert_probability(nxt).numpy()
    rewards = agent.rewards(experience).numpy()
    continues = experience.next_time_step.discount.numpy()
    action = experience.action_step.action.numpy()[:, 0].astype(int)
    atoms = agent.atoms.numpy()
    gammas = (signals.get("live_watch_time").default_discount, config.usage_discount)
    assert not np.allclose(logits, agent._target_critic(obs)[0][0].numpy())  # the target lags

    distributional = np.zeros(2)
    for b in range(len(action)):
        for v in range(2):
            mixture = (1 - p_next[b]) * softmax(next_logits[b, 0, v]) + p_next[b] * softmax(
                next_logits[b, 1, v]
            )
            target = project(mixture, atoms[v], rewards[b, v], gammas[v] * continues[b])
            log_probs = np.log(softmax(logits[b, action[b], v].astype(np.float64)))
            distributional[v] -= np.sum(target * log_probs) / len(action)
    losses = agent.critic_losses(experience)
    np.testing.assert_allclose(losses.distributional.numpy(), distributional, rtol=2e-5)

    supervised = np.zeros(4)
    if algorithm == "sl-mgac":
        reward = experience.next_time_step.reward.numpy()
        assert np.any(reward[:, 1] > 0)  # gifts, whose label has a scale of its own
        labels = np.column_stack(
            [reward[:, 0] / 30.0, reward[:, 2] / 30.0, reward[:, 1] / 0.5, 1 - continues]
        )
        logged = predictions[np.arange(len(action)), action]  # (B, 4) at the logged action
        supervised[:3] = huber(labels[:, :3] - logged[:, :3]).mean(axis=0)
        exit_logit, ended = logged[:, 3], labels[:, 3]
        supervised[3] = np.mean(np.logaddexp(0, exit_logit) - ended * exit_logit)
        assert np.all(supervised > 0)
    np.testing.assert_allclose(losses.supervised.numpy(), supervised, rtol=2e-5, atol=1e-7)
    assert float(losses.total) == pytest.approx(distributional.sum() + 0.7 * supervised.sum(), rel=2e-5)


def test_the_usage_reward_is_in_live_watch_stds():
    agent, experience = agent_and_batch()
    obs = experience.time_step.observation.numpy()
    nxt = experience.next_time_step.observation.numpy()
    column = LIVE_STATE_FEATURES.index("session_watch")  # seconds of video so far / 100
    video = (
        np.maximum(100 * (nxt[:, column] - obs[:, column]), 0) * experience.next_time_step.discount.numpy()
    )
    live = experience.next_time_step.reward.numpy()[:, 0]
    np.testing.assert_allclose(agent.rewards(experience).numpy()[:, 1], (live + video) / 30.0, rtol=1e-5)


def test_expected_values_are_each_distributions_mean_on_its_own_atoms():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 2, 2, 5)).astype(np.float32)
    atoms = np.stack([np.linspace(-1.0, 3.0, 5), np.linspace(0.0, 40.0, 5)]).astype(np.float32)
    expected = np.sum(softmax(logits) * atoms, axis=-1)
    np.testing.assert_allclose(
        expected_values(tf.constant(logits), tf.constant(atoms)).numpy(), expected, rtol=1e-5
    )


def test_the_actor_losses_are_the_scaled_lagrangian_advantage_and_the_logged_cross_entropy():
    config = replace(SMALL, actor_supervised_weight=0.3)
    agent, experience = agent_and_batch(config=config)
    agent.multiplier.assign(0.6)
    rng = np.random.default_rng(2)
    # advantages of about 1e-3: the scale's 1e-6 guard is then a part in a thousand
    q = (1e-3 * rng.normal(size=(32, 2, 2))).astype(np.float32)
    p = agent.actor.insert_probability(experience.time_step.observation).numpy().astype(np.float64)
    logged = experience.action_step.action.numpy()[:, 0]
    assert 0 < logged.mean() < 1
    advantage, cross_entropy = actor_losses_by_hand(q, p, logged, 0.6)
    losses = agent.actor_losses(experience, tf.constant(q))
    assert float(losses.advantage) == pytest.approx(advantage, rel=1e-4)
    assert float(losses.supervised) == pytest.approx(cross_entropy, rel=1e-5)
    assert float(losses.total) == pytest.approx(advantage + 0.3 * cross_entropy, rel=1e-4)
    np.testing.assert_allclose(losses.insert_probability.numpy(), p, rtol=1e-6)
    # without q the critic's own action values
    own = agent.actor_losses(experience)
    q_own = agent.action_values(experience.time_step.observation).numpy()
    assert float(own.advantage) == pytest.approx(actor_losses_by_hand(q_own, p, logged, 0.6)[0], rel=1e-4)


def test_a_non_finite_actor_loss_is_named():
    agent, experience = agent_and_batch()
    with pytest.raises(tf.errors.InvalidArgumentError, match="actor/advantage"):
        agent.actor_losses(experience, tf.fill([32, 2, 2], np.float32(np.nan)))


def test_a_training_step_moves_the_multiplier_by_the_usage_gap_and_the_target_by_tau():
    config = replace(SMALL, target_update_tau=0.25, multiplier_learning_rate=0.5, usage_slack=0.01)
    agent, experience = agent_and_batch(config=config)
    agent.multiplier.assign(2.0)
    obs = experience.time_step.observation
    p_before = agent.actor.insert_probability(obs).numpy()
    target_before = [v.numpy().copy() for v in agent._target_critic.variables]
    critic_loss = float(agent.critic_losses(experience).total)
    info = agent.train(experience)
    q = agent.action_values(obs).numpy()  # the critic after its step; the actor's step comes after
    logged = SLMGACAgent.logged_insert_probability(experience).numpy()
    gap = np.mean((p_before - logged) * (q[:, 1, 1] - q[:, 0, 1]))
    assert float(info.extra["constraint_gap/usage"]) == pytest.approx(gap, rel=1e-4, abs=1e-7)
    assert float(agent.multiplier) == pytest.approx(max(0.0, 2.0 - 0.5 * (gap + 0.01)), rel=1e-5)
    assert float(info.extra["insert_rate"]) == pytest.approx(p_before.mean(), rel=1e-5)
    for before, target, critic in zip(
        target_before, agent._target_critic.variables, agent.critic.variables, strict=True
    ):
        np.testing.assert_allclose(
            target.numpy(), 0.75 * before + 0.25 * critic.numpy(), rtol=1e-5, atol=1e-6
        )
    assert set(info.extra) == {
        "critic/main",
        "critic/usage",
        "supervised/live_watch_time",
        "supervised/video_watch_displaced",
        "supervised/gift",
        "supervised/exit",
        "actor/advantage",
        "actor/supervised",
        "multiplier/usage",
        "constraint_gap/usage",
        "insert_rate",
    }
    # the actor's loss at the critic's new values, the actor's old probabilities and the old multiplier
    actions = experience.action_step.action.numpy()[:, 0]
    advantage, cross_entropy = actor_losses_by_hand(q, p_before.astype(np.float64), actions, 2.0)
    actor_loss = advantage + config.actor_supervised_weight * cross_entropy
    assert float(info.loss) == pytest.approx(critic_loss + actor_loss, rel=1e-4)


def test_a_new_agent_is_the_full_sl_mgac_with_its_target_equal_to_the_critic():
    counter = tf.Variable(5, dtype=tf.int64)
    agent = SLMGACAgent(stats(), SMALL, train_step_counter=counter)
    assert agent.critic.supervised and agent.critic.encoder.groups == 4
    for target, critic in zip(agent._target_critic.variables, agent.critic.variables, strict=True):
        np.testing.assert_array_equal(target.numpy(), critic.numpy())
    assert not agent.multiplier.trainable  # a dual variable: the Lagrange step moves it, not a gradient
    assert agent.training_data_spec == allocation_transition_spec()
    agent.train(batch(16))
    assert int(counter.numpy()) == 6
    with pytest.raises(NotImplementedError, match=r"^SL-MGAC reports its losses from train\(\)"):
        agent.loss(batch(16))
    single = build_allocation_agent("ac-single-group", stats(), SMALL)
    assert single.critic.encoder.groups == single.actor.encoder.groups == 1 and single.critic.supervised
