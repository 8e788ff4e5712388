"""The benchmark pages under docs/ are their committed results rendered (each script's ``markdown``), so a
page cannot drift from its bench/results/ file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_bench_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["policy_quality", "user_author", "allocation_quality"])
def test_the_page_is_the_committed_result_rendered(name):
    result = json.loads((ROOT / f"bench/results/{name}.json").read_text())
    page = (ROOT / f"docs/{name}.md").read_text()
    assert page == load_bench_script(name).markdown(result)


def test_the_calibration_table_gives_each_critics_mean_value_and_its_ratio_to_the_truth():
    per_head = {
        "click": {"mean_value": {"expected_return": 0.5, "mtcl": 0.75, "independent": 0.5}},
        "follow": {"mean_value": {"expected_return": 0.002, "mtcl": 0.001, "independent": 0.003}},
    }
    rows = load_bench_script("user_author").calibration_table(per_head)
    assert rows[2:] == [
        "| click | 0.5 | 0.75 (1.50x) | 0.5 (1.00x) |",
        "| follow | 0.002 | 0.001 (0.50x) | 0.003 (1.50x) |",
    ]
