"""docs/policy_quality.md's shortlist table says what each oracle chose from (the page is the committed
result rendered: test_bench_pages)."""

from __future__ import annotations

from bench_scripts import load_bench_script


def test_the_shortlist_table_has_a_row_per_assignment_with_its_weakest_constraint():
    entry = {
        "by_sums": {
            "watch_time": 0.015,
            "click": 0.001,
            "like": 0.0,
            "follow": 0.002,
            "comment": 0.001,
            "share": 0.003,
            "hate": 0.0,
        },
        "as_run": {
            "watch_time": 0.011,
            "click": 0.001,
            "like": -0.002,
            "follow": 0.001,
            "comment": 0.0,
            "share": 0.002,
            "hate": 0.004,
        },
        "holds_as_run": False,
    }
    lines = load_bench_script("policy_quality").shortlist_table(
        {"hidden_oracle": [entry, {**entry, "holds_as_run": True}]}
    )
    rows = [line for line in lines if line.startswith("| hidden_oracle")]
    # hate is the weakest: +0.4% in the wrong direction is further than likes' -0.2%
    assert rows == [
        "| hidden_oracle | global | +1.50% | +1.10% | hate +0.40% | no |",
        "| hidden_oracle | 1 | +1.50% | +1.10% | hate +0.40% | yes |",
    ]
