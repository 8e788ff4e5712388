"""The linear value model: its features by hand, exact recovery, and cross-fitting that never scores a row
with a model fitted on it."""

import dataclasses

import numpy as np
import pytest

from recsys_rl.ope.linear import expected_features, feature_width, features, solve_ridge
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.reward_model import fit_reward_model, session_folds
from recsys_rl.sim.behaviour import GaussianFeedPolicy, behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

FEED = behaviour_feed_policy()
TARGET = dataclasses.replace(FEED, base_logits=FEED.base_logits + 0.1)


@dataclasses.dataclass(frozen=True)
class MeanOf:
    """A deterministic policy: always the Gaussian's mean."""

    policy: GaussianFeedPolicy

    def log_prob(self, states, actions):
        return self.policy.log_prob(states, actions)

    def act(self, states, rng):
        mean = self.policy.mean(states)
        return mean, np.zeros(states.shape[0])


@pytest.fixture(scope="module")
def logged() -> LoggedSteps:
    day = Simulator(SimConfig(n_users=200), seed=2).run_day(FEED, behaviour_allocation_policy())
    return LoggedSteps.from_day_logs([day])


def test_features_by_hand():
    x = features(np.array([[2.0, 3.0]]), np.array([[5.0, 7.0]]))
    # 1, s, a, s (x) a row by row, then a_i a_j for i <= j
    assert x[0].tolist() == [1, 2, 3, 5, 7, 10, 14, 15, 21, 25, 35, 49]
    assert feature_width(2, 2) == 12 and feature_width(15, 7) == 156


def test_expected_features_average_the_draws_by_hand():
    draws = np.array([[[5.0, 7.0]], [[1.0, 1.0]]])  # two draws at one state
    x = expected_features(np.array([[2.0, 3.0]]), draws)
    # mean action (3, 4); mean products (25 + 1) / 2, (35 + 1) / 2, (49 + 1) / 2
    assert x[0].tolist() == [1, 2, 3, 3, 4, 6, 8, 9, 12, 13, 18, 25]


def test_ridge_recovers_a_linear_function_and_shrinks_with_a_large_penalty():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(500), rng.normal(5.0, 3.0, (500, 3))])
    theta = np.array([[1.0, -2.0], [0.5, 0.0], [-1.0, 3.0], [2.0, 1.0]])
    y = x @ theta
    zeros = np.zeros((4, 4))
    fitted = solve_ridge(x.T @ x, x.T @ y, zeros, ridge=1e-9, gammas=np.zeros(2), iterations=0)
    np.testing.assert_allclose(fitted, theta, atol=1e-5)
    shrunk = solve_ridge(x.T @ x, x.T @ y, zeros, ridge=1e6, gammas=np.zeros(2), iterations=0)
    # all slopes near zero, the intercept near the mean response
    np.testing.assert_allclose(shrunk[1:], 0.0, atol=1e-4)
    np.testing.assert_allclose(x @ shrunk, np.broadcast_to(y.mean(axis=0), y.shape), atol=1e-2)


def _exact_rewards(states: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Two signals that are exactly linear in the features (one has a squared action)."""
    s, a = states.astype(np.float64), actions.astype(np.float64)
    first = 1.0 + 2.0 * s[:, 5] - a[:, 0] + 0.5 * s[:, 4] * a[:, 1] + 0.3 * a[:, 0] * a[:, 2]
    second = -0.5 + a[:, 3] + 2.0 * a[:, 1] ** 2
    return np.column_stack([first, second])


def test_the_model_is_exact_for_rewards_in_its_feature_space(logged):
    exact = dataclasses.replace(
        logged, rewards=_exact_rewards(logged.states, logged.actions), signals=("first", "second")
    )
    deterministic = MeanOf(TARGET)
    model = fit_reward_model(exact, deterministic, folds=3, ridge=1e-7, samples=1, seed=0)
    np.testing.assert_allclose(model.q_logged, exact.rewards, atol=1e-3)
    np.testing.assert_allclose(
        model.v_target, _exact_rewards(logged.states, TARGET.mean(logged.states)), atol=1e-3
    )
    # a stochastic target: E[a_1^2] = m_1^2 + sigma^2, so the second signal rises by 2 sigma^2 on average
    stochastic = fit_reward_model(exact, TARGET, folds=3, ridge=1e-7, samples=8, seed=0)
    analytic = _exact_rewards(logged.states, TARGET.mean(logged.states))
    analytic[:, 1] += 2.0 * TARGET.sigma[1] ** 2
    # the model averages 8 sampled actions per row: allow four Monte Carlo standard errors of that mean,
    # from the spread of the draws at each state (the states themselves are fixed)
    rng = np.random.default_rng(1)
    draws = np.stack([_exact_rewards(logged.states, TARGET.act(logged.states, rng)[0]) for _ in range(64)])
    standard_error = np.sqrt(draws.var(axis=0, ddof=1).mean(axis=0) / (8 * logged.rows))
    error = np.abs(stochastic.v_target.mean(axis=0) - analytic.mean(axis=0))
    assert np.all(error < 4.0 * standard_error), (error, standard_error)


def test_folds_follow_sessions(logged):
    model = fit_reward_model(logged, TARGET, folds=4, seed=3)
    for start, stop in zip(logged.session_starts, np.r_[logged.session_starts[1:], logged.rows], strict=True):
        assert np.unique(model.folds[start:stop]).size == 1
    assert sorted(np.unique(model.folds).tolist()) == [0, 1, 2, 3]
    sizes = np.bincount(session_folds(logged.sessions, 4, seed=3))
    assert sizes.max() - sizes.min() <= 1


def test_no_row_is_scored_by_a_model_that_saw_its_reward(logged):
    model = fit_reward_model(logged, TARGET, folds=3, seed=1)
    held_out = model.folds == 0
    rewards = logged.rewards.copy()
    rewards[held_out] += 50.0 * np.random.default_rng(0).standard_normal((int(held_out.sum()), 7))
    perturbed = fit_reward_model(dataclasses.replace(logged, rewards=rewards), TARGET, folds=3, seed=1)
    # fold 0's rows are scored by the model fitted on folds 1 and 2, which never saw the change
    np.testing.assert_array_equal(perturbed.folds, model.folds)
    np.testing.assert_allclose(perturbed.q_logged[held_out], model.q_logged[held_out], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(perturbed.v_target[held_out], model.v_target[held_out], rtol=1e-9, atol=1e-10)
    # every other row's model did see it
    assert np.all(np.abs(perturbed.q_logged[~held_out] - model.q_logged[~held_out]).max(axis=1) > 1e-6)


def test_cross_fitted_predictions_differ_from_in_sample_ones(logged):
    crossed = fit_reward_model(logged, TARGET, folds=5, seed=0)
    in_sample = fit_reward_model(logged, TARGET, folds=1, seed=0)
    gap = np.abs(crossed.q_logged - in_sample.q_logged).mean(axis=0)
    assert np.all(gap > 1e-3 * np.abs(in_sample.q_logged).mean(axis=0))
    # in-sample residuals are smaller: the model has fitted part of each row's own noise
    crossed_error = np.mean((logged.rewards - crossed.q_logged) ** 2, axis=0)
    in_sample_error = np.mean((logged.rewards - in_sample.q_logged) ** 2, axis=0)
    assert np.all(in_sample_error < crossed_error)


def test_fits_are_deterministic_given_the_seed(logged):
    a = fit_reward_model(logged, TARGET, seed=7)
    b = fit_reward_model(logged, TARGET, seed=7)
    c = fit_reward_model(logged, TARGET, seed=8)
    np.testing.assert_array_equal(a.v_target, b.v_target)
    np.testing.assert_array_equal(a.q_logged, b.q_logged)
    assert not np.array_equal(a.folds, c.folds)


def test_more_folds_than_sessions_is_refused():
    with pytest.raises(ValueError, match="cannot split 3 sessions into 5 folds"):
        session_folds(3, 5, seed=0)
