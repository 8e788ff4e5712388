"""The OPE report's lift plot draws whatever intervals the estimators give."""

from __future__ import annotations

from recsys_rl.ope.report import _lift_plot


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
