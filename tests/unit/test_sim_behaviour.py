"""The simulator's logging policies, each checked against its closed form: the propensities they log are
what every importance weight in off-policy evaluation divides by."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.sim.behaviour import (
    BernoulliAllocationPolicy,
    FixedRateAllocationPolicy,
    GaussianFeedPolicy,
    ThresholdAllocationPolicy,
    behaviour_allocation_policy,
    behaviour_feed_policy,
)
from recsys_rl.state import FEED_STATE_FEATURES, LIVE_PREDICTION_SCALE, LIVE_STATE_FEATURES

K, D, L = len(FEED_ACTION_NAMES), len(FEED_STATE_FEATURES), len(LIVE_STATE_FEATURES)
DRAWS = 40_000


def feed_policy(seed: int = 0) -> GaussianFeedPolicy:
    rng = np.random.default_rng(seed)
    return GaussianFeedPolicy(rng.normal(size=K), rng.normal(size=(D, K)), rng.uniform(0.2, 1.5, size=K))


def test_the_feed_policy_mean_is_its_base_plus_the_linear_state_term():
    policy = feed_policy()
    states = np.random.default_rng(1).normal(size=(5, D))
    expected = [
        [policy.base_logits[k] + states[i] @ policy.state_coef[:, k] for k in range(K)] for i in range(5)
    ]
    np.testing.assert_allclose(policy.mean(states), expected)


def test_the_feed_log_density_is_the_sum_of_independent_normal_log_densities():
    policy = feed_policy()
    rng = np.random.default_rng(2)
    states, actions = rng.normal(size=(6, D)), rng.normal(size=(6, K))
    means = policy.mean(states)
    reference = [
        sum(
            -0.5 * ((actions[i, k] - means[i, k]) / policy.sigma[k]) ** 2
            - math.log(policy.sigma[k] * math.sqrt(2 * math.pi))
            for k in range(K)
        )
        for i in range(6)
    ]
    np.testing.assert_allclose(policy.log_prob(states, actions), reference, rtol=1e-12)


def test_feed_actions_are_drawn_around_the_mean_with_sigma_and_log_their_own_density():
    policy = feed_policy()
    states = np.tile(np.random.default_rng(3).normal(size=(1, D)), (DRAWS, 1))
    actions, log_prob = policy.act(states, np.random.default_rng(4))
    assert actions.shape == (DRAWS, K) and log_prob.shape == (DRAWS,)
    z = (actions - policy.mean(states)) / policy.sigma
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=0.03)  # 5 standard errors of 1 / sqrt(DRAWS)
    np.testing.assert_allclose(z.std(axis=0), 1.0, atol=0.02)
    assert abs(np.corrcoef(z, rowvar=False)[0, 1]) < 0.03  # independent dimensions
    np.testing.assert_allclose(log_prob, policy.log_prob(states, actions), rtol=1e-12)


@pytest.mark.parametrize(
    ("name", "shape"), [("base_logits", (K + 1,)), ("state_coef", (D, K - 1)), ("sigma", (1, K))]
)
def test_a_feed_policy_with_a_wrongly_shaped_parameter_is_refused_naming_it(name, shape):
    parameters = {"base_logits": np.zeros(K), "state_coef": np.zeros((D, K)), "sigma": np.ones(K)}
    parameters[name] = np.ones(shape)
    expected = {"base_logits": (K,), "state_coef": (D, K), "sigma": (K,)}[name]
    with pytest.raises(
        ValueError,
        match=re.escape(f"GaussianFeedPolicy.{name} should have shape {expected}, but has {shape}"),
    ):
        GaussianFeedPolicy(**parameters)


@pytest.mark.parametrize("smallest", [0.0, -0.1])
def test_a_feed_policy_without_a_positive_sigma_is_refused(smallest):
    sigma = np.ones(K)
    sigma[3] = smallest
    with pytest.raises(ValueError, match="sigma should be positive"):
        GaussianFeedPolicy(np.zeros(K), np.zeros((D, K)), sigma)
    sigma[3] = 1e-9  # just inside
    assert GaussianFeedPolicy(np.zeros(K), np.zeros((D, K)), sigma).sigma[3] == 1e-9


def test_the_logging_feed_policy_is_the_documented_hand_tuned_fusion_with_mild_state_dependence():
    policy = behaviour_feed_policy()
    np.testing.assert_allclose(np.exp(policy.base_logits), [1.0, 0.3, 0.3, 0.2, 0.2, 0.2, 0.5])
    np.testing.assert_array_equal(policy.sigma, np.full(K, 0.3))
    assert 0.05 < policy.state_coef.std() < 0.2 and policy.state_coef.shape == (D, K)
    assert policy.version == "behaviour-feed-v1"
    np.testing.assert_array_equal(behaviour_feed_policy(seed=7).state_coef, policy.state_coef)
    assert not np.array_equal(behaviour_feed_policy(seed=8).state_coef, policy.state_coef)
    np.testing.assert_array_equal(behaviour_feed_policy(sigma=0.5).sigma, np.full(K, 0.5))


def allocation_states(logits_by_coef: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """States whose ``states @ coef`` are the given values (coef has one non-zero entry)."""
    column = int(np.flatnonzero(coef)[0])
    states = np.zeros((len(logits_by_coef), L))
    states[:, column] = logits_by_coef / coef[column]
    return states


def test_the_bernoulli_insert_probability_is_the_squashed_logistic_kept_epsilon_from_0_and_1():
    coef = np.zeros(L)
    coef[0] = 2.0
    policy = BernoulliAllocationPolicy(bias=-0.5, coef=coef, epsilon=0.1)
    x = np.array([-60.0, -1.0, 0.0, 0.5, 2.0, 60.0])
    p = policy.insert_probability(allocation_states(x, coef))
    logistic = [1.0 / (1.0 + math.exp(-(v - 0.5))) for v in x]
    np.testing.assert_allclose(p, 0.1 + 0.8 * np.array(logistic), rtol=1e-12)
    assert p[0] == pytest.approx(0.1) and p[-1] == pytest.approx(0.9)
    assert p[3] == pytest.approx(0.5)  # the logit is 0 where states @ coef cancels the bias


def test_bernoulli_decisions_follow_their_probability_and_log_the_probability_of_the_decision_taken():
    coef = np.zeros(L)
    coef[1] = 1.0
    policy = BernoulliAllocationPolicy(bias=0.0, coef=coef, epsilon=0.05)
    states = allocation_states(np.repeat([-2.0, 1.5], DRAWS // 2), coef)
    p = policy.insert_probability(states)
    actions, log_prob = policy.act(states, np.random.default_rng(5))
    assert set(np.unique(actions)) == {0, 1} and actions.dtype == np.int64
    for half in (slice(0, DRAWS // 2), slice(DRAWS // 2, None)):
        assert actions[half].mean() == pytest.approx(p[half][0], abs=0.015)
    expected = np.log(np.where(actions == 1, p, 1.0 - p))
    np.testing.assert_allclose(log_prob, expected, rtol=1e-12)
    np.testing.assert_allclose(policy.log_prob(states, actions), expected, rtol=1e-12)
    np.testing.assert_allclose(policy.log_prob(states, 1 - actions), np.log(np.where(actions == 1, 1 - p, p)))


@pytest.mark.parametrize("epsilon", [0.0, 0.5, -0.01, 0.7])
def test_a_bernoulli_epsilon_outside_the_open_interval_to_one_half_is_refused(epsilon):
    with pytest.raises(ValueError, match=r"epsilon should be in \(0, 0\.5\)"):
        BernoulliAllocationPolicy(bias=0.0, coef=np.zeros(L), epsilon=epsilon)


@pytest.mark.parametrize("epsilon", [1e-9, 0.5 - 1e-9])
def test_a_bernoulli_epsilon_just_inside_its_interval_is_kept(epsilon):
    assert BernoulliAllocationPolicy(bias=0.0, coef=np.zeros(L), epsilon=epsilon).epsilon == epsilon


def test_a_bernoulli_policy_with_a_wrongly_shaped_coef_is_refused_naming_it():
    with pytest.raises(ValueError, match=rf"coef should have shape \({L},\), but has \({L + 1},\)"):
        BernoulliAllocationPolicy(bias=0.0, coef=np.zeros(L + 1))


def test_the_logging_allocation_rule_weighs_the_predictions_and_the_live_history_as_documented():
    policy = behaviour_allocation_policy(epsilon=0.2)
    expected = np.zeros(L)
    expected[LIVE_STATE_FEATURES.index("pred_live_watch_time")] = 2.0
    expected[LIVE_STATE_FEATURES.index("pred_video_watch_displaced")] = -1.0
    expected[LIVE_STATE_FEATURES.index("hist_live_watch")] = 1.0
    np.testing.assert_array_equal(policy.coef, expected)
    assert policy.bias == -1.0 and policy.epsilon == 0.2 and policy.version == "behaviour-live-v1"
    assert behaviour_allocation_policy().epsilon == 0.05


def test_greedy_allocation_compares_the_unscaled_prediction_strictly_with_its_threshold():
    column = LIVE_STATE_FEATURES.index("pred_live_watch_time")
    states = np.zeros((3, L))
    states[:, column] = np.array([13.0 - 1e-9, 13.0, 13.0 + 1e-9]) / LIVE_PREDICTION_SCALE[0]
    policy = ThresholdAllocationPolicy(13.0)
    np.testing.assert_array_equal(policy.insert_probability(states), [0.0, 0.0, 1.0])
    actions, _ = policy.act(states, np.random.default_rng(0))
    assert actions.dtype == np.int64


@pytest.mark.parametrize("rate", [1e-9, 1.0 - 1e-9])
def test_a_fixed_rate_just_inside_the_unit_interval_is_kept(rate):
    policy = FixedRateAllocationPolicy(rate)
    np.testing.assert_array_equal(policy.insert_probability(np.zeros((2, L))), [rate, rate])
    actions, _ = policy.act(np.zeros((3, L)), np.random.default_rng(0))
    assert actions.dtype == np.int64
