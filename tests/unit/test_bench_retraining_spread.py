"""The allocation benchmark's spread between retrainings: how much another training seed moves a policy's
insert probabilities on shared states, and whether an ablation moves them more than SL-MGAC does
(bench/allocation_quality.py ``retraining_spread``, ``prediction_variance_test``, ``retraining_section``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bench_scripts import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("allocation_quality")


def test_the_spread_is_the_mean_variance_over_seeds_and_the_share_of_decisions_two_seeds_differ_on(bench):
    # three seeds x three states; state 2 is decided alike by every seed, 0.5 serves an insertion
    p = np.array([[0.2, 0.5, 0.9], [0.4, 0.4, 0.9], [0.3, 0.5, 0.9]])
    spread = bench.retraining_spread(p, groups=np.array([0, 0, 3]))
    # variances over seeds: 0.01, 1/300, 0
    assert spread["prediction_variance"] == pytest.approx((0.01 + 1 / 300) / 3)
    # served: seed 0 (no, yes, yes), seed 1 (no, no, yes), seed 2 (no, yes, yes): pairs differ on 1/3, 0, 1/3
    assert spread["decision_disagreement"] == pytest.approx(2 / 9)
    assert spread["prediction_variance_by_group"] == {
        "high_active": pytest.approx((0.01 + 1 / 300) / 2),
        "full_active": None,
        "middle_active": None,
        "low_active_or_unknown": 0.0,
    }


def test_the_variance_test_on_one_state_is_the_hand_computed_jackknife(bench):
    ours = np.array([[0.0], [1.0], [2.0]])  # variance 1; without each seed in turn 0.5, 2, 0.5
    theirs = np.array([[0.0], [1.0], [3.0]])  # variance 7/3; without each seed in turn 2, 4.5, 0.5
    test = bench.prediction_variance_test(ours, theirs)
    replicates = [math.log(4.0), math.log(2.25), 0.0]
    centre = sum(replicates) / 3
    stderr = math.sqrt(2 / 3 * sum((r - centre) ** 2 for r in replicates))
    assert test["variance_ratio"] == pytest.approx(7 / 3)
    assert test["log_stderr"] == pytest.approx(stderr)
    assert test["z"] == pytest.approx(math.log(7 / 3) / stderr)
    z = test["z"]  # on 2 degrees of freedom Student's upper tail is (1 - z / sqrt(2 + z^2)) / 2
    assert test["p"] == pytest.approx((1 - z / math.sqrt(2 + z * z)) / 2)


@pytest.mark.parametrize(
    ("t", "dof", "p"),
    [
        # upper 5% and 2.5% points of Student's t, from the standard tables
        pytest.param(2.132, 4, 0.05, id="t(4) 5%"),
        pytest.param(2.776, 4, 0.025, id="t(4) 2.5%"),
        pytest.param(4.303, 2, 0.025, id="t(2) 2.5%"),
        pytest.param(0.0, 4, 0.5, id="zero"),
        pytest.param(-2.776, 4, 0.975, id="below zero"),
        pytest.param(math.inf, 4, 0.0, id="certain"),
    ],
)
def test_the_p_value_is_students_t_upper_tail(bench, t, dof, p):
    assert bench._t_upper_tail(t, dof) == pytest.approx(p, abs=2e-4)


def test_twice_the_deviation_on_every_seed_is_four_times_the_variance_without_doubt(bench):
    rng = np.random.default_rng(3)
    centre, noise = rng.uniform(0.2, 0.8, 50), rng.normal(0.0, 0.05, (5, 50))
    test = bench.prediction_variance_test(centre + noise, centre + 2 * noise)
    assert test["variance_ratio"] == pytest.approx(4.0)
    assert test["log_stderr"] == pytest.approx(0.0, abs=1e-12)
    assert test["z"] > 1e6 and test["p"] < 1e-12
    same = bench.prediction_variance_test(centre + noise, centre + noise)
    assert (same["variance_ratio"], same["z"]) == (pytest.approx(1.0), 0.0)


def test_equal_spreads_pass_at_the_tests_level_and_a_wider_one_mostly_fails(bench):
    """300 simulated benchmarks of 5 seeds x 500 states, where a seed moves a policy partly as a whole
    (a shift along one direction over the states) and partly state by state."""
    rng = np.random.default_rng(0)

    def retrainings(centre: np.ndarray, direction: np.ndarray, sd: float) -> np.ndarray:
        whole = 0.03 * rng.normal(0.0, 1.0, (5, 1)) * direction
        return centre + whole + rng.normal(0.0, sd, (5, centre.size))

    def p_values(their_sd: float) -> np.ndarray:
        out = []
        for _ in range(300):
            world = rng.uniform(0.2, 0.8, 500), rng.normal(0.0, 1.0, 500)
            ours, theirs = retrainings(*world, 0.05), retrainings(*world, their_sd)
            out.append(bench.prediction_variance_test(ours, theirs)["p"])
        return np.array(out)

    level = bench.PREDICTION_VARIANCE_LEVEL
    equal, wider = p_values(0.05), p_values(0.08)
    assert np.mean(equal < level) < 2 * level
    assert np.mean(wider < level) > 0.5
    assert np.mean(wider > 1 - level) == 0.0


def test_the_variance_test_names_what_it_needs(bench):
    with pytest.raises(ValueError, match=r"same seeds, at least 3.*got 3 and 4"):
        bench.prediction_variance_test(np.zeros((3, 2)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="got 2 and 2"):
        bench.prediction_variance_test(np.zeros((2, 2)), np.zeros((2, 2)))


def test_the_page_shows_each_policys_spread_and_each_ablations_verdict(bench):
    groups = {
        "high_active": 0.001,
        "full_active": 0.002,
        "middle_active": 0.003,
        "low_active_or_unknown": None,
    }
    result = {
        "retraining_spread": {
            "states": 1200,
            "world": 2000,
            "policies": {
                "sl-mgac": {
                    "prediction_variance": 0.0049,
                    "decision_disagreement": 0.052,
                    "prediction_variance_by_group": groups,
                },
            },
        },
        "issue16": {
            "sl_mgac_vs_ac-single-group": {
                "prediction_variance": {"variance_ratio": math.e, "log_stderr": 0.25, "z": 4.0, "p": 0.008},
                "earns_its_place_on_prediction_variance": True,
            },
            "sl_mgac_vs_sl-mgac-nosl": {
                "prediction_variance": {"variance_ratio": 1.0, "log_stderr": 0.5, "z": 0.0, "p": 0.5},
                "earns_its_place_on_prediction_variance": False,
            },
        },
    }
    lines = bench.retraining_section(result)
    assert "1200 allocation states" in lines[2] and "world 2000" in lines[2]
    assert "| sl-mgac | 0.0049 (0.070) | 5.2% | 0.0010 | 0.0020 | 0.0030 | - |" in lines
    assert (
        "- Without the group towers (ac-single-group): prediction variance 2.72 times SL-MGAC's (log ratio "
        "+1.00 ± 0.25, z +4.0, p 0.008): the part earns its place on prediction variance where p < 0.025: "
        "yes." in lines
    )
    assert any(line.startswith("- Without the supervised heads") and line.endswith("no.") for line in lines)


def test_an_ablation_earns_its_place_on_prediction_variance_only_where_it_spreads_more(bench):
    from recsys_rl.sim.sim_eval import ALLOCATION_USER_METRICS, AllocationOutcome

    rng = np.random.default_rng(5)

    def outcome() -> AllocationOutcome:
        per_user = {m: rng.normal(600.0, 50.0, 200) for m in ALLOCATION_USER_METRICS}
        return AllocationOutcome(per_user, return_rate=0.6, allocation_rate=0.4, decisions=1000)

    outcomes = {name: [outcome() for _ in range(5)] for name in ("sl-mgac", "ac-single-group")}
    outcomes["greedy"] = [outcome()]
    centre, noise = rng.uniform(0.2, 0.8, 300), rng.normal(0.0, 0.05, (5, 300))
    narrow, wide = centre + noise, centre + 2 * noise
    towers = "sl_mgac_vs_ac-single-group"

    verdicts = bench.issue16_verdicts(outcomes, [], {"sl-mgac": narrow, "ac-single-group": wide})
    assert verdicts[towers]["prediction_variance"]["variance_ratio"] == pytest.approx(4.0)
    assert verdicts[towers]["earns_its_place_on_prediction_variance"] is True
    swapped = bench.issue16_verdicts(outcomes, [], {"sl-mgac": wide, "ac-single-group": narrow})
    assert swapped[towers]["earns_its_place_on_prediction_variance"] is False
    assert "prediction_variance" not in bench.issue16_verdicts(outcomes, [])[towers]
