"""Weight diagnostics by hand: ESS, shares, quantiles and the warnings they raise."""

import json

import numpy as np
import pytest

from recsys_rl.ope.diagnostics import DiagnosticThresholds, diagnose, weight_summary
from recsys_rl.ope.logged import LoggedSteps


def test_weight_summary_by_hand():
    summary = weight_summary(np.log([1.0, 1.0, 2.0, 4.0]))
    # (1 + 1 + 2 + 4)^2 / (1 + 1 + 4 + 16) = 64 / 22
    assert summary["ess"] == pytest.approx(64 / 22)
    assert summary["ess_fraction"] == pytest.approx(16 / 22)
    assert summary["max_weight_share"] == pytest.approx(4 / 8)
    assert (summary["count"], summary["mean"], summary["max"]) == (4, 2.0, 4.0)
    assert summary["max_log_weight"] == pytest.approx(np.log(4.0))
    assert summary["quantiles"]["0.5"] == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("huge", "ess", "share"),
    [
        pytest.param([600.0], 1.0, 1.0, id="one-exp600"),
        pytest.param([800.0], 1.0, 1.0, id="one-exp800"),
        pytest.param([600.0, 800.0], 1.0, 1.0, id="exp800-dominates-exp600"),
        pytest.param([800.0, 800.0], 2.0, 0.5, id="two-exp800"),
    ],
)
def test_ess_and_share_stay_exact_when_weights_overflow(huge, ess, share):
    """Issue 19: exp(600)^2 overflows, so (sum w)^2 / sum w^2 gave nan exactly when support fails; from
    the log weights (log-sum-exp) the ESS of one dominating weight is 1, as it should be."""
    log_weights = np.r_[np.zeros(98), huge]
    summary = weight_summary(log_weights)
    assert summary["ess"] == pytest.approx(ess, rel=1e-9)
    assert summary["max_weight_share"] == pytest.approx(share, rel=1e-9)
    assert summary["max_log_weight"] == max(huge)
    json.dumps(summary, allow_nan=False)


def test_a_target_that_never_takes_a_logged_action_has_no_effective_sample():
    summary = weight_summary(np.full(4, -np.inf))
    assert (summary["ess"], summary["max_weight_share"], summary["max_log_weight"]) == (0.0, 1.0, None)
    json.dumps(summary, allow_nan=False)


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
    report = diagnose(_ten_steps(), log_ratio, DiagnosticThresholds(min_ess=2.0))
    decision = report["decision"]
    assert decision["ess"] == pytest.approx(29**2 / (9 + 400))  # 2.06: above the line of 2
    assert decision["max_weight_share"] == pytest.approx(20 / 29)
    assert decision["share_above_large"] == pytest.approx(0.1)
    assert decision["mass_above_large"] == pytest.approx(20 / 29)
    assert decision["low_density_mass"] == pytest.approx(20 / 29)
    assert decision["mean"] == pytest.approx(2.9)
    # sessions' weight products are 1, 1, 1, 1, 20
    assert report["session"]["ess"] == pytest.approx(24**2 / (4 + 400))
    assert report["session"]["max_weight_share"] == pytest.approx(20 / 24)
    assert not report["ok"]
    assert [w.split(" ")[0] for w in report["warnings"]] == [
        "one",
        "weights",
        "the",
        "mean",
        "session",
        "session",
    ]
    assert "carry 69.0% of the target's weight" in report["warnings"][2]
    assert report["warnings"][4:] == [
        "session level: effective sample size 1 (28.5% of 5 sessions) is below 2",
        "session level: one session carries 83.3% of the total weight (threshold 1.0%)",
    ]
    assert report["warnings_by_level"] == {
        "decision": report["warnings"][:4],
        "session": report["warnings"][4:],
        "groups": [],
    }
    json.dumps(report, allow_nan=False)


def test_a_weight_of_exp_800_is_diagnosed_not_lost_to_overflow():
    log_ratio = np.r_[np.zeros(9), 800.0]
    report = diagnose(_ten_steps(), log_ratio, DiagnosticThresholds(min_ess=2.0))
    for level in ("decision", "session"):
        assert report[level]["ess"] == pytest.approx(1.0)
        assert report[level]["max_weight_share"] == pytest.approx(1.0)
    assert report["decision"]["mass_above_large"] == pytest.approx(1.0)
    assert report["decision"]["low_density_mass"] == pytest.approx(1.0)
    assert report["warnings"][0] == "effective sample size 1 (10.0% of 10 decisions) is below 2"
    json.dumps(report, allow_nan=False)


def test_the_behaviour_policy_itself_passes_and_thresholds_are_configurable():
    # ten equal weights carry 10% each (sessions: 20%): allow that, and nothing else is wrong
    loose = DiagnosticThresholds(min_ess=5.0, max_weight_share=0.2)
    report = diagnose(_ten_steps(), np.zeros(10), loose)
    assert report["ok"] and report["warnings"] == []
    assert report["decision"]["ess"] == pytest.approx(10.0)
    assert report["groups"]["high_active"]["ess"] == pytest.approx(10.0)
    assert report["thresholds"]["max_weight_share"] == 0.2
    # a weight of 3 on the rarest action: ESS 12^2 / 18 = 8 of 10, share 3 / 12, rare-action mass 3 / 12,
    # mean 1.2; sessions 1, 1, 1, 1, 3: ESS 7^2 / 13, share 3 / 7; every warning but the large-weight one
    strict = DiagnosticThresholds(min_ess=9.5, max_weight_share=0.2, min_group_ess_fraction=0.95)
    report = diagnose(_ten_steps(), np.log(np.r_[np.ones(9), 3.0]), strict)
    assert [w.split(" ")[0] for w in report["warnings"]] == [
        "effective",
        "one",
        "the",
        "mean",
        "session",
        "session",
        "group",
    ]
    assert report["warnings"][0] == "effective sample size 8 (80.0% of 10 decisions) is below 10"
    assert report["warnings"][-1] == (
        "group high_active: effective sample size 8 is 80.0% of its 10 decisions (threshold 95.0%)"
    )
