"""The pure parts of bench/policy_quality.py: the page's tables (the page is the committed result rendered:
test_bench_pages) and how TSCAC's lambda is chosen."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from bench_scripts import load_bench_script
from feed_vectors import feed_signals

from recsys_rl.sim.behaviour import behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.reference_lines import SegmentedFeedPolicy


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


def _sweep_point(
    watch: float, deployable: float = 0.0, broken: float = 0.0, std: float = 0.0, **auxiliary: float
) -> dict:
    """A sweep point's ``row`` over four seeds: every auxiliary signal's mean lift 0 and the same on every
    seed (held, just) unless given; those given spread by ``std`` over the seeds."""
    lifts = {"watch_time": watch, "click": 0.0, "like": 0.0, "follow": 0.0, "comment": 0.0, "share": 0.0}
    lifts |= {"hate": 0.0, **auxiliary}
    return {
        "lift": {
            s: {"mean": lift, "std": 0.002 if s == "watch_time" else std if s in auxiliary else 0.0}
            for s, lift in lifts.items()
        },
        "deployable_lift": {"mean": deployable, "std": 0.001},
        "constraints_broken_share": broken,
        "runs": 4,
    }


def test_tscacs_lambda_is_the_holding_sweep_point_with_the_most_watch_time():
    choose = load_bench_script("policy_quality").choose_lambda
    sweep = {
        0.03: _sweep_point(0.012, follow=-0.001),  # the most watch time, but follows below the behaviour's
        0.1: _sweep_point(0.008, like=0.002),
        0.3: _sweep_point(0.006, hate=-0.004),
        1.0: _sweep_point(0.009, hate=0.0001),  # more hates: lower is better, so this one misses its bound
    }
    assert choose(sweep) == 0.1


def test_a_sweep_point_holds_only_where_its_seeds_clear_every_constraint_by_two_standard_errors():
    """Four seeds with likes +0.2% on average: clear at a std of 0.19% over the seeds (standard error
    0.095%), not at 0.21%; the mean alone would hold both."""
    choose = load_bench_script("policy_quality").choose_lambda
    steady = _sweep_point(0.005, std=0.0019, like=0.002)
    scattered = _sweep_point(0.008, std=0.0021, like=0.002)
    assert choose({0.1: steady, 0.3: scattered}) == 0.1
    # hate to lower: its mean must be below zero by the two standard errors
    assert choose({0.1: steady, 0.3: _sweep_point(0.008, std=0.0019, hate=-0.002)}) == 0.3
    assert choose({0.1: steady, 0.3: _sweep_point(0.008, std=0.0021, hate=-0.002)}) == 0.1


def test_a_sweep_holding_nowhere_or_tied_keeps_the_most_cautious_lambda():
    choose = load_bench_script("policy_quality").choose_lambda
    assert choose({0.03: _sweep_point(0.01, comment=-0.001), 0.1: _sweep_point(0.005, share=-0.002)}) == 0.1
    assert choose({0.03: _sweep_point(0.005), 0.1: _sweep_point(0.005), 0.3: _sweep_point(0.001)}) == 0.1


def test_the_controls_train_at_the_chosen_lambda_keeping_their_own_agent_fields():
    at_lambda = load_bench_script("policy_quality").at_lambda
    myopic = {"algo": "tscac", "agent": {"discount": 0.0}}
    assert at_lambda(myopic, 0.3) == {"algo": "tscac", "agent": {"discount": 0.0, "aux_lambda": 0.3}}
    assert myopic == {"algo": "tscac", "agent": {"discount": 0.0}}  # the module's table stays as it was
    assert at_lambda({"algo": "tscac", "rewards": "predicted"}, 0.03)["agent"] == {"aux_lambda": 0.03}


def test_the_lambda_table_marks_the_chosen_point_and_why_the_others_lost():
    selection = {
        "world": 1000,
        "chosen": 0.3,
        "sweep": [
            {"aux_lambda": 0.1, "row": _sweep_point(0.01, broken=0.25, follow=-0.003, comment=-0.001)},
            {"aux_lambda": 0.3, "row": _sweep_point(0.006, deployable=0.006, like=0.001, hate=-0.002)},
        ],
    }
    lines = load_bench_script("policy_quality").lambda_table(selection)
    assert "world 1000" in lines[0] and "**0.3**" in lines[0]
    assert lines[-2:] == [
        "| 0.1 | +1.00% ± 0.20 | follow -0.30% | no | 25% | +0.00% ± 0.10 |  |",
        "| 0.3 | +0.60% ± 0.20 | click +0.00% | yes | 0% | +0.60% ± 0.10 | yes |",
    ]


class _InProcess:
    """The worker pool's interface, run here, counting the jobs it ran."""

    def __init__(self) -> None:
        self.jobs = 0

    def run(self, jobs):
        self.jobs += len(jobs)
        return {key: job() for key, job in jobs.items()}


def test_reports_are_per_policy_then_per_world_against_the_behaviour_on_that_world():
    policy_quality = load_bench_script("policy_quality")
    behaviour, greedy = (
        behaviour_feed_policy(),
        SegmentedFeedPolicy.global_weighting(
            behaviour_feed_policy().base_logits + 1.0, behaviour_feed_policy().state_coef
        ),
    )
    worlds = [5, 6]
    asked = []

    mixture = policy_quality.Mixture(np.array([0.25, 0.75]), (greedy, behaviour))

    # the same weighting built again, as the oracle that keeps the global weighting everywhere is
    again = SegmentedFeedPolicy.global_weighting(greedy.logits[0].copy(), greedy.state_coef.copy())
    tilted = SegmentedFeedPolicy(greedy.logits, greedy.state_coef.copy())  # reads the state otherwise
    tilted.state_coef[:, 0] += 1.0  # the watch time's weight: a shift of every weight would rank alike

    def policies_on(world):
        asked.append(world)
        return {
            "same": [behaviour],
            "pair": [greedy, behaviour],
            "mixture": [mixture],
            "again": [again],
            "tilted": [tilted],
        }

    pool = _InProcess()
    reports = policy_quality.reports_against_behaviour(pool, policies_on, worlds, SimConfig(n_users=40), 1)
    assert asked == worlds
    assert [len(runs) for runs in reports.values()] == [1, 2, 1, 1, 1]
    # a policy that acts alike runs once a world: the benchmark's behaviour, ``behaviour``, the moved
    # weighting (whether in the pair, the mixture or built again) and the tilted one
    assert pool.jobs == 4 * len(worlds)

    def watch_lifts(label):
        return [report["signals"]["watch_time"]["lift"] for report in reports[label][0]]

    assert watch_lifts("again") == watch_lifts("pair")
    assert not set(watch_lifts("tilted")) & set(watch_lifts("pair"))
    assert all(len(runs) == len(worlds) for by_policy in reports.values() for runs in by_policy)
    # the behaviour against itself on each world: no lift; the moved weighting differs on both worlds
    for report in [*reports["same"][0], *reports["pair"][1]]:
        assert {s["lift"] for s in report["signals"].values()} <= {0.0, None}
    lifts = [report["signals"]["watch_time"]["lift"] for report in reports["pair"][0]]
    assert 0.0 not in lifts and lifts[0] != lifts[1]
    # a mixture is its policies' values weighted: a quarter of the moved weighting's lift, on each world
    mixed = [report["signals"]["watch_time"]["lift"] for report in reports["mixture"][0]]
    assert mixed == pytest.approx([0.25 * lift for lift in lifts])
    # a reference line's row has one run per world
    assert policy_quality.per_world_runs(reports["same"]) == [[r] for r in reports["same"][0]]


def test_the_global_mixture_is_the_global_weighting_when_no_mixture_holds():
    script = load_bench_script("policy_quality")

    def totals(watch: float, interactions: float) -> SimpleNamespace:
        return SimpleNamespace(total=feed_signals(watch, interactions))

    references = SimpleNamespace(
        values=[totals(10.0, 1.0), totals(14.0, 0.8), totals(8.0, 1.2)],
        behaviour=totals(10.0, 1.0),
        global_index=2,
    )
    assert script.global_mixture(references) == pytest.approx([0.0, 0.5, 0.5], abs=1e-9)
    references.behaviour = totals(10.0, 2.0)  # nothing reaches these interactions
    assert script.global_mixture(references).tolist() == [0.0, 0.0, 1.0]
