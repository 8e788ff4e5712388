"""bench/lookahead_ceiling.py: each objective picks its own weighting, under the constraints and without
them, and the value of looking ahead is the far-sighted pick's paired multi-day watch over the myopic's."""

from __future__ import annotations

import numpy as np
import pytest
from bench_scripts import load_bench_script
from feed_vectors import K, feed_signals

from recsys_rl import signals
from recsys_rl.sim.ground_truth import PolicyValues


def _candidate(multi_day: np.ndarray, per_request: np.ndarray) -> dict[str, np.ndarray]:
    return {"multi_day": multi_day, "per_request": per_request}


def _values(per_user_watch: list[float], per_request: float = 1.0) -> PolicyValues:
    per_user = np.zeros((len(per_user_watch), K))
    per_user[:, 0] = per_user_watch
    return PolicyValues(
        feed={},
        live={},
        per_request=dict.fromkeys(signals.FEED_SIGNALS, per_request),
        episodes=len(per_user_watch),
        return_rate=1.0,
        per_user=per_user,
    )


def test_each_objective_picks_the_most_watch_it_sees_among_the_weightings_that_hold():
    script = load_bench_script("lookahead_ceiling")
    behaviour = _candidate(feed_signals(10.0), feed_signals(1.0))
    values = [
        _candidate(feed_signals(10.0), feed_signals(1.0)),  # the behaviour's own weighting
        _candidate(
            feed_signals(12.0), feed_signals(1.05)
        ),  # far-sighted: more sessions, pages a little better
        _candidate(feed_signals(11.0), feed_signals(1.2)),  # myopic: the best pages, fewer of them
        _candidate(feed_signals(13.0, hate=1.2), feed_signals(1.3, hate=1.2)),  # the most watch, more hate
        _candidate(feed_signals(20.0, interactions=0.9), feed_signals(2.0, interactions=0.9)),
    ]
    assert script.picks(values, behaviour) == {
        "multi_day": 1,
        "multi_day-unconstrained": 4,
        "per_request": 2,
        "per_request-unconstrained": 4,
    }
    # a constraint judged per user over the days only: candidate 2 breaks it there, not per request
    values[2]["multi_day"] = feed_signals(11.0, interactions=0.99)
    assert script.picks(values, behaviour)["per_request"] == 2


def test_when_nothing_holds_the_pick_is_the_first_candidate():
    script = load_bench_script("lookahead_ceiling")
    behaviour = _candidate(feed_signals(10.0), feed_signals(1.0))
    values = [_candidate(feed_signals(11.0, hate=2.0), feed_signals(1.1, hate=2.0))] * 2
    assert script.picks(values, behaviour)["multi_day"] == 0


def test_the_value_of_looking_ahead_is_the_paired_difference_in_points_of_the_behaviours_watch():
    script = load_bench_script("lookahead_ceiling")
    behaviour = _values([10.0, 20.0, 30.0, 40.0])  # mean 25
    myopic = _values([11.0, 20.0, 30.0, 41.0])
    far_sighted = _values([12.0, 22.0, 30.0, 42.0])  # differences 1, 2, 0, 1: mean 1
    value = script.lookahead_value(behaviour, myopic, far_sighted)
    stderr = np.std([1.0, 2.0, 0.0, 1.0], ddof=1) / 2.0
    assert value["points"] == pytest.approx(1.0 / 25.0)
    assert value["low"] == pytest.approx((1.0 - 1.959964 * stderr) / 25.0)
    assert value["high"] == pytest.approx((1.0 + 1.959964 * stderr) / 25.0)
    assert script.lookahead_value(behaviour, myopic, myopic)["points"] == 0.0


def test_the_candidate_table_splits_the_multi_day_lift_into_watch_per_request_and_requests():
    script = load_bench_script("lookahead_ceiling")
    behaviour = _candidate(feed_signals(10.0), feed_signals(2.0))
    table = script.candidate_table([_candidate(feed_signals(13.2), feed_signals(2.2, hate=1.1))], behaviour)
    row = table[0]
    assert row["watch_lift"] == {"multi_day": pytest.approx(0.32), "per_request": pytest.approx(0.1)}
    assert row["requests_per_user_lift"] == pytest.approx(0.2)  # 1.32 = 1.1 x 1.2
    assert row["holds"] == {"multi_day": True, "per_request": False}  # hate above the behaviour's per request


def test_the_rank_correlation_orders_the_samples():
    script = load_bench_script("lookahead_ceiling")
    x = np.array([0.1, 0.5, 0.2, 0.9])
    assert script.rank_correlation(x, x**3) == pytest.approx(1.0)
    assert script.rank_correlation(x, -x) == pytest.approx(-1.0)
    assert script.rank_correlation(x, np.array([0.1, 0.2, 0.9, 0.5])) == pytest.approx(0.4)  # 1 - 6 x 6 / 60


def test_the_objective_totals_count_each_candidates_requests_per_user():
    script = load_bench_script("lookahead_ceiling")
    values = _values([20.0, 40.0], per_request=10.0)  # 30 seconds of watch per user, 10 per request
    by_objective = script.objective_totals([values])
    assert by_objective["multi_day"][0][0, 0] == 30.0 and by_objective["multi_day"][1].tolist() == [1.0]
    assert by_objective["per_request"][1].tolist() == [3.0]
