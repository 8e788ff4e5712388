"""The OPE entry points: the result schema, on-policy sanity, group plumbing and paired lifts."""

import dataclasses
import json

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.ope import estimators as single
from recsys_rl.ope.logged import LoggedSteps, group_label
from recsys_rl.ope.offline_evaluation import (
    ESTIMATORS,
    SINGLE_DECISION,
    OPESettings,
    evaluate_lift,
    evaluate_policy_offline,
)
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

FEED = behaviour_feed_policy()
TARGET = dataclasses.replace(FEED, base_logits=FEED.base_logits + np.array([0.1, -0.1, 0, 0, 0, 0, 0.05]))
FAST = {"resamples": 60, "settings": OPESettings(fqe_iterations=10, folds=3)}


@pytest.fixture(scope="module")
def logged() -> LoggedSteps:
    day = Simulator(SimConfig(n_users=200), seed=6).run_day(FEED, behaviour_allocation_policy())
    return LoggedSteps.from_day_logs([day])


@pytest.fixture(scope="module")
def evaluation(logged) -> dict:
    return evaluate_policy_offline(logged, TARGET, seed=3, **FAST)


def test_the_result_follows_the_documented_schema(logged, evaluation):
    json.dumps(evaluation, allow_nan=False)
    assert (evaluation["schema_version"], evaluation["kind"]) == (1, "ope_evaluation")
    assert evaluation["signals"] == list(signals.FEED_SIGNALS)
    assert (evaluation["rows"], evaluation["sessions"]) == (logged.rows, logged.sessions)
    assert sum(g["rows"] for g in evaluation["group_sizes"].values()) == logged.rows
    assert evaluation["interval"] == {
        "method": "bca",
        "alpha": 0.05,
        "resamples": 60,
        "seed": 3,
        "unit": "user",
        "users": int(np.unique(logged.user).size),
        "jackknife_blocks": 200,
    }
    assert list(evaluation["estimators"]) == list(ESTIMATORS)
    groups = sorted(evaluation["group_sizes"])
    for name, block in evaluation["estimators"].items():
        assert block["kind"] == ("single_decision" if name in SINGLE_DECISION else "sequential")
        assert block["scale"] == ("per_decision" if name in SINGLE_DECISION else "per_session_discounted")
        # a prediction alone: its interval holds the model fixed and must say so wherever it is shown
        assert block["model_error_included"] is (name not in ("dm", "fqe"))
        assert sorted(block["groups"]) == groups
        for scope in [block["overall"], *block["groups"].values()]:
            assert list(scope) == list(signals.FEED_SIGNALS)
            for entry in scope.values():
                assert entry["method"] == "bca"
                low, high = entry["interval"]
                assert low <= high
    for block in evaluation["behaviour"].values():
        assert list(block["overall"]) == list(signals.FEED_SIGNALS)
    bounds = evaluation["concentration"]["signals"]["watch_time"]
    assert bounds["bernstein"][0] < bounds["value"] < bounds["bernstein"][1]
    assert bounds["range"][0] == 0.0 and bounds["range"][1] == pytest.approx(
        10.0 * logged.rewards[:, 0].max()
    )
    assert set(evaluation["diagnostics"]) >= {"ok", "warnings", "decision", "session", "groups"}


def test_group_values_are_the_estimators_on_the_groups_own_rows(logged, evaluation):
    weights = single.importance_weights(
        single.log_importance_ratio(TARGET.log_prob(logged.states, logged.actions), logged.behaviour_log_prob)
    )
    for code in np.unique(logged.groups):
        rows = logged.groups == code
        expected = single.snips(logged.rewards[rows], weights[rows]).value()
        got = evaluation["estimators"]["snips"]["groups"][group_label(int(code))]
        np.testing.assert_allclose([got[s]["value"] for s in signals.FEED_SIGNALS], expected, rtol=1e-9)
    overall = single.snips(logged.rewards, weights).value()
    got = evaluation["estimators"]["snips"]["overall"]
    np.testing.assert_allclose([got[s]["value"] for s in signals.FEED_SIGNALS], overall, rtol=1e-9)


def test_the_behaviour_policy_evaluated_on_its_own_logs_gets_its_logged_value(logged):
    result = evaluate_policy_offline(
        logged, FEED, estimators=("ips", "snips", "ncis", "pdis", "wpdis"), interval="percentile", **FAST
    )
    per_decision = result["behaviour"]["per_decision"]["overall"]
    per_session = result["behaviour"]["per_session_discounted"]["overall"]
    for s in signals.FEED_SIGNALS:
        np.testing.assert_allclose(
            per_decision[s]["value"], logged.rewards[:, signals.FEED_SIGNALS.index(s)].mean()
        )
        for name in ("ips", "snips", "ncis"):
            assert result["estimators"][name]["overall"][s]["value"] == pytest.approx(
                per_decision[s]["value"], rel=1e-4
            )
        for name in ("pdis", "wpdis"):
            assert result["estimators"][name]["overall"][s]["value"] == pytest.approx(
                per_session[s]["value"], rel=1e-4
            )
    assert result["diagnostics"]["decision"]["ess_fraction"] == pytest.approx(1.0, abs=1e-6)


def test_evaluations_are_reproducible_from_the_seed(logged, evaluation):
    again = evaluate_policy_offline(logged, TARGET, seed=3, **FAST)
    assert json.dumps(again, sort_keys=True) == json.dumps(evaluation, sort_keys=True)
    other = evaluate_policy_offline(logged, TARGET, seed=4, estimators=("snips",), **FAST)
    assert other["estimators"]["snips"]["overall"]["click"]["value"] == pytest.approx(
        evaluation["estimators"]["snips"]["overall"]["click"]["value"]
    )
    assert (
        other["estimators"]["snips"]["overall"]["click"]["interval"]
        != (evaluation["estimators"]["snips"]["overall"]["click"]["interval"])
    )


def test_a_candidate_against_itself_has_exactly_zero_lift(logged):
    lift = evaluate_lift(logged, TARGET, TARGET, **FAST)
    json.dumps(lift, allow_nan=False)
    assert (lift["kind"], lift["baseline"]) == ("ope_lift", "incumbent")
    assert lift["directions"]["hate"] == -1 and lift["directions"]["watch_time"] == 1
    for block in lift["estimators"].values():
        for scope in [block["overall"], *block["groups"].values()]:
            for entry in scope.values():
                assert entry["difference"]["value"] == 0.0
                assert entry["difference"]["interval"] == [0.0, 0.0]
                assert entry["candidate"] == entry["baseline"]


def test_lift_over_the_behaviour_policy_is_paired(logged, evaluation):
    lift = evaluate_lift(logged, TARGET, estimators=("snips", "pdis"), **FAST)
    assert lift["baseline"] == "behaviour" and lift["diagnostics"]["baseline"] is None
    for name, scale in (("snips", "per_decision"), ("pdis", "per_session_discounted")):
        for s in ("watch_time", "click"):
            entry = lift["estimators"][name]["overall"][s]
            base = evaluation["behaviour"][scale]["overall"][s]["value"]
            assert entry["baseline"]["value"] == pytest.approx(base)
            assert entry["candidate"]["value"] == pytest.approx(
                evaluation["estimators"][name]["overall"][s]["value"]
            )
            assert entry["difference"]["value"] == pytest.approx(entry["candidate"]["value"] - base)
            assert entry["relative"]["value"] == pytest.approx(
                (entry["candidate"]["value"] - base) / abs(base)
            )
            # the same sessions drive both values: their difference varies far less than either does
            width = np.diff(entry["difference"]["interval"])[0]
            unpaired = np.hypot(
                np.diff(entry["candidate"]["interval"])[0], np.diff(entry["baseline"]["interval"])[0]
            )
            # (an unpaired bootstrap of the difference would give the unpaired width, a ratio near 1)
            assert width < 0.9 * unpaired, f"{name}/{s}: paired width {width:.4g} vs unpaired {unpaired:.4g}"


def test_without_groups_only_overall_values_are_reported(logged):
    result = evaluate_policy_offline(logged, TARGET, estimators=("ips", "fqe"), groups=False, **FAST)
    assert all(block["groups"] == {} for block in result["estimators"].values())
    assert result["behaviour"]["per_decision"]["groups"] == {}
    assert list(result["estimators"]) == ["ips", "fqe"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"estimators": ("ips", "magic")}, "unknown or no estimators \\['magic'\\]"),
        ({"estimators": ()}, "unknown or no estimators"),
        ({"interval": "normal"}, "interval should be one of"),
        ({"alpha": 0.0}, "alpha"),
    ],
)
def test_bad_requests_name_the_problem(logged, kwargs, message):
    with pytest.raises(ValueError, match=message):
        evaluate_policy_offline(logged, TARGET, **kwargs)


def test_settings_refuse_in_sample_models():
    with pytest.raises(ValueError, match="cross-fitting"):
        OPESettings(folds=1)


def _support(decision_ess: float, session_ess: float, *warnings: str, session: tuple[str, ...] = ()) -> dict:
    """The parts of ``diagnose`` the gate reads; ``warnings`` at the decision level."""
    return {
        "warnings": [*warnings, *session],
        "warnings_by_level": {"decision": list(warnings), "session": list(session), "groups": []},
        "decision": {"ess": decision_ess, "max_weight_share": 0.001},
        "session": {"ess": session_ess, "max_weight_share": 0.001},
    }


def _winning_lift(candidate: dict, baseline: dict | None) -> dict:
    """An ``evaluate_lift`` result where every estimator sees a clear win within every tolerance."""
    relative = {"relative": {"value": 0.01, "interval": [0.005, 0.015]}}  # hate: +1.5% is within 2%
    overall = {"overall": {s: relative for s in signals.FEED_SIGNALS}}
    return {
        "signals": list(signals.FEED_SIGNALS),
        "estimators": {name: overall for name in ("snips", "pdis")},
        "diagnostics": {"candidate": candidate, "baseline": baseline},
    }


def test_the_gate_reads_the_support_of_its_own_estimators_level():
    """Issue 19: a sequential estimator weights by per-session products, whose ESS was computed and
    never checked; here the decisions are well supported and the sessions are not."""
    from recsys_rl.ope.evaluate import gate_verdict
    from recsys_rl.ope.gate import GateConfig

    lift = _winning_lift(_support(5000, 200), None)
    assert gate_verdict(GateConfig(estimator="snips"), lift).passed
    verdict = gate_verdict(GateConfig(estimator="pdis"), lift)
    assert not verdict.passed
    assert verdict.reasons[0] == "candidate, session level: effective sample size 200 vs required 1,000"


def test_against_an_incumbent_the_gate_reads_the_incumbents_support_too():
    from recsys_rl.ope.evaluate import gate_verdict
    from recsys_rl.ope.gate import GateConfig

    behaviour = gate_verdict(GateConfig(), _winning_lift(_support(5000, 5000), None))
    assert behaviour.passed and len(behaviour.checks) == 1 + 6 + 2  # the behaviour's weights are all 1
    verdict = gate_verdict(GateConfig(), _winning_lift(_support(5000, 5000), _support(300, 5000)))
    assert not verdict.passed
    assert verdict.reasons[0] == "incumbent, decision level: effective sample size 300 vs required 1,000"
    assert len(verdict.checks) == 1 + 6 + 2 + 2


def test_the_verdict_carries_both_policies_warnings():
    from recsys_rl.ope.evaluate import gate_verdict
    from recsys_rl.ope.gate import GateConfig

    lift = _winning_lift(_support(5000, 5000, "mean weight"), _support(5000, 5000, "heavy tail"))
    verdict = gate_verdict(GateConfig(), lift)
    assert verdict.headline == "BLESSED with 2 warnings"
    assert verdict.warnings == ("candidate: mean weight", "incumbent: heavy tail")


def test_a_single_decision_gate_leaves_out_the_session_levels_warnings():
    """Session products of weights are heavy-tailed in nearly every log: counted against a SNIPS
    blessing, which never uses them, every headline would read "with warnings" and mean nothing."""
    from recsys_rl.ope.evaluate import gate_verdict
    from recsys_rl.ope.gate import GateConfig

    candidate = _support(5000, 5000, "mean weight", session=("session level: one session carries 7%",))
    lift = _winning_lift(candidate, None)
    assert gate_verdict(GateConfig(estimator="snips"), lift).warnings == ("candidate: mean weight",)
    assert gate_verdict(GateConfig(estimator="pdis"), lift).warnings == (
        "candidate: mean weight",
        "candidate: session level: one session carries 7%",
    )


def test_the_gate_reads_a_real_lift_at_the_session_level(logged):
    from recsys_rl.ope.evaluate import gate_verdict
    from recsys_rl.ope.gate import GateConfig

    gate = GateConfig(estimator="pdis", min_main_lift=-1.0, default_tolerance=100.0, min_ess=10.0)
    settings = dataclasses.replace(FAST["settings"], thresholds=gate.diagnostic_thresholds())
    lift = evaluate_lift(logged, TARGET, estimators=("pdis",), resamples=20, settings=settings)
    session = lift["diagnostics"]["candidate"]["session"]
    assert lift["diagnostics"]["candidate"]["thresholds"]["min_ess"] == 10.0
    verdict = gate_verdict(gate, lift)
    assert (
        f"candidate, session level: effective sample size {session['ess']:,.0f} vs required 10"
        in " ".join(verdict.checks)
    )
