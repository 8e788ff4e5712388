"""The allocation baselines (greedy threshold, fixed rate) and the simulator's allocation evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_rl.sim.behaviour import (
    FixedRateAllocationPolicy,
    ThresholdAllocationPolicy,
)
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
