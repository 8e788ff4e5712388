"""The user-author benchmark's own accounting: the pairs' returns it reports beside the follows, and the
critics' scoring on fewer training pairs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from bench_scripts import load_bench_script

from recsys_rl import signals
from recsys_rl.sim.ground_truth import Estimate, PolicyValues
from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS


def _day(day: int, views: list[tuple[int, int, bool]]) -> SimpleNamespace:
    """A day log holding only its views, each (user, item, is_live), as ``pair_meetings`` reads them."""
    user, item, is_live = (np.array(column) for column in zip(*views, strict=True))
    return SimpleNamespace(
        day=day,
        views=SimpleNamespace(
            user=user,
            item=item,
            is_live=is_live.astype(bool),
            time_ms=np.zeros(user.size, np.int64),
            signals=np.zeros((user.size, len(VIEW_SIGNAL_COLUMNS))),
        ),
    )


def test_a_pair_that_meets_on_k_days_returns_k_minus_one_times():
    """Videos 0 and 1 are author 7's, video 2 author 8's; live stream 0 is author 7's too. User 0 meets
    author 7 twice on day 0 and once (live) on day 2: one return; author 8 once: none. User 1 meets
    author 7 on each of three days: two. User 2 never comes."""
    world = SimpleNamespace(
        videos=SimpleNamespace(author=np.array([7, 7, 8])), lives=SimpleNamespace(author=np.array([7]))
    )
    logs = [
        _day(0, [(0, 0, False), (0, 1, False), (0, 2, False), (1, 0, False)]),
        _day(1, [(1, 1, False)]),
        _day(2, [(0, 0, True), (1, 0, False)]),
    ]
    returns = load_bench_script("user_author").pair_returns(logs, world, users=3)
    assert returns.tolist() == [1.0, 2.0, 0.0]


def _pairs_with_returns(n_pairs: int, rows_per_pair: int):
    """Rows of ``n_pairs`` pairs; each row's state is its pair's code, so a fake critic can tell them
    apart; every return is its row's pair code (a value that knows the pair is exact)."""
    bench = load_bench_script("user_author")
    pairs = np.repeat(np.arange(n_pairs), rows_per_pair)
    states = pairs[:, None].astype(np.float32)
    returns = np.repeat(pairs[:, None].astype(float), 4, axis=1)
    data = bench.PairTransitions(
        states,
        states,
        returns,
        pairs,
        np.tile(np.arange(rows_per_pair), n_pairs),
        np.ones(pairs.size),
        pairs < 0,
    )
    replayed = bench.ReplayedReturns(returns, returns, np.zeros_like(returns))
    return bench, data, replayed


def test_the_critics_train_on_a_share_of_the_other_pairs_and_are_scored_on_the_same_held_out_rows(
    monkeypatch,
):
    bench, data, replayed = _pairs_with_returns(n_pairs=2_000, rows_per_pair=3)
    trained_on: list[np.ndarray] = []

    def fake_training(train, config, *, critic, steps, batch_size, seed):
        trained_on.append(train.pairs)
        values = lambda states: SimpleNamespace(numpy=lambda: np.repeat(states, 4, axis=1))  # noqa: E731
        return SimpleNamespace(values=values)

    monkeypatch.setattr(bench, "train_pair_value", fake_training)
    full = bench.critic_errors(data, replayed, steps=1, seed=3)
    tenth = bench.critic_errors(data, replayed, steps=1, seed=3, train_share=0.1)
    assert full["held_out_rows"] == tenth["held_out_rows"]
    # the full run trains MTCL, independent heads and the regression on the truth, then the tenth's MTCL
    full_pairs, tenth_pairs = set(trained_on[0]), set(trained_on[3])
    assert tenth_pairs < full_pairs  # only pairs the full critics train on too: none held out
    assert len(tenth_pairs) == pytest.approx(0.1 * len(full_pairs), rel=0.25)
    assert tenth["training_rows"] == 3 * len(tenth_pairs)  # a pair is kept with all its rows
    # the reference mean is the kept rows': their pair codes' mean
    assert tenth["training_mean"]["follow"] == pytest.approx(
        float(np.sqrt(((np.mean(sorted(tenth_pairs)) - data.pairs[_held(full_pairs, data)]) ** 2).mean()))
    )
    assert tenth["mtcl"]["follow"] == 0.0  # the fake critic is exact on every held-out row


def test_a_rows_days_to_the_cut_off_are_its_pairs_gaps_from_it_on():
    """Pair 5 meets at days 0, 1 and 3.5 and the log is cut at 4 (its last gap, 0.5, runs to the
    cut-off); pair 2 meets once, 6 days before it. The rows come in no particular order."""
    bench = load_bench_script("user_author")
    pairs, steps = np.array([5, 2, 5, 5]), np.array([2, 0, 0, 1])
    empty = np.zeros((4, 0))
    data = bench.PairTransitions(
        empty, empty, np.zeros((4, 4)), pairs, steps, np.array([0.5, 6.0, 1.0, 2.5]), steps == 2
    )
    assert bench.days_to_cut_off(data).tolist() == [0.5, 6.0, 4.0, 3.0]


def test_the_regression_fits_the_expected_returns_and_each_value_is_calibrated_by_days_to_the_cut_off(
    monkeypatch,
):
    """Every pair meets three times a day apart, the last a day before the cut-off, so its rows are 3, 2
    and 1 days from it. The truth grows along the chain (the pair code times 1, 2, 3) where the fake
    critics value every row at its pair code: calibrated 3 days out, 1/2 and 1/3 nearer the cut-off."""
    bench, data, replayed = _pairs_with_returns(n_pairs=2_000, rows_per_pair=3)
    expected = replayed.expected * (1 + data.steps[:, None])
    replayed = bench.ReplayedReturns(replayed.drawn, expected, replayed.luck)
    fitted = []

    def fake_training(train, config, *, critic, steps, batch_size, seed):
        if config.discounts == (0.0,) * len(signals.PAIR_SIGNALS):
            fitted.append(train)
        values = lambda states: SimpleNamespace(numpy=lambda: np.repeat(states, 4, axis=1))  # noqa: E731
        return SimpleNamespace(values=values)

    monkeypatch.setattr(bench, "train_pair_value", fake_training)
    errors = bench.critic_errors(data, replayed, steps=1, seed=3)
    (regression,) = fitted  # trained once, TD's discounts off, on the training rows' expected returns
    trained = np.isin(data.pairs, regression.pairs)
    assert np.array_equal(regression.rewards, expected[trained].astype(np.float32))
    by_days = {tuple(b["days"]): b for b in errors["calibration_by_days_to_cut_off"]}
    assert list(by_days) == [(1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]
    assert [b["rows"] for b in by_days.values()] == [errors["held_out_rows"] // 3] * 3
    for name in ("mtcl", "independent", "regression"):
        ratios = [b[name]["follow"] for b in by_days.values()]
        assert ratios == pytest.approx([1 / 3, 1 / 2, 1.0])
    # over seeds: a bin one seed lacks is averaged over the others
    other = {**errors, "calibration_by_days_to_cut_off": errors["calibration_by_days_to_cut_off"][:1]}
    other["calibration_by_days_to_cut_off"] = [
        {**b, "rows": b["rows"] + 2, "regression": {s: 1.0 for s in signals.PAIR_SIGNALS}}
        for b in other["calibration_by_days_to_cut_off"]
    ]
    summary = bench.calibration_by_days([errors, other])
    assert [b["days"] for b in summary] == [[1.0, 2.0], [2.0, 3.0], [3.0, 4.0]]
    assert summary[0]["regression"]["click"] == pytest.approx((1 / 3 + 1) / 2)
    assert summary[0]["rows"] == errors["held_out_rows"] // 3 + 1
    assert summary[1]["regression"]["click"] == pytest.approx(1 / 2)  # the first seed's alone
    summary = bench.calibration_by_days([errors, errors])
    lines = bench.calibration_by_days_table(summary)
    assert lines[2].startswith(f"| 1-2 | {errors['held_out_rows'] // 3} | 0.33 | 0.33 |")


def _held(trained_pairs: set, data) -> np.ndarray:
    return ~np.isin(data.pairs, list(trained_pairs))


def test_the_fewer_pairs_table_gives_each_critics_error_over_the_means():
    row = {
        "mtcl": 0.9,
        "independent": 1.2,
        "training_mean": 1.0,
        "reduction": {"mean": 0.25, "stderr": 0.05},
    }
    lines = load_bench_script("user_author").fewer_pairs_table(
        [{"share": 0.1, "training_rows": 4500.4, "per_head": {"follow": row}}]
    )
    assert lines[2:] == ["| 0.1 | 4500 | follow | 0.900 | 1.200 | +25.0% ± 5.0 |"]


def _values(per_user: np.ndarray) -> PolicyValues:
    """Values with only the per-user totals the paired comparison reads."""
    feed = {name: Estimate(1.0, 0.1, 500) for name in signals.FEED_SIGNALS}
    live = {name: Estimate(1.0, 0.1, 500) for name in signals.LIVE_SIGNALS}
    return PolicyValues(feed, live, dict.fromkeys(signals.FEED_SIGNALS, 0.1), 500, 0.7, per_user=per_user)


def test_each_grid_weight_is_judged_against_tscac_alone_in_increasing_weight():
    script = load_bench_script("user_author")
    users = np.random.default_rng(1).normal(5.0, 1.0, (300, len(signals.FEED_SIGNALS)))
    follows = np.zeros(len(signals.FEED_SIGNALS))
    follows[signals.FEED_SIGNALS.index("follow")] = 0.2
    hate = np.zeros(len(signals.FEED_SIGNALS))
    hate[signals.FEED_SIGNALS.index("hate")] = 0.3
    # 0.3 brings the most follows but raises hate, so 0.1, next to it, has no margin: 0.01 is chosen
    by_weight = {
        0.3: _values(users + 3 * follows + hate),
        0.01: _values(users + follows),
        0.1: _values(users + 2 * follows),
    }
    chosen = script.choose_weight(_values(users), by_weight)
    assert [t["weight"] for t in chosen["tried"]] == [0.01, 0.1, 0.3]
    assert [t["broken"] for t in chosen["tried"]] == [[], [], ["hate"]]
    assert chosen["tried"][1]["follow_lift"] == pytest.approx(0.4 / 5.0, rel=0.2)
    assert chosen["weight"] == 0.01  # 0.1 holds but its next larger weight breaks


def _tried(*points: tuple[float, float, bool]) -> list[dict[str, object]]:
    """Grid points (weight, follow lift, held) as ``choose_weight`` records them, in increasing weight."""
    return [
        {"weight": w, "follow_lift": lift, "holds": held, "broken": [] if held else ["hate"]}
        for w, lift, held in points
    ]


def test_a_weight_is_chosen_one_grid_step_back_from_where_the_term_breaks():
    """The every-head term at 46cc963: 0.03 held with the most follows next to 0.1, which broke; 0.01 is
    the weight with a margin."""
    choose = load_bench_script("user_author").weight_with_margin
    chosen = choose(
        _tried((0.01, 0.0006, True), (0.03, 0.0013, True), (0.1, -0.001, False), (0.3, -0.04, False))
    )
    assert (chosen["weight"], chosen["held_with_margin"], chosen["held_on_tuning_world"]) == (
        0.01,
        True,
        True,
    )
    # the grid's largest weight has no next one: it counts when it holds
    assert choose(_tried((1.0, 0.001, True), (3.0, 0.003, True)))["weight"] == 3.0


def test_a_term_without_a_weight_holding_with_margin_keeps_the_smallest():
    choose = load_bench_script("user_author").weight_with_margin
    edge = choose(_tried((1.0, 0.0012, True), (3.0, 0.0028, False), (10.0, 0.0016, False)))
    assert (edge["weight"], edge["held_with_margin"], edge["held_on_tuning_world"]) == (1.0, False, True)
    nowhere = choose(_tried((0.01, 0.004, False), (0.03, 0.01, False)))
    assert (nowhere["weight"], nowhere["held_with_margin"], nowhere["held_on_tuning_world"]) == (
        0.01,
        False,
        False,
    )


def test_the_headline_term_is_the_one_whose_weight_held_with_margin():
    bench = load_bench_script("user_author")
    weights = {
        "user-author": bench.weight_with_margin(_tried((0.01, 0.0005, True), (0.03, 0.0013, False))),
        "user-author-follow": bench.weight_with_margin(_tried((1.0, 0.0002, True), (3.0, 0.0004, True))),
    }
    assert bench.headline_term(weights) == "user-author-follow"
