"""The gate's rules on hand-made lifts: every failing rule is a reason, and only a clean sheet passes."""

from __future__ import annotations

import pytest

from recsys_rl.ope.gate import GateConfig, Lift, decide
from recsys_rl.signals import FEED_SIGNALS

NEUTRAL = Lift(0.0, -0.005, 0.005)


def _lifts(**changes: Lift) -> dict[str, Lift]:
    return {name: changes.get(name, NEUTRAL) for name in FEED_SIGNALS}


def test_a_clear_win_within_every_tolerance_passes():
    verdict = decide(
        GateConfig(), _lifts(watch_time=Lift(0.03, 0.01, 0.05)), ess=5000, max_weight_share=0.001
    )
    assert verdict.passed and verdict.reasons == ()
    assert len(verdict.checks) == 1 + 6 + 2 and all(c.startswith("pass: ") for c in verdict.checks)


def test_a_main_signal_interval_reaching_below_the_minimum_fails():
    verdict = decide(
        GateConfig(), _lifts(watch_time=Lift(0.03, -0.001, 0.06)), ess=5000, max_weight_share=0.001
    )
    assert not verdict.passed
    assert verdict.reasons == ("watch_time: 95% lower bound of the lift -0.10% < required +0.00%",)


def test_constraints_read_the_bound_on_their_bad_side():
    config = GateConfig(tolerances={"like": 0.05, "hate": 0.10})
    win = Lift(0.03, 0.01, 0.05)
    # like may lose up to 5%: a lower bound of -4% is fine, -6% is not
    assert decide(config, _lifts(watch_time=win, like=Lift(-0.01, -0.04, 0.02)), 5000, 0.001).passed
    failed = decide(config, _lifts(watch_time=win, like=Lift(-0.01, -0.06, 0.02)), 5000, 0.001)
    assert [r.split(":")[0] for r in failed.reasons] == ["like"]
    # hate is a cost: its *upper* bound may rise up to 10%; a big drop is good, whatever its lower bound
    assert decide(config, _lifts(watch_time=win, hate=Lift(-0.3, -0.6, 0.09)), 5000, 0.001).passed
    failed = decide(config, _lifts(watch_time=win, hate=Lift(0.05, -0.02, 0.12)), 5000, 0.001)
    assert failed.reasons == (
        "hate: 95% upper bound of the lift +12.00% is beyond the tolerance of 10.00% increase",
    )


def test_every_failing_rule_is_reported_not_just_the_first():
    verdict = decide(
        GateConfig(min_ess=1000, max_weight_share=0.01),
        _lifts(watch_time=Lift(-0.02, -0.04, 0.0), click=Lift(-0.1, -0.2, 0.0)),
        ess=200,
        max_weight_share=0.2,
    )
    assert [r.split(" ")[0].rstrip(":") for r in verdict.reasons] == [
        "watch_time",
        "click",
        "effective",
        "largest",
    ]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tolerances": {"watch_time": 0.1}}, "not constraint signals"),
        ({"tolerances": {"like": -0.1}}, "tolerance of like"),
        ({"alpha": 1.5}, "alpha"),
        ({"interval": "normal"}, "interval"),
        ({"surface": "search"}, "surface"),
        ({"max_weight_share": 0.0}, "max_weight_share"),
    ],
)
def test_bad_gate_configs_name_the_problem(settings, message):
    with pytest.raises(ValueError, match=message):
        GateConfig(**settings)


def test_the_allocation_surface_gates_live_watch_time_with_its_own_constraints():
    config = GateConfig(surface="live_allocation")
    assert config.main_signal == "live_watch_time"
    assert config.constraint_signals == ("gift", "video_watch_displaced")
