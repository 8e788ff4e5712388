"""The OPE report as one self-contained HTML page: plots embedded as PNG data, no external files or scripts.

A data scientist opens it from a blessing record months later, maybe offline, so it carries everything:
the verdict with every reason, the gate's estimator with intervals per signal and user group, the
importance-weight distribution, the effective sample sizes, and a table of every estimator.
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never look for a display

import matplotlib.pyplot as plt
import numpy as np

from recsys_rl.ope.gate import GateConfig

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;font-size:0.85em;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
.pass{color:#0a6b2d;font-weight:bold}.fail{color:#b00020;font-weight:bold}.warn{color:#9a5b00;font-weight:bold}
tr.looser td{background:#fff3d6}
img{max-width:100%}
"""


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _lift_plot(report: dict[str, Any], estimator: str) -> str:
    """Relative lift with its interval per signal: overall, and per user group beside it."""
    block = report["lift"]["estimators"][estimator]
    signals = report["lift"]["signals"]
    series = {"overall": block["overall"], **block["groups"]}
    figure, axes = plt.subplots(1, len(signals), figsize=(2.2 * len(signals), 3.2), sharey=False)
    for axis, signal in zip(np.atleast_1d(axes), signals, strict=True):
        for x, values in enumerate(series.values()):
            entry = values[signal]["relative"]
            value, (low, high) = entry["value"], entry["interval"]
            if value is None or low is None or high is None:
                continue
            # the interval as its own line: a percentile bootstrap interval of a ratio need not contain the
            # point estimate (sparse signals, a small baseline), which error bars cannot draw
            axis.vlines(x, 100 * low, 100 * high, color="#4477aa")
            axis.plot([x], [100 * value], "o", color="#4477aa")
        axis.axhline(0.0, color="grey", linewidth=0.8)
        axis.set_title(signal, fontsize=9)
        axis.set_xticks(range(len(series)), list(series), rotation=70, fontsize=7)
        axis.tick_params(axis="y", labelsize=7)
    np.atleast_1d(axes)[0].set_ylabel("lift over baseline, %")
    return _png(figure)


def _weights_plot(log_ratio: np.ndarray) -> str:
    figure, axis = plt.subplots(figsize=(6, 3))
    axis.hist(log_ratio / np.log(10.0), bins=60, color="#4477aa")
    axis.set_xlabel("log10 importance weight of the candidate")
    axis.set_ylabel("logged decisions")
    return _png(figure)


def _ess_plot(diagnostics: dict[str, Any]) -> str:
    groups = diagnostics["groups"]
    names = ["all", *groups]
    fractions = [diagnostics["decision"]["ess_fraction"], *(g["ess_fraction"] for g in groups.values())]
    figure, axis = plt.subplots(figsize=(6, 2.8))
    axis.bar(names, [100 * f for f in fractions], color="#66aa55")
    axis.set_ylabel("ESS, % of decisions")
    axis.tick_params(axis="x", labelsize=7, rotation=30)
    return _png(figure)


def _estimator_table(report: dict[str, Any]) -> str:
    signals = report["lift"]["signals"]
    rows = []
    for name, block in report["lift"]["estimators"].items():
        cells = []
        for signal in signals:
            entry = block["overall"][signal]["relative"]
            low, high = entry["interval"]
            value = entry["value"]
            cells.append(
                "n/a" if value is None else f"{100 * value:+.2f}% [{_percent(low)}, {_percent(high)}]"
            )
        rows.append(
            f"<tr><td>{html.escape(name)} ({block['scale']})</td><td>"
            + "</td><td>".join(cells)
            + "</td></tr>"
        )
    header = "".join(f"<th>{html.escape(s)}</th>" for s in signals)
    return f"<table><tr><th>estimator</th>{header}</tr>{''.join(rows)}</table>"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.2f}%"


def _status(verdict: dict[str, Any]) -> str:
    """The headline, coloured: green only for a clean blessing, amber for one with warnings."""
    style = "fail" if not verdict["passed"] else "warn" if verdict["warnings"] else "pass"
    return f'<span class="{style}">{html.escape(verdict["headline"])}</span>'


def _gate_section(report: dict[str, Any]) -> str:
    """The gate's configuration beside the recommended one, and a loose gate labelled as such."""
    verdict = report["verdict"]
    loose = verdict["loose_settings"]
    label = ""
    if loose:
        items = "".join(f"<li>{html.escape(s)}</li>" for s in loose)
        label = (
            f'<p class="warn">Loose gate: {len(loose)} setting{"s" if len(loose) > 1 else ""} looser than '
            f"the recommended defaults; a blessing here is weaker evidence than a standard gate's.</p>"
            f"<ul>{items}</ul>"
        )
    rows = []
    for setting in GateConfig(**report["gate"]).settings():
        cells = (setting.name, setting.value, setting.recommended, "looser" if setting.looser else "")
        marked = ' class="looser"' if setting.looser else ""
        rows.append(f"<tr{marked}><td>" + "</td><td>".join(html.escape(c) for c in cells) + "</td></tr>")
    table = (
        f"<table><tr><th>setting</th><th>value</th><th>recommended</th><th></th></tr>{''.join(rows)}</table>"
    )
    return f"<h2>Gate configuration</h2>{label}{table}"


def render(report: dict[str, Any], log_ratio: np.ndarray) -> str:
    """The page for ``report`` (see ``recsys_rl.ope.evaluate``) and the candidate's log-weights."""
    verdict = report["verdict"]
    gate = report["gate"]
    estimator = gate["estimator"]
    diagnostics = report["lift"]["diagnostics"]["candidate"]
    status = _status(verdict)
    if verdict["loose_settings"]:
        status += ' <span class="warn">(loose gate)</span>'
    checks = "".join(f"<li>{html.escape(c)}</li>" for c in verdict["checks"])
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in verdict["reasons"])
    why_not = f"<h2>Why not blessed</h2><ul>{reasons}</ul>" if reasons else ""
    gated = "".join(f"<li>{html.escape(w)}</li>" for w in verdict["warnings"])
    gated = f"<h2>Warnings on the gate's evidence</h2><ul>{gated}</ul>" if gated else ""
    every = [
        f"{policy}: {w}"
        for policy, key in (("candidate", "candidate"), ("incumbent", "baseline"))
        for w in (report["lift"]["diagnostics"][key] or {"warnings": []})["warnings"]
    ]
    warnings = "".join(f"<li>{html.escape(w)}</li>" for w in every) or "<li>none</li>"
    inputs = report["inputs"]
    candidate, baseline = html.escape(inputs["candidate"]["version"]), html.escape(inputs["baseline"])
    decision = diagnostics["decision"]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>OPE report: {html.escape(inputs["candidate"]["version"])}</title>
<style>{_STYLE}</style></head><body>
<h1>Offline evaluation: {candidate} vs {baseline}</h1>
<p>{status} by the gate on <b>{html.escape(estimator)}</b> with {html.escape(gate["interval"])} intervals at
{100 * (1 - gate["alpha"]):.0f}% ({gate["resamples"]} resamples by session) on dataset
<code>{html.escape(inputs["dataset"]["version"])}</code>: {report["lift"]["rows"]:,} decisions in
{report["lift"]["sessions"]:,} sessions.
Candidate policy sha256 <code>{inputs["candidate"]["policy_sha256"]}</code>.</p>
{why_not}{gated}
<h2>Gate checks</h2><ul>{checks}</ul>
{_gate_section(report)}
<h2>Lift per signal and user group ({html.escape(estimator)})</h2>{_lift_plot(report, estimator)}
<h2>All estimators (overall relative lift and interval)</h2>{_estimator_table(report)}
<h2>Importance weights</h2>{_weights_plot(log_ratio)}
<p>Effective sample size {decision["ess"]:,.0f} ({decision["ess_fraction"]:.1%} of decisions);
largest single weight share {decision["max_weight_share"]:.4f}.</p>
{_ess_plot(diagnostics)}
<h2>Diagnostic warnings</h2><ul>{warnings}</ul>
<p>Created {html.escape(report["created_at"])} by recsys-rl evaluate.</p>
</body></html>
"""
