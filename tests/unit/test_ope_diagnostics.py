"""Weight diagnostics by hand: ESS, shares, quantiles and the warnings they raise."""

import json

import numpy as np
import pytest

from recsys_rl.ope.diagnostics import DiagnosticThresholds, diagnose, weight_summary
from recsys_rl.ope.logged import LoggedSteps


def test_weight_summary_by_hand():
    summary = weight_summary(np.array([1.0, 1.0, 2.0, 4.0]))
    # (1 + 1 + 2 + 4)^2 / (1 + 1 + 4 + 16) = 64 / 22
    assert summary["ess"] == pytest.approx(64 / 22)
    assert summary["ess_fraction"] == pytest.approx(16 / 22)
    assert summary["max_weight_share"] == pytest.approx(4 / 8)
    assert (summary["count"], summary["mean"], summary["max"]) == (4, 2.0, 4.0)
    assert summary["quantiles"]["0.5"] == pytest.approx(1.5)


def _ten_steps() -> LoggedSteps:
    """Five sessions of two decisions; behaviour log-densities -1 ... -10."""
    n = 10
    return LoggedSteps(
        states=np.zeros((n, 2), np.float32),
        actions=np.zeros((n, 1), np.float32),
        rewards=np.ones((n, 1)),
        behaviour_log_prob=-np.arange(1.0, 11.0),
        groups=np.zeros(n, np.int64),
        session=np.repeat(np.arange(5), 2),
        step=np.tile([0, 1], 5),
        done=np.tile([False, True], 5),
        next_states=np.zeros((n, 2), np.float32),
        signals=("watch_time",),
    )


def test_a_single_huge_weight_on_a_rare_action_raises_every_support_warning():
    # nine weights of 1 and one of 20, on the action the behaviour policy was least likely to take
    log_ratio = np.log(np.r_[np.ones(9), 20.0])
    report = diagnose(_ten_steps(), log_ratio)
    decision = report["decision"]
    assert decision["ess"] == pytest.approx(29**2 / (9 + 400))  # 2.06 of 10: above the 5% threshold
    assert decision["max_weight_share"] == pytest.approx(20 / 29)
    assert decision["share_above_large"] == pytest.approx(0.1)
    assert decision["mass_above_large"] == pytest.approx(20 / 29)
    assert decision["low_density_mass"] == pytest.approx(20 / 29)
    assert decision["mean"] == pytest.approx(2.9)
    # sessions' weight products are 1, 1, 1, 1, 20
    assert report["session"]["ess"] == pytest.approx(24**2 / (4 + 400))
    assert not report["ok"]
    assert [w.split(" ")[0] for w in report["warnings"]] == ["one", "weights", "the", "mean"]
    assert "carry 69.0% of the target's weight" in report["warnings"][2]
    json.dumps(report, allow_nan=False)


def test_the_behaviour_policy_itself_passes_and_thresholds_are_configurable():
    # ten equal weights carry 10% each: allow that, and nothing else is wrong
    loose = DiagnosticThresholds(max_weight_share=0.2)
    report = diagnose(_ten_steps(), np.zeros(10), loose)
    assert report["ok"] and report["warnings"] == []
    assert report["decision"]["ess"] == pytest.approx(10.0)
    assert report["groups"]["high_active"]["ess"] == pytest.approx(10.0)
    assert report["thresholds"]["max_weight_share"] == 0.2
    # a weight of 3 on the rarest action: ESS 12^2 / 18 = 8 of 10, share 3 / 12, rare-action mass 3 / 12,
    # mean 1.2; with a 95% ESS threshold that is every warning but the large-weight one (3 < 10)
    strict = DiagnosticThresholds(min_ess_fraction=0.95, max_weight_share=0.2)
    report = diagnose(_ten_steps(), np.log(np.r_[np.ones(9), 3.0]), strict)
    assert [w.split(" ")[0] for w in report["warnings"]] == ["effective", "one", "the", "mean", "group"]
    assert report["warnings"][0] == "effective sample size 8 is 80.0% of 10 decisions (threshold 95.0%)"
