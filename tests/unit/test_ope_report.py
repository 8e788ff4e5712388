"""The OPE report: the lift plot draws whatever intervals the estimators give; the headline and the gate's
configuration say what the blessing is worth."""

from __future__ import annotations

import dataclasses

import pytest

from recsys_rl.ope.gate import GateConfig, Lift, Support, decide
from recsys_rl.ope.report import _gate_section, _lift_plot, _status
from recsys_rl.signals import FEED_SIGNALS


def _entry(value, low, high) -> dict:
    return {"relative": {"value": value, "interval": [low, high]}}


def test_a_point_outside_its_percentile_interval_is_drawn_not_refused():
    """A percentile bootstrap interval of a ratio need not contain the point estimate; the pipeline run
    that met one (a sparse signal over a small baseline) failed in matplotlib's error bars."""
    report = {
        "lift": {
            "signals": ["watch_time", "hate"],
            "estimators": {
                "snips": {
                    "overall": {"watch_time": _entry(0.02, -0.01, 0.05), "hate": _entry(0.9, -0.5, 0.4)},
                    "groups": {
                        "high_active": {"watch_time": _entry(None, None, None), "hate": _entry(0, 0, 0)}
                    },
                }
            },
        }
    }
    image = _lift_plot(report, "snips")
    assert image.startswith('<img alt="plot" src="data:image/png;base64,') and len(image) > 1000


def _report(gate: GateConfig, *warnings: str, win: bool = True) -> dict:
    """The parts of a report the headline and the gate section read."""
    lifts = {name: (0.01, 0.005, 0.015) if win else (0.0, -0.01, 0.01) for name in FEED_SIGNALS}
    support = [Support("candidate", "decision", 5000.0, 0.001, warnings)]
    verdict = decide(gate, {name: Lift(*lift) for name, lift in lifts.items()}, support)
    return {"gate": dataclasses.asdict(gate), "verdict": verdict.to_dict()}


@pytest.mark.parametrize(
    ("warnings", "win", "expected"),
    [
        pytest.param((), True, '<span class="pass">BLESSED</span>', id="clean"),
        pytest.param(
            ("session level: effective sample size 93 (4.9% of 1,896 sessions) is below 100", "mean weight"),
            True,
            '<span class="warn">BLESSED with 2 warnings</span>',
            id="warnings",
        ),
        pytest.param(("mean weight",), False, '<span class="fail">NOT BLESSED</span>', id="failed"),
    ],
)
def test_a_blessing_with_warnings_is_not_shown_as_a_clean_one(warnings, win, expected):
    """Issue 19: the demo's page said BLESSED in green above its warnings."""
    assert _status(_report(GateConfig(), *warnings, win=win)["verdict"]) == expected


def test_the_page_shows_the_gates_settings_and_labels_a_loose_gate():
    standard = _gate_section(_report(GateConfig()))
    assert "<h2>Gate configuration</h2>" in standard and "Loose gate" not in standard
    assert "<tr><td>min_ess</td><td>1000</td><td>&gt;= 1000</td><td></td></tr>" in standard
    loose = GateConfig(min_main_lift=-0.1, min_ess=100.0, max_weight_share=0.1)
    page = _gate_section(_report(loose))
    assert '<p class="warn">Loose gate: 3 settings looser than the recommended defaults' in page
    assert "<li>min_ess 100 (recommended &gt;= 1000)</li>" in page
    assert (
        '<tr class="looser"><td>max_weight_share</td><td>0.1</td><td>&lt;= 0.01</td><td>looser</td></tr>'
        in page
    )
