"""docs/policy_quality.md is the committed result rendered (bench/policy_quality.py ``markdown``), so the
page cannot drift from bench/results/policy_quality.json, and its shortlist table says what each oracle
chose from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
RESULT = json.loads((ROOT / "bench/results/policy_quality.json").read_text())


@pytest.fixture(scope="module")
def policy_quality():
    return load_bench_script("policy_quality")


def test_the_page_is_the_committed_result_rendered(policy_quality):
    page = (ROOT / "docs/policy_quality.md").read_text()
    assert page == policy_quality.markdown(RESULT)


def test_the_shortlist_table_has_a_row_per_assignment_with_its_weakest_constraint(policy_quality):
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
    lines = policy_quality.shortlist_table({"hidden_oracle": [entry, {**entry, "holds_as_run": True}]})
    rows = [line for line in lines if line.startswith("| hidden_oracle")]
    # hate is the weakest: +0.4% in the wrong direction is further than likes' -0.2%
    assert rows == [
        "| hidden_oracle | global | +1.50% | +1.10% | hate +0.40% | no |",
        "| hidden_oracle | 1 | +1.50% | +1.10% | hate +0.40% | yes |",
    ]
