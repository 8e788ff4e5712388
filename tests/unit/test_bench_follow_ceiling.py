"""bench/follow_ceiling.py: each term's ceiling is its most follows among the weights that broke nothing."""

from __future__ import annotations

from bench_scripts import load_bench_script


def _row(weight: float, follow: float, broken: list[str]) -> dict:
    return {"term": "t", "weight": weight, "lifts": {"follow": {"lift": follow}}, "broken": broken}


def test_the_ceiling_is_the_most_follows_that_broke_nothing():
    script = load_bench_script("follow_ceiling")
    rows = [_row(0.01, 0.002, []), _row(0.03, 0.009, []), _row(0.1, 0.004, []), _row(0.3, 0.05, ["hate"])]
    assert script.ceiling(rows)["weight"] == 0.03
    assert script.ceiling([_row(0.3, 0.05, ["watch_time"])]) is None


def test_the_oracle_terms_price_hate_as_named():
    script = load_bench_script("follow_ceiling")
    tried = script.terms((0.5, 1.0))
    assert list(tried) == ["follow-boost", "follow-oracle", "follow-oracle-net-0.5", "follow-oracle-net-1"]
    assert [getattr(t, "hate_price", None) for t in tried.values()] == [None, 0.0, 0.5, 1.0]
    assert all(name == term.name for name, term in tried.items())
