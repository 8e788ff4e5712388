"""The gate's rules on hand-made lifts: every failing rule is a reason, and only a clean sheet passes."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from recsys_rl.loop.demo import demo_gate
from recsys_rl.ope.diagnostics import DiagnosticThresholds
from recsys_rl.ope.gate import GATE_ESTIMATORS, GateConfig, Lift, Support, Verdict, decide
from recsys_rl.ope.offline_evaluation import ESTIMATORS
from recsys_rl.signals import FEED_SIGNALS, LIVE_SIGNALS

NEUTRAL = Lift(0.0, -0.005, 0.005)
WIN = Lift(0.03, 0.01, 0.05)
WELL_SUPPORTED = [Support("candidate", "decision", ess=5000, max_weight_share=0.001)]


def _lifts(**changes: Lift) -> dict[str, Lift]:
    return {name: changes.get(name, NEUTRAL) for name in FEED_SIGNALS}


def test_a_clear_win_within_every_tolerance_passes():
    verdict = decide(GateConfig(), _lifts(watch_time=WIN), WELL_SUPPORTED)
    assert verdict.passed and verdict.reasons == ()
    assert len(verdict.checks) == 1 + 6 + 2 and all(c.startswith("pass: ") for c in verdict.checks)
    assert verdict.headline == "BLESSED" and verdict.loose_settings == ()


def test_a_main_signal_interval_reaching_below_the_minimum_fails():
    verdict = decide(GateConfig(), _lifts(watch_time=Lift(0.03, -0.001, 0.06)), WELL_SUPPORTED)
    assert not verdict.passed and verdict.headline == "NOT BLESSED"
    assert verdict.reasons == ("watch_time: 95% lower bound of the lift -0.10% < required +0.00%",)
    # the record marks the failed rule, and only it, as a failure
    assert verdict.checks[0] == "FAIL: watch_time: 95% lower bound of the lift -0.10% < required +0.00%"
    assert all(c.startswith("pass: ") for c in verdict.checks[1:])


def test_the_record_of_a_pass_at_every_boundary_reads_each_rule_the_right_way():
    """Exactly at a limit is a pass, and the record says so: ``>=`` and ``within``, the lower bound and
    ``loss`` for a higher-is-better signal, the upper bound and ``increase`` for hate."""
    config = GateConfig(min_main_lift=0.01, tolerances={"like": 0.05, "hate": 0.10})
    lifts = _lifts(
        watch_time=Lift(0.03, 0.01, 0.05), like=Lift(0.0, -0.05, 0.01), hate=Lift(0.0, -0.01, 0.10)
    )
    verdict = decide(config, lifts, WELL_SUPPORTED)
    assert verdict.passed

    def neutral(name: str) -> str:
        return f"pass: {name}: 95% lower bound of the lift -0.50% is within the tolerance of 2.00% loss"

    assert verdict.checks == (
        "pass: watch_time: 95% lower bound of the lift +1.00% >= required +1.00%",
        neutral("click"),
        "pass: like: 95% lower bound of the lift -5.00% is within the tolerance of 5.00% loss",
        neutral("follow"),
        neutral("comment"),
        neutral("share"),
        "pass: hate: 95% upper bound of the lift +10.00% is within the tolerance of 10.00% increase",
        "pass: candidate, decision level: effective sample size 5,000 vs required 1,000",
        "pass: candidate, decision level: largest weight share 0.0010 vs allowed 0.0100",
    )


def test_a_constraint_beyond_its_tolerance_is_recorded_as_a_failure_of_its_bad_side():
    config = GateConfig(tolerances={"like": 0.05})
    verdict = decide(config, _lifts(watch_time=WIN, like=Lift(-0.01, -0.06, 0.02)), WELL_SUPPORTED)
    text = "like: 95% lower bound of the lift -6.00% is beyond the tolerance of 5.00% loss"
    assert verdict.reasons == (text,)
    assert verdict.checks[2] == "FAIL: " + text


def _below(x: float) -> float:
    return math.nextafter(x, -math.inf)


def _above(x: float) -> float:
    return math.nextafter(x, math.inf)


@pytest.mark.parametrize(
    ("low", "passed"),
    [
        pytest.param(_above(0.01), True, id="just-above"),
        pytest.param(0.01, True, id="exactly-at-the-minimum"),
        pytest.param(_below(0.01), False, id="just-below"),
        pytest.param(math.nan, False, id="no-interval"),
    ],
)
def test_the_main_lifts_lower_bound_passes_from_exactly_the_minimum(low, passed):
    verdict = decide(GateConfig(min_main_lift=0.01), _lifts(watch_time=Lift(0.03, low, 0.05)), WELL_SUPPORTED)
    assert verdict.passed is passed
    assert [r.split(":")[0] for r in verdict.reasons] == ([] if passed else ["watch_time"])


@pytest.mark.parametrize(
    ("changes", "passed"),
    [
        # like may lose 5%: its lower bound may reach -5% exactly
        pytest.param({"like": Lift(0.0, -0.05, 0.01)}, True, id="like-at-the-tolerance"),
        pytest.param({"like": Lift(0.0, _below(-0.05), 0.01)}, False, id="like-just-beyond"),
        pytest.param({"like": Lift(0.0, math.nan, math.nan)}, False, id="like-no-interval"),
        # hate may rise 10%: its upper bound may reach +10% exactly
        pytest.param({"hate": Lift(0.0, -0.01, 0.10)}, True, id="hate-at-the-tolerance"),
        pytest.param({"hate": Lift(0.0, -0.01, _above(0.10))}, False, id="hate-just-beyond"),
    ],
)
def test_a_constraint_bound_exactly_at_its_tolerance_passes(changes, passed):
    config = GateConfig(tolerances={"like": 0.05, "hate": 0.10})
    verdict = decide(config, _lifts(watch_time=WIN, **changes), WELL_SUPPORTED)
    assert verdict.passed is passed, verdict.reasons


@pytest.mark.parametrize(
    ("ess", "share", "passed"),
    [
        pytest.param(1000.0, 0.01, True, id="both-exactly-at-their-limits"),
        pytest.param(_below(1000.0), 0.01, False, id="ess-just-short"),
        pytest.param(1000.0, _above(0.01), False, id="share-just-over"),
    ],
)
def test_support_exactly_at_the_limits_passes(ess, share, passed):
    config = GateConfig(min_ess=1000, max_weight_share=0.01)
    support = [Support("candidate", "decision", ess=ess, max_weight_share=share)]
    assert decide(config, _lifts(watch_time=WIN), support).passed is passed


def test_constraints_read_the_bound_on_their_bad_side():
    config = GateConfig(tolerances={"like": 0.05, "hate": 0.10})

    def verdict(**changes: Lift) -> Verdict:
        return decide(config, _lifts(watch_time=WIN, **changes), WELL_SUPPORTED)

    # like may lose up to 5%: a lower bound of -4% is fine, -6% is not
    assert verdict(like=Lift(-0.01, -0.04, 0.02)).passed
    assert [r.split(":")[0] for r in verdict(like=Lift(-0.01, -0.06, 0.02)).reasons] == ["like"]
    # hate is a cost: its *upper* bound may rise up to 10%; a big drop is good, whatever its lower bound
    assert verdict(hate=Lift(-0.3, -0.6, 0.09)).passed
    assert verdict(hate=Lift(0.05, -0.02, 0.12)).reasons == (
        "hate: 95% upper bound of the lift +12.00% is beyond the tolerance of 10.00% increase",
    )


def test_every_failing_rule_is_reported_not_just_the_first():
    verdict = decide(
        GateConfig(min_ess=1000, max_weight_share=0.01),
        _lifts(watch_time=Lift(-0.02, -0.04, 0.0), click=Lift(-0.1, -0.2, 0.0)),
        [Support("candidate", "decision", ess=200, max_weight_share=0.2)],
    )
    assert [r.split(":")[0] for r in verdict.reasons] == [
        "watch_time",
        "click",
        "candidate, decision level",
        "candidate, decision level",
        "hint",
    ]


def test_support_is_checked_for_every_policy_given_and_the_reason_names_policy_and_level():
    """Issue 19: only the candidate's decision-level weights were checked. A sequential estimator's
    weights are per-session products, and a lift over an incumbent is only as good as the incumbent's
    support too."""
    support = [
        Support("candidate", "session", ess=4000, max_weight_share=0.002),
        Support("incumbent", "session", ess=50, max_weight_share=0.3),
    ]
    verdict = decide(GateConfig(estimator="pdis"), _lifts(watch_time=WIN), support)
    assert not verdict.passed
    assert verdict.reasons[:2] == (
        "incumbent, session level: effective sample size 50 vs required 1,000",
        "incumbent, session level: largest weight share 0.3000 vs allowed 0.0100",
    )
    assert "pass: candidate, session level: effective sample size 4,000 vs required 1,000" in verdict.checks
    assert verdict.reasons[2].startswith("hint: the logs barely cover the incumbent")
    assert "agent." not in verdict.reasons[2]  # retraining the candidate does not help here


def _agent_config_fields(section: str) -> set[str]:
    from recsys_rl.training.agents.allocation import AllocationConfig  # TensorFlow: only this test
    from recsys_rl.training.agents.base import AgentConfig

    config = {"agent": AgentConfig, "allocation": AllocationConfig}[section]
    return {f.name for f in dataclasses.fields(config)}


@pytest.mark.parametrize(
    ("surface", "expected"),
    [
        ("feed", {"agent.behaviour_lambda", "agent.max_weight", "agent.bc_weight", "agent.initial_std"}),
        ("live_allocation", {"allocation.actor_supervised_weight"}),
    ],
)
def test_a_candidate_without_support_gets_a_hint_naming_real_training_settings(surface, expected):
    config = GateConfig(surface=surface)
    lifts = {name: WIN if name == config.main_signal else NEUTRAL for name in (FEED_SIGNALS + LIVE_SIGNALS)}
    verdict = decide(config, lifts, [Support("candidate", "decision", ess=120, max_weight_share=0.001)])
    assert verdict.reasons[0] == "candidate, decision level: effective sample size 120 vs required 1,000"
    (hint,) = verdict.reasons[1:]
    named = set(re.findall(r"\b(agent|allocation)\.(\w+)", hint))
    assert {".".join(n) for n in named} == expected
    for section, option in named:  # the train config's real option names: `agent:` / `allocation:` keys
        assert option in _agent_config_fields(section), f"{section}.{option} is not a training setting"
    # a signal failure alone is no support problem: no hint
    weak = decide(config, {**lifts, config.main_signal: NEUTRAL}, WELL_SUPPORTED)
    assert not any(r.startswith("hint") for r in weak.reasons)


def test_a_blessing_with_warnings_says_so_in_its_headline():
    support = [
        Support("candidate", "decision", 5000, 0.001, warnings=("session level: effective sample size 93",)),
        Support("incumbent", "decision", 6000, 0.001, warnings=("mean importance weight is 1.2",)),
    ]
    verdict = decide(GateConfig(), _lifts(watch_time=WIN), support)
    assert verdict.passed and verdict.headline == "BLESSED with 2 warnings"
    assert verdict.warnings == (
        "candidate: session level: effective sample size 93",
        "incumbent: mean importance weight is 1.2",
    )
    assert verdict.to_dict() == {
        "passed": True,
        "headline": "BLESSED with 2 warnings",
        "reasons": [],
        "checks": list(verdict.checks),
        "warnings": list(verdict.warnings),
        "loose_settings": [],
    }
    one = decide(GateConfig(), _lifts(watch_time=WIN), support[:1])
    assert one.headline == "BLESSED with 1 warning"
    failed = decide(GateConfig(), _lifts(), support)
    assert failed.headline == "NOT BLESSED"


def test_a_gate_looser_than_the_recommended_defaults_lists_each_looser_setting():
    assert (
        GateConfig().loose_settings() == () and GateConfig(surface="live_allocation").loose_settings() == ()
    )
    stricter = GateConfig(min_main_lift=0.01, default_tolerance=0.01, min_ess=2000, max_weight_share=0.005)
    assert stricter.loose_settings() == ()
    demo = dataclasses.replace(demo_gate(), alpha=0.1)  # the demo's gate, with a looser alpha too
    assert demo.loose_settings() == (
        "alpha 0.1 (recommended <= 0.05)",
        "min_main_lift -0.1 (recommended >= 0)",
        "tolerance of click 0.25 (recommended <= 0.02)",
        "tolerance of like 0.6 (recommended <= 0.02)",
        "tolerance of follow 1 (recommended <= 0.02)",
        "tolerance of comment 1 (recommended <= 0.02)",
        "tolerance of share 1 (recommended <= 0.02)",
        "tolerance of hate 1 (recommended <= 0.02)",
        "min_ess 100 (recommended >= 1000)",
        "max_weight_share 0.1 (recommended <= 0.01)",
    )
    verdict = decide(demo, _lifts(watch_time=WIN), WELL_SUPPORTED)
    assert verdict.passed and verdict.loose_settings == demo.loose_settings()
    settings = {s.name: s for s in demo.settings()}
    assert settings["min_ess"].looser and not settings["resamples"].looser
    assert settings["estimator"].value == "snips"


def test_the_demo_gate_is_labelled_loose():
    from recsys_rl.loop.demo import demo_gate

    loose = demo_gate().loose_settings()
    assert [s.split(" ")[0] for s in loose if not s.startswith("tolerance")] == [
        "min_main_lift",
        "min_ess",
        "max_weight_share",
    ]
    assert "tolerance of follow 1 (recommended <= 0.02)" in loose


def test_the_diagnostics_warn_at_the_gates_own_support_lines():
    """Issue 19: the warnings (ESS 5% of rows, 1% share) and the gate (ESS 100, 10% share) drew two
    different lines; now the gate hands its own to the diagnostics, and their defaults are the gate's."""
    thresholds = GateConfig(min_ess=100.0, max_weight_share=0.1).diagnostic_thresholds()
    assert (thresholds.min_ess, thresholds.max_weight_share) == (100.0, 0.1)
    assert thresholds.large_weight == DiagnosticThresholds().large_weight
    defaults = DiagnosticThresholds()
    assert (defaults.min_ess, defaults.max_weight_share) == (
        GateConfig().min_ess,
        GateConfig().max_weight_share,
    )


def test_sequential_estimators_gate_on_session_weights():
    assert GateConfig(estimator="snips").support_level == "decision"
    assert GateConfig(estimator="dr").support_level == "decision"
    for name in ("pdis", "wpdis", "sequential_dr"):
        assert GateConfig(estimator=name).support_level == "session"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tolerances": {"watch_time": 0.1}}, "not constraint signals"),
        ({"tolerances": {"like": -0.1}}, "tolerance of like"),
        ({"alpha": 1.5}, "alpha"),
        ({"interval": "normal"}, "interval"),
        ({"surface": "search"}, "surface"),
        ({"max_weight_share": 0.0}, "max_weight_share"),
        pytest.param(
            {"estimator": "magic"},
            r"estimator should be one of \['ips', 'clipped_ips', 'ncis', 'snips', 'dr', 'sndr', 'switch_dr', "
            r"'pdis', 'wpdis', 'sequential_dr'\], but is 'magic'",
            id="unknown-estimator",
        ),
        pytest.param(
            {"estimator": "dm"},
            r"estimator 'dm' cannot gate: its bootstrap interval holds the fitted reward model fixed and so "
            r"does not include the model's error \(measured coverage 0.08-0.40 for DM\)",
            id="dm",
        ),
        pytest.param(
            {"estimator": "fqe"},
            r"estimator 'fqe' cannot gate: its bootstrap interval holds the fitted FQE model fixed and so "
            r"does not include the model's error \(measured coverage 0.815 for FQE\)",
            id="fqe",
        ),
    ],
)
def test_bad_gate_configs_name_the_problem(settings, message):
    with pytest.raises(ValueError, match=message):
        GateConfig(**settings)


SUPPORT_LIMITS = "^" + re.escape("min_ess should be >= 0 and max_weight_share in (0, 1]") + "$"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"alpha": 0.0}, r"alpha should be in \(0, 1\), but is 0.0", id="alpha-0"),
        pytest.param({"alpha": 1.0}, r"alpha should be in \(0, 1\), but is 1.0", id="alpha-1"),
        pytest.param({"resamples": 9}, "resamples should be at least 10, but is 9", id="resamples-9"),
        pytest.param(
            {"default_tolerance": -0.01},
            "tolerance of default_tolerance should be >= 0, but is -0.01",
            id="negative-default-tolerance",
        ),
        pytest.param({"min_ess": _below(0.0)}, SUPPORT_LIMITS, id="negative-min-ess"),
        pytest.param({"max_weight_share": _above(1.0)}, SUPPORT_LIMITS, id="share-just-over-1"),
    ],
)
def test_settings_just_outside_their_ranges_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        GateConfig(**settings)


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"alpha": _above(0.0)}, id="alpha-just-above-0"),
        pytest.param({"alpha": _below(1.0)}, id="alpha-just-below-1"),
        pytest.param({"resamples": 10}, id="resamples-10"),
        pytest.param({"default_tolerance": 0.0, "tolerances": {"like": 0.0}}, id="zero-tolerances"),
        pytest.param({"min_ess": 0.0}, id="min-ess-0"),
        pytest.param({"min_ess": 0.5}, id="min-ess-half"),
        pytest.param({"max_weight_share": 1.0}, id="share-1"),
    ],
)
def test_settings_at_the_edges_of_their_ranges_are_accepted(settings):
    config = GateConfig(**settings)
    assert all(getattr(config, key) == value for key, value in settings.items())


def test_the_settings_table_lists_every_setting_by_name_with_its_recommended_bound():
    rows = [(s.name, s.value, s.recommended, s.looser) for s in GateConfig().settings()]
    tolerances = [(f"tolerance of {n}", "0.02", "<= 0.02", False) for n in FEED_SIGNALS[1:]]
    assert rows == [
        ("surface", "feed", "", False),
        ("estimator", "snips", "", False),
        ("interval", "bca", "", False),
        ("resamples", "200", "", False),
        ("bootstrap_unit", "user", "user", False),
        ("alpha", "0.05", "<= 0.05", False),
        ("min_main_lift", "0", ">= 0", False),
        *tolerances,
        ("min_ess", "1000", ">= 1000", False),
        ("max_weight_share", "0.01", "<= 0.01", False),
    ]


def test_every_estimator_with_the_models_error_in_its_interval_can_gate():
    assert tuple(n for n in ESTIMATORS if n not in ("dm", "fqe")) == GATE_ESTIMATORS
    for name in GATE_ESTIMATORS:
        assert GateConfig(estimator=name).estimator == name


def test_the_allocation_surface_gates_live_watch_time_with_its_own_constraints():
    config = GateConfig(surface="live_allocation")
    assert config.main_signal == "live_watch_time"
    assert config.constraint_signals == ("gift", "video_watch_displaced")


def test_a_signal_without_an_interval_says_so_instead_of_printing_nan():
    lifts = _lifts(watch_time=Lift(0.03, math.nan, math.nan), follow=Lift(0.0, math.nan, math.nan))
    verdict = decide(GateConfig(), lifts, WELL_SUPPORTED)
    failed = {reason.split(":")[0]: reason for reason in verdict.reasons}
    assert set(failed) == {"watch_time", "follow"}
    for reason in failed.values():
        assert "no 95% interval" in reason and "nan" not in reason.lower().replace("finite", "")


def test_a_missing_interval_gives_the_full_explanation_at_the_gates_level():
    config = GateConfig(alpha=0.1)
    verdict = decide(config, _lifts(watch_time=Lift(0.03, math.nan, math.nan)), WELL_SUPPORTED)
    text = (
        "watch_time: the lift has no 90% interval: too few bootstrap resamples gave a finite value (the "
        "signal is too rare in these logs, or its baseline is 0), so the rule cannot be shown to hold"
    )
    assert verdict.reasons == (text,) and verdict.checks[0] == "FAIL: " + text


def test_a_constraint_without_an_interval_does_not_stop_the_later_constraints_being_checked():
    lifts = _lifts(watch_time=WIN, click=Lift(0.0, math.nan, math.nan), hate=Lift(0.05, -0.02, 0.12))
    verdict = decide(GateConfig(), lifts, WELL_SUPPORTED)
    assert [r.split(":")[0] for r in verdict.reasons] == ["click", "hate"]
    assert len(verdict.checks) == 1 + 6 + 2


def test_resampling_sessions_instead_of_users_is_a_loose_setting():
    assert GateConfig(bootstrap_unit="session").loose_settings() == (
        "bootstrap_unit session (recommended user)",
    )
    with pytest.raises(ValueError, match="bootstrap_unit should be one of"):
        GateConfig(bootstrap_unit="request")
