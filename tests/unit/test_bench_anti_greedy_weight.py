"""How the allocation benchmark chooses SL-MGAC's anti-greedy weight (bench/allocation_quality.py
``choose_anti_greedy_weight``, ``anti_greedy_section``) and keeps one record of the sweep's runs and the
ones trained after it (bench/trained.py ``TrainedRuns.merged``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def allocation_quality():
    return load_bench_script("allocation_quality")


def _gap(difference: float | None, stderr: float = 0.7, outside_seeds: int = 0) -> dict[str, float | None]:
    if difference is None:
        return {"difference": None, "stderr": None, "z": None, "outside_seeds": outside_seeds}
    return {"difference": difference, "stderr": stderr, "z": difference / stderr, "outside_seeds": 0}


def test_the_weight_most_above_greedys_frontier_on_the_logs_world_is_chosen(allocation_quality):
    choose = allocation_quality.choose_anti_greedy_weight
    assert choose({1.0: _gap(-3.0), 2.0: _gap(-1.2), 4.0: _gap(-1.9)}) == 2.0
    assert choose({1.0: _gap(0.4), 2.0: _gap(-0.1)}) == 1.0


def test_a_weight_with_seeds_outside_the_thresholds_range_is_not_compared(allocation_quality):
    """A seed whose live watch no threshold rule reaches has no frontier point: its weight's mean gap would
    be over fewer seeds, so it cannot win however large it looks."""
    choose = allocation_quality.choose_anti_greedy_weight
    assert choose({1.0: _gap(-3.0), 4.0: _gap(None, outside_seeds=2)}) == 1.0
    assert choose({2.0: _gap(None, outside_seeds=1), 4.0: _gap(None, outside_seeds=3)}) == 2.0


def test_the_weights_table_marks_the_chosen_weight(allocation_quality):
    spread = {"mean": 30.0, "std": 1.0, "min": 29.0, "max": 31.0}
    selection = {
        "world": 0,
        "chosen": 2.0,
        "sweep": [
            {"anti_greedy_weight": w, "live_watch_s": spread, "total_usage_s": spread, "above_frontier": g}
            for w, g in ((1.0, _gap(-3.0)), (2.0, _gap(-1.2)), (4.0, _gap(None, outside_seeds=1)))
        ],
    }
    lines = allocation_quality.anti_greedy_section(selection, users=20_000)
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 2", "| 4"]
    assert [row.rstrip(" |").endswith("yes") for row in rows] == [False, True, False]
    assert "-1.2 ± 0.7 s against the frontier" in rows[1]
    assert "outside the thresholds' range on 1 seed(s)" in rows[2]


def test_merged_runs_keep_both_batches_and_name_the_chosen_sweep_point_as_the_algorithm():
    trained = load_bench_script("trained")
    sweep = trained.TrainedRuns(
        {"sl-mgac-beta-1": [Path("a")], "sl-mgac-beta-2": [Path("b")]},
        {"sl-mgac-beta-1": [1.0], "sl-mgac-beta-2": [2.0]},
        {"sl-mgac-beta-1": [{"loss": 1.0}], "sl-mgac-beta-2": [{"loss": 2.0}]},
    )
    later = trained.TrainedRuns(
        {"ac-single-group": [Path("c")]}, {"ac-single-group": [3.0]}, {"ac-single-group": [{}]}
    )
    merged = sweep.merged(later, {"sl-mgac-beta-2": "sl-mgac"})
    assert merged.policy_dirs == {
        "sl-mgac-beta-1": [Path("a")],
        "sl-mgac": [Path("b")],
        "ac-single-group": [Path("c")],
    }
    assert merged.train_seconds["sl-mgac"] == [2.0]
    assert merged.final_metrics["sl-mgac"] == [{"loss": 2.0}]
    assert "sl-mgac" not in sweep.policy_dirs  # the sweep's own record stays as it was
