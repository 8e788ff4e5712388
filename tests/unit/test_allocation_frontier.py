"""Greedy allocation's frontier: mixtures of two rules, the upper hull, and the point at a live watch."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recsys_rl.sim.allocation_frontier import frontier_at, mixture, upper_hull
from recsys_rl.sim.sim_eval import AllocationOutcome


def outcome(
    live: list[float], usage: list[float], rate: float = 0.3, returned: float = 0.6, decisions: int = 100
) -> AllocationOutcome:
    live_a, usage_a = np.array(live, float), np.array(usage, float)
    return AllocationOutcome(
        per_user={"live_watch_s": live_a, "video_watch_s": usage_a - live_a, "total_usage_s": usage_a},
        return_rate=returned,
        allocation_rate=rate,
        decisions=decisions,
    )


def test_a_mixture_is_each_users_weighted_outcome_and_the_rates_weighted_alike():
    first = outcome([10.0, 30.0], [700.0, 710.0], rate=0.4, returned=0.7, decisions=100)
    second = outcome([20.0, 10.0], [720.0, 690.0], rate=0.2, returned=0.5, decisions=300)
    mixed = mixture(first, second, 0.25)
    np.testing.assert_allclose(mixed.per_user["live_watch_s"], [17.5, 15.0])
    np.testing.assert_allclose(mixed.per_user["total_usage_s"], [715.0, 695.0])
    np.testing.assert_allclose(mixed.per_user["video_watch_s"], [697.5, 680.0])
    assert mixed.allocation_rate == pytest.approx(0.25)
    assert mixed.return_rate == pytest.approx(0.55)
    assert mixed.decisions == 250


@pytest.mark.parametrize("weight", [-0.1, 1.1])
def test_a_weight_outside_zero_to_one_is_refused(weight):
    with pytest.raises(ValueError, match="weight should be in"):
        mixture(outcome([1.0], [1.0]), outcome([1.0], [1.0]), weight)


def test_the_hull_leaves_out_a_rule_its_neighbours_mixture_beats_and_keeps_one_above_their_chord():
    low, high = outcome([10.0], [720.0]), outcome([50.0], [700.0])
    # the chord gives 710 at live 30
    for under in (outcome([30.0], [705.0]), outcome([30.0], [709.99]), outcome([30.0], [710.0])):
        assert upper_hull([high, under, low]) == [low, high]
    above = outcome([30.0], [712.0])
    assert upper_hull([high, above, low]) == [low, above, high]


def test_of_rules_with_the_same_live_watch_the_frontier_keeps_the_one_with_more_usage():
    better, worse, high = outcome([10.0], [720.0]), outcome([10.0], [700.0]), outcome([50.0], [700.0])
    for order in ([better, worse, high], [worse, better, high], [high, worse, better]):
        hull = upper_hull(order)
        assert hull == [better, high]
        assert frontier_at(hull, 10.0).per_user["total_usage_s"].mean() == pytest.approx(720.0)


def test_a_single_rule_is_the_frontier_at_its_own_live_watch_only():
    only = outcome([20.0], [710.0])
    hull = upper_hull([only])
    assert frontier_at(hull, 20.0).per_user["total_usage_s"].mean() == pytest.approx(710.0)
    assert frontier_at(hull, 20.1) is None


def test_the_frontier_point_mixes_the_bracketing_rules_to_the_policys_live_watch():
    low, middle, high = (
        outcome([10.0, 10.0], [720.0, 720.0]),
        outcome([30.0, 30.0], [716.0, 716.0]),
        outcome([50.0, 50.0], [700.0, 700.0]),
    )
    hull = upper_hull([low, middle, high])
    point = frontier_at(hull, 40.0)
    assert point is not None
    assert point.per_user["live_watch_s"].mean() == pytest.approx(40.0)
    # halfway between middle (716) and high (700), not between low and high (705)
    assert point.per_user["total_usage_s"].mean() == pytest.approx(708.0)
    assert frontier_at(hull, 50.0).per_user["total_usage_s"].mean() == pytest.approx(700.0)
    assert frontier_at(hull, 10.0).per_user["total_usage_s"].mean() == pytest.approx(720.0)


@pytest.mark.parametrize("live", [9.9, 50.1])
def test_outside_the_thresholds_range_there_is_no_frontier_point(live):
    hull = upper_hull([outcome([10.0], [720.0]), outcome([50.0], [700.0])])
    assert frontier_at(hull, live) is None


@given(
    lives=st.lists(st.floats(0.0, 100.0), min_size=2, max_size=6, unique=True),
    usages=st.lists(st.floats(600.0, 800.0), min_size=6, max_size=6),
    share=st.floats(0.0, 1.0),
)
def test_a_frontier_point_has_the_live_watch_asked_for_and_none_lies_below_a_rule(lives, usages, share):
    rules = [outcome([live], [usage]) for live, usage in zip(lives, usages, strict=False)]
    hull = upper_hull(rules)
    # clamped: min + 1.0 * (max - min) can round to an ulp past max, outside the hull's range
    target = min(max(lives), min(lives) + share * (max(lives) - min(lives)))
    point = frontier_at(hull, target)
    assert point is not None
    assert point.per_user["live_watch_s"].mean() == pytest.approx(target, abs=1e-9)
    # the hull is the upper envelope: at each rule's live watch, the frontier earns at least that rule
    for rule in rules:
        at_rule = frontier_at(hull, float(rule.per_user["live_watch_s"].mean()))
        assert at_rule.per_user["total_usage_s"].mean() >= rule.per_user["total_usage_s"].mean() - 1e-6
