"""The allocation baselines (greedy threshold, fixed rate) and the simulator's allocation evaluation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recsys_rl.sim.behaviour import (
    FixedRateAllocationPolicy,
    ThresholdAllocationPolicy,
    behaviour_feed_policy,
)
from recsys_rl.sim.ground_truth import run_days
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.sim_eval import AllocationOutcome, allocation_outcome, compare_allocation
from recsys_rl.state import LIVE_STATE_FEATURES

PRED_LIVE = LIVE_STATE_FEATURES.index("pred_live_watch_time")


def live_states(predicted_live_s: list[float]) -> np.ndarray:
    states = np.zeros((len(predicted_live_s), len(LIVE_STATE_FEATURES)))
    states[:, PRED_LIVE] = np.asarray(predicted_live_s) / 30.0  # the state's scaling of the prediction
    return states


def test_greedy_inserts_exactly_when_the_predicted_live_watch_beats_the_threshold():
    actions, log_prob = ThresholdAllocationPolicy(13.0).act(
        live_states([5.0, 12.9, 13.1, 60.0]), np.random.default_rng(0)
    )
    np.testing.assert_array_equal(actions, [0, 0, 1, 1])
    np.testing.assert_array_equal(log_prob, np.zeros(4))  # deterministic


def test_a_linear_rule_charges_the_displaced_watch_and_credits_the_users_live_history():
    states = live_states([20.0, 20.0, 20.0, 20.0])
    states[:, LIVE_STATE_FEATURES.index("pred_video_watch_displaced")] = (
        np.array([13.0, 2.0, 13.0, 13.0]) / 13.0
    )
    states[:, LIVE_STATE_FEATURES.index("hist_live_watch")] = [0.0, 0.0, 1.0, 0.2]
    rule = ThresholdAllocationPolicy(10.0, displaced_weight=0.5, history_weight=4.0)
    # scores: 20 - 6.5 = 13.5; 20 - 1 = 19; 20 - 6.5 + 4 = 17.5; 20 - 6.5 + 0.8 = 14.3
    np.testing.assert_array_equal(rule.insert_probability(states), [1, 1, 1, 1])
    np.testing.assert_array_equal(
        ThresholdAllocationPolicy(14.0, displaced_weight=0.5, history_weight=4.0).insert_probability(states),
        [0, 1, 1, 1],
    )
    np.testing.assert_array_equal(
        ThresholdAllocationPolicy(15.0, displaced_weight=0.5, history_weight=4.0).insert_probability(states),
        [0, 1, 1, 0],
    )
    # greedy reads only the live prediction
    np.testing.assert_array_equal(ThresholdAllocationPolicy(19.5).insert_probability(states), [1, 1, 1, 1])


def test_fixed_rate_ignores_the_state_and_logs_its_bernoulli_probabilities():
    policy = FixedRateAllocationPolicy(0.25)
    actions, log_prob = policy.act(live_states([0.0] * 20_000), np.random.default_rng(0))
    assert actions.mean() == pytest.approx(0.25, abs=0.01)
    np.testing.assert_allclose(log_prob, np.where(actions == 1, np.log(0.25), np.log(0.75)))


@pytest.mark.parametrize("rate", [0.0, 1.0, -0.1])
def test_a_fixed_rate_outside_the_open_unit_interval_is_refused(rate):
    with pytest.raises(ValueError, match="rate should be in"):
        FixedRateAllocationPolicy(rate)


def test_allocation_outcomes_are_paired_and_add_up():
    config = SimConfig(n_users=60)
    never = allocation_outcome(config, ThresholdAllocationPolicy(1e9), seed=3, days=2)
    greedy = allocation_outcome(config, ThresholdAllocationPolicy(13.0), seed=3, days=2)
    again = allocation_outcome(config, ThresholdAllocationPolicy(13.0), seed=3, days=2)
    np.testing.assert_array_equal(greedy.per_user["total_usage_s"], again.per_user["total_usage_s"])
    assert never.allocation_rate == 0.0 and never.per_user["live_watch_s"].sum() == 0.0
    assert 0.0 < greedy.allocation_rate < 1.0 and 0.0 <= greedy.return_rate <= 1.0
    np.testing.assert_allclose(
        greedy.per_user["total_usage_s"], greedy.per_user["live_watch_s"] + greedy.per_user["video_watch_s"]
    )
    comparison = compare_allocation(never, greedy)
    live = comparison["live_watch_s"]
    assert live["reference"] == 0.0 and live["difference"] == pytest.approx(live["policy"])
    assert live["difference_stderr"] > 0.0
    summary = greedy.summary()
    assert set(summary) >= {"live_watch_s", "total_usage_s", "return_rate", "allocation_rate", "decisions"}


def test_pooled_outcomes_put_the_worlds_users_side_by_side_and_weigh_each_rate_by_what_it_counts():
    greedy = ThresholdAllocationPolicy(13.0)
    small = allocation_outcome(SimConfig(n_users=40), greedy, seed=3, days=2)
    large = allocation_outcome(SimConfig(n_users=120), greedy, seed=4, days=2)
    pooled = AllocationOutcome.pooled([small, large])
    np.testing.assert_array_equal(
        pooled.per_user["live_watch_s"], np.r_[small.per_user["live_watch_s"], large.per_user["live_watch_s"]]
    )
    assert pooled.decisions == small.decisions + large.decisions
    inserted = small.allocation_rate * small.decisions + large.allocation_rate * large.decisions
    assert pooled.allocation_rate == pytest.approx(inserted / pooled.decisions)
    assert pooled.return_rate == pytest.approx((40 * small.return_rate + 120 * large.return_rate) / 160)


def _outcome(live, video, *, return_rate=0.5, allocation_rate=0.25, decisions=8) -> AllocationOutcome:
    live, video = np.asarray(live, float), np.asarray(video, float)
    per_user = {"live_watch_s": live, "video_watch_s": video, "total_usage_s": live + video}
    return AllocationOutcome(per_user, return_rate, allocation_rate, decisions)


def test_a_comparison_is_the_outcome_less_the_reference_user_by_user():
    reference = _outcome([10.0, 20.0, 30.0, 40.0], [100.0, 100.0, 100.0, 100.0])
    outcome = _outcome([11.0, 22.0, 33.0, 44.0], [99.0, 100.0, 101.0, 100.0])
    live = compare_allocation(reference, outcome)["live_watch_s"]
    assert live["reference"] == 25.0 and live["policy"] == 27.5
    assert live["difference"] == 2.5 and live["lift"] == pytest.approx(0.1)
    assert live["difference_stderr"] == pytest.approx(np.std([1.0, 2.0, 3.0, 4.0], ddof=1) / 2)
    assert compare_allocation(reference, outcome)["video_watch_s"]["difference"] == 0.0


def test_a_summary_gives_the_means_and_the_rates_and_pooling_nothing_decided_has_no_rate():
    outcome = _outcome([1.0, 3.0], [10.0, 20.0])
    assert outcome.summary() == {
        "live_watch_s": 2.0,
        "video_watch_s": 15.0,
        "total_usage_s": 17.0,
        "return_rate": 0.5,
        "allocation_rate": 0.25,
        "decisions": 8,
    }
    one_day = _outcome([1.0], [1.0], return_rate=float("nan"))
    assert one_day.summary()["return_rate"] is None  # no next day to return on: null in JSON
    idle = _outcome([0.0], [5.0], allocation_rate=float("nan"), decisions=0)
    pooled = AllocationOutcome.pooled([idle, idle])
    assert np.isnan(pooled.allocation_rate) and pooled.decisions == 0


def test_an_allocation_outcome_sums_each_users_expected_watch_over_the_days_of_its_episodes():
    config, policy = SimConfig(n_users=40), ThresholdAllocationPolicy(13.0)
    outcome = allocation_outcome(config, policy, seed=3, episode_seed=2, days=2)
    logs = run_days(config, behaviour_feed_policy(), policy, seed=3, episode_seed=2, days=2)
    live = sum(np.bincount(d.live.user, weights=d.live.expected_reward[:, 0], minlength=40) for d in logs)
    video = sum(np.bincount(d.feed.user, weights=d.feed.expected_reward[:, 0], minlength=40) for d in logs)
    np.testing.assert_allclose(outcome.per_user["live_watch_s"], live)
    np.testing.assert_allclose(outcome.per_user["video_watch_s"], video)
    assert outcome.return_rate == pytest.approx(logs[1].returning_users / 40)
    defaults = allocation_outcome(config, policy, seed=3)  # episode seed 1 (the logs used 0), two days
    explicit = allocation_outcome(config, policy, seed=3, episode_seed=1, days=2)
    np.testing.assert_array_equal(defaults.per_user["total_usage_s"], explicit.per_user["total_usage_s"])
    assert not np.array_equal(defaults.per_user["total_usage_s"], outcome.per_user["total_usage_s"])
    assert np.isnan(allocation_outcome(config, policy, seed=3, days=1).return_rate)
    no_live = allocation_outcome(dataclasses.replace(config, live_availability=0.0), policy, seed=3)
    assert no_live.decisions == 0 and np.isnan(no_live.allocation_rate)
