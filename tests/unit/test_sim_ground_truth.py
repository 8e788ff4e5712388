"""Monte-Carlo ground truth: hand-checked returns, convergence, and policy differences it can see."""

import dataclasses
import math

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.sim.behaviour import GaussianFeedPolicy, behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import discounted_returns, monte_carlo_values, run_days, step_within_episode
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

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


def test_the_return_rate_is_the_share_of_users_back_on_each_later_day():
    config = SimConfig(n_users=500)
    values = monte_carlo_values(config, FEED, LIVE, seed=0, days=3)
    logs = run_days(config, FEED, LIVE, seed=0, days=3)
    # counted from the logs: a user who came back had at least one feed request that day; day 0 is
    # everyone's first, so only days 1 and 2 count
    back = [np.unique(day.feed.user).size / config.n_users for day in logs[1:]]
    assert values.return_rate == pytest.approx(np.mean(back), abs=1e-12)
    assert [day.returning_users for day in logs[1:]] == [np.unique(day.feed.user).size for day in logs[1:]]
    assert np.isnan(monte_carlo_values(config, FEED, LIVE, seed=0, days=1).return_rate)


def test_without_memory_each_group_returns_at_its_base_rate_every_day():
    """docs/simulator.md: return = sigmoid(logit(return_base[group]) + 4 (memory - 0.3)); with the memory
    term off it is return_base[group] = (0.95, 0.85, 0.65, 0.4) on every day, whatever the policy showed."""
    response = dataclasses.replace(SimConfig().response, return_satisfaction=0.0)
    config = SimConfig(n_users=3000, response=response)
    logs = run_days(config, FEED, LIVE, seed=0, days=3)
    group = Simulator(config, seed=0).world.users.group  # the world is the seed's alone
    came = np.zeros((3, config.n_users), bool)
    for d, day in enumerate(logs):
        came[d, np.unique(day.feed.user)] = True
    for g, base in enumerate((0.95, 0.85, 0.65, 0.4)):
        mine = came[:, group == g]
        stderr = math.sqrt(base * (1 - base) / mine.size)
        assert abs(mine.mean() - base) < 4 * stderr, f"group {g}: {mine.mean():.3f} vs {base}"
    # with the default group mix (0.2, 0.3, 0.25, 0.25) the expected overall rate is 0.7075
    values = monte_carlo_values(config, FEED, LIVE, seed=0, days=3)
    assert abs(values.return_rate - 0.7075) < 4 * math.sqrt(0.7075 * 0.2925 / (2 * config.n_users))


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
