"""Monte-Carlo ground truth: hand-checked returns, convergence, and policy differences it can see."""

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.sim.behaviour import GaussianFeedPolicy, behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import discounted_returns, monte_carlo_values, run_days, step_within_episode
from recsys_rl.sim.parameters import SimConfig

FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()


def test_discounted_returns_by_hand():
    episode = np.array([7, 3, 7, 7])
    step = np.array([1, 0, 0, 2])
    rewards = np.array([[2.0, 1.0], [5.0, 0.0], [1.0, 1.0], [4.0, 1.0]])
    ids, returns = discounted_returns(episode, step, rewards, np.array([0.5, 0.9]))
    assert ids.tolist() == [3, 7]
    np.testing.assert_allclose(returns[0], [5.0, 0.0])
    np.testing.assert_allclose(returns[1], [1.0 + 0.5 * 2.0 + 0.25 * 4.0, 1.0 + 0.9 + 0.81])


def test_step_within_episode_orders_by_key():
    episode = np.array([1, 2, 1, 1, 2])
    key = np.array([30, 5, 10, 20, 1])
    assert step_within_episode(episode, key).tolist() == [2, 1, 0, 1, 0]


def _values(users: int, seed: int, feed=FEED):
    return monte_carlo_values(SimConfig(n_users=users), feed, LIVE, seed=seed)


def test_estimates_converge_as_episodes_grow():
    small, large = _values(400, seed=1), _values(6400, seed=1)
    other = _values(6400, seed=2)
    assert large.episodes > 10 * small.episodes
    for name in ("watch_time", "click", "like"):
        ratio = large.feed[name].stderr / small.feed[name].stderr
        # 16x the users -> about 1/4 the standard error
        assert 0.15 < ratio < 0.4, f"{name}: stderr ratio {ratio:.2f}"
        diff = abs(large.feed[name].mean - other.feed[name].mean)
        assert diff < 4.0 * np.hypot(large.feed[name].stderr, other.feed[name].stderr), name
    assert set(large.feed) == set(signals.FEED_SIGNALS)
    assert set(large.live) == set(signals.LIVE_SIGNALS)


def test_ground_truth_separates_a_click_chasing_policy_from_the_behaviour_policy():
    click_chaser = GaussianFeedPolicy(
        np.log(np.array([0.1, 3.0, 0.1, 0.1, 0.1, 0.1, 0.1])), np.zeros_like(FEED.state_coef), FEED.sigma
    )
    behaviour, chaser = _values(4000, seed=5), _values(4000, seed=5, feed=click_chaser)
    gap = behaviour.feed["watch_time"].mean - chaser.feed["watch_time"].mean
    assert gap > 4 * np.hypot(behaviour.feed["watch_time"].stderr, chaser.feed["watch_time"].stderr)
    assert chaser.feed["hate"].mean > behaviour.feed["hate"].mean


def test_multi_day_values_report_the_return_rate():
    values = monte_carlo_values(SimConfig(n_users=500), FEED, LIVE, seed=0, days=2)
    assert 0.0 < values.return_rate < 1.0


def test_days_must_be_positive():
    with pytest.raises(ValueError, match="days should be at least 1, but is 0"):
        monte_carlo_values(SimConfig(n_users=10), FEED, LIVE, seed=0, days=0)


def test_per_user_values_sum_each_users_expected_responses_over_every_day():
    config = SimConfig(n_users=300)
    values = monte_carlo_values(config, FEED, LIVE, seed=4, days=2)
    logs = run_days(config, FEED, LIVE, seed=4, days=2)
    by_hand = np.zeros((config.n_users, len(signals.FEED_SIGNALS)))
    for day in logs:
        np.add.at(by_hand, day.feed.user, day.feed.expected_reward)
    np.testing.assert_allclose(values.per_user, by_hand)
    # both days count: a user's total over two days exceeds the first day's
    first_day = np.zeros_like(by_hand)
    np.add.at(first_day, logs[0].feed.user, logs[0].feed.expected_reward)
    assert values.per_user[:, 0].sum() > first_day[:, 0].sum()
