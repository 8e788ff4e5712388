"""SL-MGAC (recsys_rl.training.agents.allocation): group routing, the C51 projection, the anti-greedy term,
the rewards, config checks, a few training steps, and the exported policy against the actor it came from."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf
from allocation_batches import SMALL, D, batch, states, stats

from recsys_rl import signals
from recsys_rl.state import ACTIVITY_GROUPS, LIVE_STATE_FEATURES
from recsys_rl.training.agents.allocation import (
    PENALTY_SUPPORT_STDS,
    AllocationConfig,
    SLMGACAgent,
    anti_greedy_penalty,
    categorical_projection,
    usage_rewards,
)
from recsys_rl.training.agents.factory import build_agent, build_allocation_agent
from recsys_rl.training.agents.networks import AllocationCriticNetwork, BernoulliActorNetwork
from recsys_rl.training.agents.policy_io import export_allocation_policy, load_allocation_policy
from recsys_rl.training.agents.specs import LOG_PROPENSITY_KEY, live_observation_spec

# -- group routing ---------------------------------------------------------------------------------------


def _gradients(network, observations, output) -> dict[str, float]:
    with tf.GradientTape() as tape:
        loss = output(network, observations)
    grads = tape.gradient(loss, network.trainable_variables)
    return {
        v.name: 0.0 if g is None else float(tf.reduce_sum(tf.abs(g)))
        for v, g in zip(network.trainable_variables, grads, strict=True)
    }


def _actor(initial_rate: float = 0.3, epsilon: float = 0.05) -> BernoulliActorNetwork:
    net = BernoulliActorNetwork(
        live_observation_spec(),
        state_mean=np.full(D, 0.5),
        state_std=np.full(D, 0.3),
        initial_rate=initial_rate,
        epsilon=epsilon,
        shared=(8,),
        tower=(8,),
        groups=len(ACTIVITY_GROUPS),
    )
    net.create_variables()
    return net


def _critic(groups: int = len(ACTIVITY_GROUPS), supervised: bool = True) -> AllocationCriticNetwork:
    net = AllocationCriticNetwork(
        live_observation_spec(),
        state_mean=np.full(D, 0.5),
        state_std=np.full(D, 0.3),
        values=2,
        atoms=5,
        shared=(8,),
        tower=(8,),
        head_hidden=8,
        groups=groups,
        supervised=supervised,
    )
    net.create_variables()
    return net


def _critic_output(net, obs):
    (logits, supervised), _ = net(obs)
    return tf.reduce_sum(tf.square(logits)) + tf.reduce_sum(tf.square(supervised))


@pytest.mark.parametrize(
    ("make", "output"),
    [
        pytest.param(_actor, lambda net, obs: tf.reduce_sum(net.insert_probability(obs)), id="actor"),
        pytest.param(_critic, _critic_output, id="critic"),
    ],
)
@pytest.mark.parametrize("group", range(len(ACTIVITY_GROUPS)))
def test_one_groups_gradient_touches_only_its_tower_and_the_shared_parts(make, output, group):
    tf.keras.utils.set_random_seed(0)
    net = make()
    grads = _gradients(net, tf.constant(states(16, group=group)), output)
    for name, size in grads.items():
        tower = next((g for g in range(len(ACTIVITY_GROUPS)) if f"_tower{g}_" in name), None)
        if tower is None or tower == group:  # shared encoder, heads
            assert size > 0, name
        else:
            assert size == 0.0, name


def test_without_routing_there_is_one_tower_for_every_group():
    tf.keras.utils.set_random_seed(0)
    net = _critic(groups=1)
    names = {v.name for v in net.trainable_variables}
    assert any("_tower0_" in n for n in names) and not any("_tower1_" in n for n in names)
    grads = _gradients(net, tf.constant(states(16, group=2)), _critic_output)
    assert all(size > 0 for size in grads.values())


def test_routing_needs_a_group():
    with pytest.raises(ValueError, match="groups should be at least 1, but is 0"):
        _critic(groups=0)


# -- the actor's floor and its start ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial_rate", "expected"),
    [
        pytest.param(0.3, 0.3, id="inside"),
        pytest.param(0.12, 0.12, id="low"),
        pytest.param(0.85, 0.85, id="high"),
        # rates the floor cannot reach start at 2% or 98% of the way between the floors
        pytest.param(0.0, 0.05 + 0.9 * 0.02, id="below-the-floor"),
        pytest.param(1.0, 0.05 + 0.9 * 0.98, id="above-the-ceiling"),
    ],
)
def test_an_untrained_actor_inserts_at_the_initial_rate_within_its_floors(initial_rate, expected):
    tf.keras.utils.set_random_seed(0)
    p = _actor(initial_rate=initial_rate, epsilon=0.05).insert_probability(tf.constant(states(64)))
    np.testing.assert_allclose(p.numpy(), expected, atol=2e-3)  # the logit's kernel starts within 1e-3


@pytest.mark.parametrize(("logit", "expected"), [(60.0, 0.95), (-60.0, 0.05), (0.0, 0.5)])
def test_the_insert_probability_stays_epsilon_away_from_0_and_1(logit, expected):
    tf.keras.utils.set_random_seed(0)
    actor = _actor(epsilon=0.05)
    layer = actor._logit
    layer.kernel.assign(tf.zeros_like(layer.kernel))
    layer.bias.assign([logit])
    np.testing.assert_allclose(actor.insert_probability(tf.constant(states(8))).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("epsilon", [0.0, -0.1, 0.5, 0.7])
def test_an_epsilon_outside_its_open_range_is_refused(epsilon):
    with pytest.raises(ValueError, match=rf"epsilon should be in \(0, 0.5\), but is {epsilon}"):
        _actor(epsilon=epsilon)


def test_a_critic_without_supervised_heads_predicts_nothing_for_both_actions():
    tf.keras.utils.set_random_seed(0)
    (logits, supervised), _ = _critic(supervised=False)(tf.constant(states(4)))
    assert logits.shape == (4, 2, 2, 5)
    assert supervised.shape == (4, 2, 0)


# -- the distributional target ---------------------------------------------------------------------------

# a plain list: a module-level tensor starts TensorFlow's runtime at collection, and workers forked from a
# process that collected the tests (mutmut's fork server, pyproject's [tool.mutation]) then hang
ATOMS = [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("next_probs", "reward", "discount", "expected"),
    [
        # all mass on z=1: 0.5 + 1 = 1.5 splits evenly between atoms 1 and 2
        pytest.param([0.0, 1.0, 0.0], 0.5, 1.0, [0.0, 0.5, 0.5], id="shift-between-atoms"),
        # terminal: every atom maps to the reward 1.25 -> 3/4 on atom 1, 1/4 on atom 2
        pytest.param([0.2, 0.3, 0.5], 1.25, 0.0, [0.0, 0.75, 0.25], id="terminal"),
        # gamma 0.5 shrinks the support to (0, 0.5, 1): 0.2 + 0.3/2 on 0, 0.3/2 + 0.5 on 1
        pytest.param([0.2, 0.3, 0.5], 0.0, 0.5, [0.35, 0.65, 0.0], id="discount"),
        pytest.param([0.2, 0.3, 0.5], 5.0, 1.0, [0.0, 0.0, 1.0], id="clipped-above"),
        pytest.param([0.2, 0.3, 0.5], -5.0, 1.0, [1.0, 0.0, 0.0], id="clipped-below"),
        # 1 + 0.9 z = (1, 1.9, 2.8->2): 0.2 on 1; 0.3 split 0.1/0.9 between 1 and 2; 0.5 on 2
        pytest.param([0.2, 0.3, 0.5], 1.0, 0.9, [0.0, 0.23, 0.77], id="shift-and-discount"),
    ],
)
def test_the_categorical_projection_on_hand_computed_cases(next_probs, reward, discount, expected):
    projected = categorical_projection(
        tf.constant([next_probs]), tf.constant(ATOMS), tf.constant([reward]), tf.constant([discount])
    )
    np.testing.assert_allclose(projected.numpy()[0], expected, atol=1e-6)


def test_the_projection_keeps_probability_mass():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(11), 64).astype(np.float32)
    atoms = tf.constant(np.linspace(-2.0, 8.0, 11), tf.float32)
    projected = categorical_projection(
        tf.constant(probs), atoms, tf.constant(rng.normal(0, 3, 64), tf.float32), tf.fill([64], 0.95)
    )
    np.testing.assert_allclose(tf.reduce_sum(projected, axis=1).numpy(), np.ones(64), atol=1e-5)
    assert float(tf.reduce_min(projected)) >= 0.0


# -- rewards -------------------------------------------------------------------------------------------------


def test_the_anti_greedy_term_charges_only_insertions_that_displace_more_than_they_earn():
    penalty = anti_greedy_penalty(
        inserted=tf.constant([1.0, 1.0, 0.0, 1.0]),
        displaced=tf.constant([20.0, 5.0, 20.0, 10.0]),
        live=tf.constant([5.0, 20.0, 5.0, 10.0]),
    )
    np.testing.assert_allclose(penalty.numpy(), [15.0, 0.0, 0.0, 0.0])


def test_usage_is_live_watch_plus_the_video_watched_until_the_next_decision():
    column = LIVE_STATE_FEATURES.index("session_watch")
    obs, nxt = np.zeros((3, D), np.float32), np.zeros((3, D), np.float32)
    obs[:, column], nxt[:, column] = 0.5, [1.7, 0.9, 3.0]  # 120 s, 40 s, and a terminal step
    usage = usage_rewards(
        tf.constant([10.0, 0.0, 30.0]), tf.constant(obs), tf.constant(nxt), tf.constant([1.0, 1.0, 0.0])
    )
    np.testing.assert_allclose(usage.numpy(), [130.0, 40.0, 30.0], rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["sl-mgac", "sl-mgac-nosl"])
def test_the_main_reward_subtracts_the_weighted_anti_greedy_term_from_live_watch(algorithm):
    agent = build_allocation_agent(algorithm, stats(), AllocationConfig(anti_greedy_weight=2.0))
    experience = batch(64)
    obs = experience.time_step.observation.numpy()
    reward = experience.next_time_step.reward.numpy()
    inserted = experience.action_step.action.numpy()[:, 0]
    # the upstream predictions in the state (scales 30 s and 13 s), with the supervised heads too
    live_hat = obs[:, LIVE_STATE_FEATURES.index("pred_live_watch_time")] * 30.0
    displaced_hat = obs[:, LIVE_STATE_FEATURES.index("pred_video_watch_displaced")] * 13.0
    expected = (reward[:, 0] - 2.0 * inserted * np.maximum(displaced_hat - live_hat, 0.0)) / 30.0
    assert np.any(inserted * np.maximum(displaced_hat - live_hat, 0.0) > 0)  # the penalty is in play
    np.testing.assert_allclose(agent.rewards(experience).numpy()[:, 0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weight", [1.0, 8.0])
def test_the_main_support_keeps_the_return_of_a_costly_insertion_at_any_anti_greedy_weight(weight):
    agent = build_allocation_agent("sl-mgac", stats(), AllocationConfig(anti_greedy_weight=weight))
    atoms = agent.atoms[0]
    # an insertion that ends the session, displacing 0.9 stds per unit of beta more than it earns, after
    # the worst unpenalised return the support allows
    floor = AllocationConfig().main_support[0]
    rewards = tf.constant([floor - weight * 0.9, floor - weight * PENALTY_SUPPORT_STDS], tf.float32)
    target = categorical_projection(tf.one_hot([0, 0], atoms.shape[0]), atoms, rewards, tf.zeros([2]))
    np.testing.assert_allclose(tf.reduce_sum(target * atoms, axis=-1).numpy(), rewards.numpy(), rtol=1e-5)


# -- config, registry ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"atoms": 1}, "atoms should be at least 2", id="atoms"),
        pytest.param({"main_support": (3.0, 1.0)}, "main_support should be", id="support"),
        pytest.param({"epsilon": 0.5}, "epsilon should be in", id="epsilon"),
        pytest.param({"usage_discount": 1.0}, "usage_discount should be in", id="discount"),
        pytest.param({"tower_hidden": ()}, "tower_hidden should list", id="tower"),
        pytest.param({"anti_greedy_weight": -1.0}, "anti_greedy_weight should be >= 0", id="beta"),
        # at each range's edge, with the value named
        pytest.param({"shared_hidden": (8, 0)}, r"shared_hidden should list .* \(8, 0\)", id="empty-layer"),
        pytest.param({"usage_support": (2.0, 2.0)}, "usage_support should be", id="empty-support"),
        pytest.param({"head_hidden": 0}, "head_hidden should be positive, but is 0", id="head"),
        pytest.param({"critic_learning_rate": 0.0}, "critic_learning_rate should be positive", id="lr"),
        pytest.param(
            {"target_update_tau": 0.0}, r"target_update_tau should be in \(0, 1\], but is 0", id="tau-0"
        ),
        pytest.param({"target_update_tau": 1.5}, "target_update_tau should be in", id="tau-above"),
        pytest.param({"epsilon": 0.0}, "epsilon should be in", id="epsilon-0"),
        pytest.param({"usage_discount": -0.1}, "usage_discount should be in", id="discount-below"),
    ],
)
def test_bad_allocation_configs_are_refused_with_the_field_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AllocationConfig(**kwargs)


def test_configs_at_the_edge_of_every_range_are_accepted():
    AllocationConfig(
        shared_hidden=(1,), tower_hidden=(1,), atoms=2, usage_discount=0.0, target_update_tau=1.0
    )
    AllocationConfig(anti_greedy_weight=0.0, supervised_weight=0.0, usage_slack=0.0, initial_multiplier=0.0)


def test_the_registry_keeps_surfaces_apart():
    from recsys_rl.training.agents.base import AgentConfig

    with pytest.raises(ValueError, match="live-allocation algorithm"):
        build_agent("sl-mgac", stats(), AgentConfig(), stage_one_steps=0)
    with pytest.raises(ValueError, match="not a live-allocation algorithm"):
        build_allocation_agent("tscac", stats(), SMALL)


# -- training and export ---------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sl-mgac", "sl-mgac-nosl", "ac-single-group"])
def test_a_few_steps_train_every_variant_with_finite_named_losses(algorithm):
    tf.keras.utils.set_random_seed(0)
    agent = build_allocation_agent(algorithm, stats(), SMALL)
    assert isinstance(agent, SLMGACAgent)
    before = [v.numpy().copy() for v in agent.actor.trainable_variables]
    for seed in range(3):
        info = agent.train(batch(32, seed))
    assert np.isfinite(float(info.loss))
    assert {"critic/main", "critic/usage", "actor/advantage", "multiplier/usage"} <= set(info.extra)
    assert ("supervised/exit" in info.extra) == (algorithm != "sl-mgac-nosl")
    assert int(agent.train_step_counter.numpy()) == 3
    assert any(
        not np.allclose(b, v.numpy()) for b, v in zip(before, agent.actor.trainable_variables, strict=True)
    )


def test_a_non_finite_loss_is_named():
    agent = build_allocation_agent("sl-mgac", stats(), SMALL)
    experience = batch(8)
    broken = experience._replace(
        next_time_step=experience.next_time_step._replace(
            reward=tf.fill(experience.next_time_step.reward.shape, np.float32(np.nan))
        )
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="critic/"):
        agent.critic_losses(broken)


def test_the_exported_policy_matches_the_actor_in_probability_decision_and_log_probability(tmp_path):
    tf.keras.utils.set_random_seed(0)
    agent = build_allocation_agent("sl-mgac", stats(), SMALL)
    agent.train(batch(32))
    manifest = export_allocation_policy(agent, tmp_path / "policy", {"algo": "sl-mgac", "version": "v-test"})
    assert manifest["kind"] == "allocation_policy" and manifest["surface"] == "live_allocation"
    assert manifest["signals"] == list(signals.LIVE_SIGNALS)
    policy = load_allocation_policy(tmp_path / "policy")
    obs = states(64, seed=5)
    p = agent.actor.insert_probability(tf.constant(obs)).numpy()
    np.testing.assert_allclose(policy.insert_probability(obs), p, rtol=1e-5)
    flags = (np.arange(64) % 2).astype(np.float32)
    np.testing.assert_allclose(
        policy.log_prob(obs, flags), np.where(flags == 1, np.log(p), np.log1p(-p)), rtol=1e-5
    )
    actions, log_prob = policy.act(obs, np.random.default_rng(0))  # the mode: insert iff p >= 1/2
    np.testing.assert_array_equal(actions, (p >= 0.5).astype(np.int64))
    np.testing.assert_allclose(log_prob, policy.log_prob(obs, actions), rtol=1e-5)
    sampled = policy.model.sample_action({"observation": tf.constant(obs), "seed": tf.constant([[3, 4]])})
    again = policy.model.sample_action({"observation": tf.constant(obs), "seed": tf.constant([[3, 4]])})
    np.testing.assert_array_equal(sampled["action"].numpy(), again["action"].numpy())
    np.testing.assert_allclose(
        sampled["log_probability"].numpy(), policy.log_prob(obs, sampled["action"].numpy()), rtol=1e-5
    )
    column, log_prob_ope = policy.for_ope().act(obs, np.random.default_rng(0))
    assert column.shape == (64, 1) and log_prob_ope.shape == (64,)


def test_the_usage_gap_is_measured_against_the_logging_policy():
    # q[b, action, value]: value 1 is usage; insert costs 2 on the first state and earns 3 on the second
    q = tf.constant([[[0.0, 5.0], [9.0, 3.0]], [[0.0, 1.0], [9.0, 4.0]]])
    policy, logging = tf.constant([0.5, 1.0]), tf.constant([0.25, 0.5])
    gap = SLMGACAgent.usage_gap(q, policy, logging)
    assert float(gap) == pytest.approx(((0.5 - 0.25) * -2.0 + (1.0 - 0.5) * 3.0) / 2)
    # allocating exactly as the logs did meets the constraint, costly insertions and all
    assert float(SLMGACAgent.usage_gap(q, logging, logging)) == 0.0


def test_the_logging_policys_insert_probability_comes_from_the_logged_propensity():
    experience = SimpleNamespace(
        action_step=SimpleNamespace(
            action=tf.constant([[1.0], [0.0]]),
            info={LOG_PROPENSITY_KEY: tf.math.log(tf.constant([0.3, 0.8]))},
        )
    )
    mu = SLMGACAgent.logged_insert_probability(experience)
    np.testing.assert_allclose(mu.numpy(), [0.3, 0.2], rtol=1e-6)
