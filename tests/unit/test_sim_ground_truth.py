"""Monte-Carlo ground truth: hand-checked returns, convergence, and policy differences it can see."""

import dataclasses
import math

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.sim.behaviour import GaussianFeedPolicy, behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import (
    Estimate,
    _estimates,
    discounted_returns,
    evaluate_logs,
    monte_carlo_values,
    run_days,
    step_within_episode,
)
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
    values = monte_carlo_values(config, FEED, LIVE, seed=1, days=3)
    logs = run_days(config, FEED, LIVE, seed=1, days=3)
    # counted from the logs: a user who came back had at least one feed request that day; day 0 is
    # everyone's first, so only days 1 and 2 count
    back = [np.unique(day.feed.user).size / config.n_users for day in logs[1:]]
    assert back[0] != back[1]  # so that the rate can tell which days it counted
    assert values.return_rate == pytest.approx(np.mean(back), abs=1e-12)
    assert [day.returning_users for day in logs[1:]] == [np.unique(day.feed.user).size for day in logs[1:]]
    assert np.isnan(monte_carlo_values(config, FEED, LIVE, seed=1).return_rate)  # one day by default


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


def test_estimates_by_hand_for_no_one_and_several_episodes():
    names = ("a", "b")
    assert all(
        math.isnan(e.mean) and math.isnan(e.stderr) and e.n == 0
        for e in _estimates(names, np.zeros((0, 2))).values()
    )
    assert _estimates(names, np.array([[2.0, 3.0]])) == {
        "a": Estimate(2.0, math.inf, 1),
        "b": Estimate(3.0, math.inf, 1),
    }
    two = _estimates(names, np.array([[1.0, 0.0], [3.0, 0.0]]))
    assert [two["a"].mean, two["a"].stderr, two["a"].n] == pytest.approx([2.0, 1.0, 2])  # sqrt(2) / sqrt(2)
    three = _estimates(names, np.array([[1.0, 0.0], [2.0, 0.0], [6.0, 3.0]]))
    # sample variances (4 + 1 + 9) / 2 = 7 and (1 + 1 + 4) / 2 = 3, over 3 episodes
    assert [three["a"].mean, three["a"].stderr, three["a"].n] == pytest.approx([3.0, math.sqrt(7.0 / 3.0), 3])
    assert [three["b"].mean, three["b"].stderr, three["b"].n] == pytest.approx([1.0, 1.0, 3])


def test_live_values_are_each_sessions_discounted_allocation_returns_zero_without_one():
    config = SimConfig(n_users=300)
    logs = run_days(config, FEED, LIVE, seed=2, days=2)
    values = evaluate_logs(logs, config.n_users)
    gammas = np.asarray(signals.discounts(signals.LIVE_SIGNALS))
    sessions = np.unique(np.concatenate([day.feed.session for day in logs]))
    returns = {session: np.zeros(len(signals.LIVE_SIGNALS)) for session in sessions}
    for day in logs:
        for session in np.unique(day.live.session):
            mine = day.live.session == session
            order = np.argsort(day.live.page[mine])
            for step, reward in enumerate(day.live.reward[mine][order]):
                returns[session] += gammas**step * reward
    by_hand = np.array(list(returns.values()))
    assert 0 < (by_hand.any(axis=1)).mean() < 1  # sessions with and without an allocation decision
    for name, column in zip(signals.LIVE_SIGNALS, by_hand.T, strict=True):
        assert values.live[name].mean == pytest.approx(column.mean(), rel=1e-12)
        assert values.live[name].n == sessions.size


def test_ground_truth_runs_the_episodes_it_is_given():
    """The same world with episodes of seed 0 (the logs' own) or, by default, of seed 1."""
    config = SimConfig(n_users=200)
    logged = monte_carlo_values(config, FEED, LIVE, seed=3, episode_seed=0)
    by_hand = evaluate_logs(run_days(config, FEED, LIVE, seed=3, episode_seed=0), config.n_users)
    np.testing.assert_array_equal(logged.per_user, by_hand.per_user)
    fresh = monte_carlo_values(config, FEED, LIVE, seed=3)
    assert not np.array_equal(fresh.per_user, logged.per_user)
    np.testing.assert_array_equal(
        fresh.per_user,
        evaluate_logs(run_days(config, FEED, LIVE, seed=3, episode_seed=1), config.n_users).per_user,
    )
