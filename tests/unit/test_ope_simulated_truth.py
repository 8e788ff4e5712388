"""Simulator ground truth for the OPE report: the cluster formulas by hand, the runs against a reference
loop over the simulator's record, the pairing of candidate and baseline, and the world check."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.simulated_truth import (
    ClusterSums,
    PolicyTruth,
    SimulatorWorld,
    compare,
    simulate_truth,
    world_check,
)
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import discounted_returns, run_days, step_within_episode
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()
WORLD = SimulatorWorld(users=120, seed=2, repeats=2)


@pytest.fixture(scope="module")
def behaviour() -> PolicyTruth:
    return simulate_truth(WORLD, "feed", FEED, LIVE)


def test_a_ratio_mean_and_its_cluster_standard_error_by_hand():
    """Three users: rewards 2 over 1 decision, 4 over 3, none. Mean 6/4 = 1.5; influences (2 - 1.5)/4,
    (4 - 4.5)/4 and 0; standard error sqrt(3/2 (0.125^2 + 0.125^2)) = 0.21651."""
    sums = ClusterSums(np.array([[2.0], [4.0], [0.0]]), np.array([1.0, 3.0, 0.0]))
    assert sums.value == pytest.approx([1.5])
    np.testing.assert_allclose(sums.influence()[:, 0], [0.125, -0.125, 0.0])
    one = PolicyTruth({"per_decision": sums, "per_session_discounted": sums}, 3)
    other = ClusterSums(np.array([[1.0], [2.0], [1.0]]), np.array([1.0, 3.0, 0.0]))  # mean 1
    two = PolicyTruth({"per_decision": other, "per_session_discounted": other}, 3)
    figures = compare(("watch_time",), one, two)["per_decision"]["watch_time"]
    assert figures["candidate"]["stderr"] == pytest.approx(0.216506, rel=1e-5)
    assert figures["difference"]["value"] == pytest.approx(0.5)
    assert figures["relative"]["value"] == pytest.approx(0.5)
    # paired: influence differences (0.125 - 0, -0.125 + 0.25, 0 - 0.25) = (0.125, 0.125, -0.25)
    assert figures["difference"]["stderr"] == pytest.approx((1.5 * (2 * 0.125**2 + 0.25**2)) ** 0.5)
    # delta method: u_a / |b| - u_b a / b^2 with a = 1.5, b = 1
    relative = np.array([0.125, -0.125, 0.0]) - np.array([0.0, -0.25, 0.25]) * 1.5
    assert figures["relative"]["stderr"] == pytest.approx((1.5 * np.square(relative).sum()) ** 0.5)


def test_the_truth_is_the_simulators_record_averaged(behaviour):
    """Against a plain loop over the same runs: the mean expected reward per request, and the mean
    discounted session return."""
    gammas = np.asarray(signals.discounts(signals.FEED_SIGNALS))
    rewards, returns = [], []
    for repeat in range(WORLD.repeats):
        (day,) = run_days(
            SimConfig(n_users=WORLD.users), FEED, LIVE, seed=WORLD.seed, episode_seed=1 + repeat
        )
        rewards.append(day.feed.expected_reward)
        step = step_within_episode(day.feed.session, day.feed.page)
        returns.append(discounted_returns(day.feed.session, step, day.feed.expected_reward, gammas)[1])
    np.testing.assert_allclose(behaviour.scales["per_decision"].value, np.concatenate(rewards).mean(axis=0))
    np.testing.assert_allclose(
        behaviour.scales["per_session_discounted"].value, np.concatenate(returns).mean(axis=0)
    )
    assert behaviour.sessions == sum(r.shape[0] for r in returns)


def test_a_policy_against_itself_differs_by_exactly_nothing(behaviour):
    """The same world and episode seeds: the pairing removes every bit of noise from the difference."""
    again = simulate_truth(WORLD, "feed", FEED, LIVE)
    for scale in compare(signals.FEED_SIGNALS, again, behaviour).values():
        for figures in scale.values():
            assert figures["difference"] == {"value": 0.0, "stderr": 0.0}
            assert figures["candidate"] == figures["baseline"]


def test_live_allocation_truth_counts_allocation_decisions_and_their_sessions():
    truth = simulate_truth(dataclasses.replace(WORLD, repeats=1), "live_allocation", FEED, LIVE)
    (day,) = run_days(SimConfig(n_users=WORLD.users), FEED, LIVE, seed=WORLD.seed, episode_seed=1)
    np.testing.assert_allclose(truth.scales["per_decision"].value, day.live.expected_reward.mean(axis=0))
    assert truth.sessions == np.unique(day.live.session).size
    assert truth.scales["per_decision"].sums.shape == (WORLD.users, len(signals.LIVE_SIGNALS))


def test_the_world_check_tells_the_logs_world_from_another(behaviour):
    logs = Simulator(SimConfig(n_users=WORLD.users), WORLD.seed).run_day(FEED, LIVE)
    logged = LoggedSteps.from_day_logs([logs])
    check = world_check(logged, behaviour)
    assert check["passed"] and abs(check["z"]) < 4, check
    # logs whose watch time is half as long again do not come from this world
    inflated = dataclasses.replace(logged, rewards=logged.rewards * np.r_[1.5, np.ones(6)])
    check = world_check(inflated, behaviour)
    assert not check["passed"] and check["z"] > 4, check


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"users": 0}, "simulator users should be at least 1, but is 0", id="users"),
        pytest.param({"users": 5, "repeats": 0}, "simulator repeats should be at least 1", id="repeats"),
        pytest.param({"users": 5, "seed": -1}, "simulator seed should be non-negative", id="seed"),
    ],
)
def test_a_bad_world_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        SimulatorWorld(**fields)
