"""The OPE report as one self-contained HTML page: plots embedded as PNG data, no external files or scripts.

A data scientist opens it from a blessing record months later, maybe offline, so it carries everything,
rendered from ``report.json`` alone (``recsys_rl.ope.evaluate``): the verdict with every reason; the
gating estimator's absolute values per signal in the signal's units (watch time in seconds, not only a
lift), with intervals; every estimator's lift beside the others (their agreement says more than any one
interval), DM and FQE marked wherever they appear, since their intervals hold the fitted model fixed and
leave its error out; the reward model's out-of-fold fit, which DM and DR rest on; the risk of the session
return distribution (variance, lower quartile, CVaR) as SCOPE-RL reports it; where the candidate's actions
moved from the logged ones; simulator ground truth beside the estimates when the logs were simulated; and
the importance-weight diagnostics. ``render_ranking`` is the page of several candidates ranked.

Plots that compare one quantity share their axes (candidate against logged actions, estimators of one
signal, candidates on the main signal); different signals keep their own scales, since a sparse signal's
lift spans tens of percent where watch time's spans one or two. The page fits a 1400-pixel window: wide
tables scroll inside their own box.
"""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never look for a display

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from recsys_rl import signals as signal_registry
from recsys_rl.ope.gate import GateConfig
from recsys_rl.ope.offline_evaluation import ESTIMATORS
from recsys_rl.state import ACTIVITY_GROUPS

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}
p,li,code{overflow-wrap:anywhere}
table{border-collapse:collapse;font-size:0.85em;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
.pass{color:#0a6b2d;font-weight:bold}.fail{color:#b00020;font-weight:bold}.warn{color:#9a5b00;font-weight:bold}
tr.looser td{background:#fff3d6}
tr.gating td{background:#e8f0fb;font-weight:bold}
tr.model-only td{color:#777;font-style:italic}
tr.truth td{background:#eaf6ea}
.table{max-width:100%;overflow-x:auto}
.note{color:#555;font-size:0.9em}
img{max-width:100%}
"""
_BLUE, _ORANGE, _GREY, _GREEN = "#4477aa", "#ee7733", "#999999", "#228833"
#: What a DM or FQE interval leaves out, shown wherever one is.
MODEL_ERROR_NOTE = "model error not included"
_SERIES_COLOURS = {"logged": _GREY, "candidate": _BLUE, "incumbent": _ORANGE, "baseline": _ORANGE}


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def _table(header: list[str], rows: list[tuple[str, list[str]]]) -> str:
    """A table whose cells are already HTML; each row comes with its class ("" for none). Wide tables
    scroll in their own box rather than widen the page."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join(
        f"<tr{f' class={chr(34)}{css}{chr(34)}' if css else ''}><td>" + "</td><td>".join(cells) + "</td></tr>"
        for css, cells in rows
    )
    return f'<div class="table"><table><tr>{head}</tr>{body}</table></div>'


def _number(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:,.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.{digits}g}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:+.2f}%"


def _with_interval(entry: dict[str, Any], percent: bool = False) -> str:
    """An entry's value and its interval, e.g. ``12.3 [11.9, 12.8]``."""
    show = _percent if percent else _number
    low, high = entry["interval"]
    return f"{show(entry['value'])} [{show(low)}, {show(high)}]"


def _with_stderr(entry: dict[str, Any], percent: bool = False) -> str:
    if entry["value"] is None:
        return "n/a"
    if percent:
        return f"{_percent(entry['value'])} ± {100 * (entry['stderr'] or 0.0):.2f}%"
    return f"{_number(entry['value'])} ± {_number(entry['stderr'], 2)}"


def scale_unit(scale: str, signal: str) -> str:
    """The unit of a value of ``signal`` on an estimator's scale: what a number in the tables means."""
    unit = signal_registry.get(signal).unit
    return f"{unit} per decision" if scale == "per_decision" else f"discounted {unit} per session"


def _estimators(report: dict[str, Any]) -> list[str]:
    """The report's estimators in the library's order: report.json sorts its keys, and the page must
    read the same from the file as from memory."""
    names = report["lift"]["estimators"]
    return sorted(names, key=lambda n: (ESTIMATORS.index(n) if n in ESTIMATORS else len(ESTIMATORS), n))


def _groups(block: dict[str, Any]) -> list[str]:
    """The user groups of a block (or diagnostics) in ``ACTIVITY_GROUPS`` order: the file sorts them."""
    order = {name: i for i, name in enumerate(ACTIVITY_GROUPS)}
    return sorted(block["groups"], key=lambda g: (order.get(g, len(order)), g))


def _scales(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ground truth's scales, in OPE's order; none without ground truth."""
    truth = report.get("ground_truth")
    if truth is None:
        return []
    return [(scale, truth["scales"][scale]) for scale in ("per_decision", "per_session_discounted")]


def _model_only(block: dict[str, Any]) -> bool:
    return not block.get("model_error_included", True)


def _estimator_label(name: str, block: dict[str, Any]) -> str:
    return f"{name} ({MODEL_ERROR_NOTE})" if _model_only(block) else name


# -- the gating estimator ----------------------------------------------------------------------------------


def _lift_plot(report: dict[str, Any], estimator: str) -> str:
    """Relative lift with its interval per signal: overall, and per user group beside it."""
    block = report["lift"]["estimators"][estimator]
    signals = report["lift"]["signals"]
    series = {"overall": block["overall"], **{g: block["groups"][g] for g in _groups(block)}}
    figure, axes = plt.subplots(1, len(signals), figsize=(2.2 * len(signals), 3.2), sharey=False)
    for axis, signal in zip(np.atleast_1d(axes), signals, strict=True):
        for x, values in enumerate(series.values()):
            entry = values[signal]["relative"]
            value, (low, high) = entry["value"], entry["interval"]
            if value is None or low is None or high is None:
                continue
            # the interval as its own line: a percentile bootstrap interval of a ratio need not contain the
            # point estimate (sparse signals, a small baseline), which error bars cannot draw
            axis.vlines(x, 100 * low, 100 * high, color=_BLUE)
            axis.plot([x], [100 * value], "o", color=_BLUE)
        axis.axhline(0.0, color="grey", linewidth=0.8)
        axis.set_title(signal, fontsize=9)
        axis.set_xticks(range(len(series)), list(series), rotation=70, fontsize=7)
        axis.tick_params(axis="y", labelsize=7)
    np.atleast_1d(axes)[0].set_ylabel("lift over baseline, %")
    figure.legend(
        [Line2D([], [], color=_BLUE, marker="o")],
        [f"{estimator}: estimate and interval"],
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        fontsize=8,
    )
    return _png(figure)


def _confidence(report: dict[str, Any]) -> str:
    return f"{100 * (1 - report['gate']['alpha']):.0f}%"


def _truth_for(report: dict[str, Any], scale: str) -> dict[str, Any] | None:
    truth = report.get("ground_truth")
    return None if truth is None else truth["scales"][scale]


def _absolute_table(report: dict[str, Any]) -> str:
    """The gating estimator's candidate and baseline values per signal, in the signal's units, with
    intervals; the simulator's truth beside each when the logs were simulated."""
    estimator = report["gate"]["estimator"]
    block = report["lift"]["estimators"][estimator]
    truth = _truth_for(report, block["scale"])
    directions = report["lift"]["directions"]
    baseline = html.escape(report["inputs"]["baseline"])
    header = ["signal", "unit", "candidate"]
    if truth:
        header.append("candidate, simulator truth")
    header.append(f"baseline ({baseline})")
    if truth:
        header.append("baseline, simulator truth")
    header += ["difference", "relative"]
    if truth:
        header.append("relative, simulator truth")
    rows = []
    for signal in report["lift"]["signals"]:
        entry = block["overall"][signal]
        arrow = "higher is better" if directions[signal] > 0 else "lower is better"
        cells = [f"{html.escape(signal)} <span class='note'>({arrow})</span>"]
        cells.append(html.escape(scale_unit(block["scale"], signal)))
        cells.append(_with_interval(entry["candidate"]))
        if truth:
            cells.append(_with_stderr(truth[signal]["candidate"]))
        cells.append(_with_interval(entry["baseline"]))
        if truth:
            cells.append(_with_stderr(truth[signal]["baseline"]))
        cells += [_with_interval(entry["difference"]), _with_interval(entry["relative"], percent=True)]
        if truth:
            cells.append(_with_stderr(truth[signal]["relative"], percent=True))
        rows.append(("", cells))
    note = (
        f"<p class='note'>{html.escape(estimator)} estimates with {_confidence(report)} "
        f"{html.escape(report['gate']['interval'])} intervals (bootstrap by "
        f"{html.escape(report['lift']['interval']['unit'])}); difference and relative are paired: both "
        "values come from the same resamples."
        + (" Simulator truth is the mean ± its standard error." if truth else "")
        + "</p>"
    )
    return _table(header, rows) + note


# -- every estimator ---------------------------------------------------------------------------------------


def agreement_figure(report: dict[str, Any]) -> Figure:
    """Every estimator's relative lift with its interval, one panel per signal; the gating estimator in
    orange, DM and FQE hollow and grey (their intervals leave the model error out), the simulator's true
    lift per scale as a green line over the estimators of that scale."""
    lift = report["lift"]
    signals, estimators = lift["signals"], lift["estimators"]
    gating = report["gate"]["estimator"]
    names = _estimators(report)
    columns = min(4, len(signals))
    rows = math.ceil(len(signals) / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(3.4 * columns, 3.0 * rows + 0.6), sharex=True, squeeze=False
    )
    for index, axis in enumerate(axes.flat):
        if index >= len(signals):
            axis.set_visible(False)
            continue
        signal = signals[index]
        for x, name in enumerate(names):
            block = estimators[name]
            entry = block["overall"][signal]["relative"]
            value, (low, high) = entry["value"], entry["interval"]
            colour = _ORANGE if name == gating else _GREY if _model_only(block) else _BLUE
            style = "--" if _model_only(block) else "-"
            if low is not None and high is not None:
                axis.vlines(x, 100 * low, 100 * high, color=colour, linestyles=style)
            if value is not None:
                face = "white" if _model_only(block) else colour
                axis.plot([x], [100 * value], "o", color=colour, markerfacecolor=face)
        for scale, truth in _scales(report):
            value = truth[signal]["relative"]["value"]
            xs = [x for x, name in enumerate(names) if estimators[name]["scale"] == scale]
            if value is not None and xs:
                axis.hlines(100 * value, min(xs) - 0.4, max(xs) + 0.4, color=_GREEN, linewidth=2)
        axis.axhline(0.0, color="grey", linewidth=0.8)
        axis.set_title(signal, fontsize=9)
        axis.set_xticks(range(len(names)), names, rotation=70, fontsize=7)
        for label in axis.get_xticklabels():
            if label.get_text() == gating:
                label.set_fontweight("bold")
        axis.tick_params(axis="y", labelsize=7)
        axis.tick_params(axis="x", labelbottom=True)
        if index % columns == 0:
            axis.set_ylabel("lift over baseline, %", fontsize=8)
    handles = [
        Line2D([], [], color=_ORANGE, marker="o", label=f"gating estimator ({gating})"),
        Line2D([], [], color=_BLUE, marker="o", label="other estimators"),
        Line2D(
            [], [], color=_GREY, marker="o", markerfacecolor="white", linestyle="--", label=MODEL_ERROR_NOTE
        ),
    ]
    if report.get("ground_truth"):
        handles.append(Line2D([], [], color=_GREEN, linewidth=2, label="simulator truth (per scale)"))
    figure.legend(
        handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles), fontsize=8
    )
    figure.tight_layout()
    return figure


def _estimator_table(report: dict[str, Any]) -> str:
    """Every estimator's overall relative lift with its interval per signal; the gating one highlighted,
    DM and FQE labelled as leaving the model error out, and the simulator's truth per scale below."""
    signals = report["lift"]["signals"]
    gating = report["gate"]["estimator"]
    rows = []
    for name in _estimators(report):
        block = report["lift"]["estimators"][name]
        cells = []
        for signal in signals:
            entry = block["overall"][signal]["relative"]
            cells.append("n/a" if entry["value"] is None else _with_interval(entry, percent=True))
        interval = f"sampling only: {MODEL_ERROR_NOTE}" if _model_only(block) else "sampling and model"
        label = html.escape(_estimator_label(name, block)) + (" (gating)" if name == gating else "")
        css = "gating" if name == gating else "model-only" if _model_only(block) else ""
        rows.append((css, [label, html.escape(block["scale"]), interval, *cells]))
    for scale, truth in _scales(report):
        cells = [_with_stderr(truth[signal]["relative"], percent=True) for signal in signals]
        rows.append(("truth", ["simulator truth", html.escape(scale), "standard error", *cells]))
    header = ["estimator", "scale", "interval covers", *(html.escape(s) for s in signals)]
    return _table(header, rows)


def _reward_fit_table(report: dict[str, Any]) -> str:
    fit = report["lift"].get("reward_model_fit")
    if fit is None:
        return "<p>No estimator fitted a reward model.</p>"
    rows = []
    for signal in report["lift"]["signals"]:
        figures = fit["signals"][signal]
        unit = scale_unit("per_decision", signal)
        rows.append(
            (
                "",
                [
                    html.escape(signal),
                    _number(figures["r2"], 3),
                    f"{_number(figures['rmse'])} {html.escape(unit)}",
                    f"{_number(figures['mean_reward'])} {html.escape(unit)}",
                ],
            )
        )
    note = (
        "<p class='note'>Out of fold: each row predicted by a model not fitted to it. DM is only as good as "
        "this fit; DR stays unbiased whatever it is, but its variance grows with the model's error. The "
        "model is fitted to the logged actions, so it is the same for every policy evaluated on these "
        "logs.</p>"
    )
    return _table(["signal", "R²", "RMSE", "mean reward"], rows) + note


# -- risk ------------------------------------------------------------------------------------------------

_RISK_FIGURES = (("mean", "mean"), ("lower_quartile", "lower quartile"), ("cvar", "CVaR"))


def _risk_section(report: dict[str, Any]) -> str:
    risk = report["lift"].get("risk")
    if not risk:
        return "<p>No return distribution in this report.</p>"
    candidate, baseline = risk["candidate"], risk["baseline"]
    cvar = f"CVaR {100 * candidate['cvar_alpha']:.0f}%"
    quartile = f"{100 * candidate['lower_quantile']:.0f}% quantile"
    rows = []
    for signal in report["lift"]["signals"]:
        figures, base = candidate["signals"][signal], baseline["signals"][signal]
        unit = html.escape(scale_unit("per_session_discounted", signal))
        for policy, values in (("candidate", figures), (f"baseline ({report['inputs']['baseline']})", base)):
            rows.append(
                (
                    "",
                    [
                        html.escape(signal),
                        html.escape(policy),
                        _number(values["mean"]),
                        _number(values["variance"]),
                        _number(math.sqrt(max(values["variance"], 0.0))),
                        _number(values["lower_quartile"]),
                        _number(values["cvar"]),
                        unit,
                    ],
                )
            )
    header = ["signal", "policy", "mean", "variance", "standard deviation", quartile, cvar, "unit"]
    note = (
        f"<p class='note'>The distribution of a session's discounted return under each policy: the logged "
        f"returns re-weighted by each session's importance weight (self-normalised). {cvar} is the mean "
        f"return of the worst {100 * candidate['cvar_alpha']:.0f}% of sessions. Point estimates: as fragile "
        "as the session-level effective sample size below says.</p>"
    )
    return _png(risk_figure(report)) + _table(header, rows) + note


def risk_figure(report: dict[str, Any]) -> Figure:
    """Mean, lower quartile and CVaR of the session return, candidate beside baseline on one axis per
    signal."""
    risk = report["lift"]["risk"]
    signals = report["lift"]["signals"]
    columns = min(4, len(signals))
    rows = math.ceil(len(signals) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows + 0.5), squeeze=False)
    series = (("candidate", risk["candidate"], _BLUE), ("baseline", risk["baseline"], _ORANGE))
    for index, axis in enumerate(axes.flat):
        if index >= len(signals):
            axis.set_visible(False)
            continue
        signal = signals[index]
        for offset, (_, values, colour) in zip((-0.18, 0.18), series, strict=True):
            heights = [values["signals"][signal][key] for key, _ in _RISK_FIGURES]
            axis.bar(np.arange(len(_RISK_FIGURES)) + offset, heights, width=0.36, color=colour)
        axis.set_xticks(range(len(_RISK_FIGURES)), [label for _, label in _RISK_FIGURES], fontsize=7)
        axis.set_title(signal, fontsize=9)
        axis.tick_params(axis="y", labelsize=7)
        if index % columns == 0:
            axis.set_ylabel("discounted session return", fontsize=8)
    handles = [Line2D([], [], color=colour, linewidth=6, label=name) for name, _, colour in series]
    figure.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8)
    figure.tight_layout()
    return figure


# -- actions -------------------------------------------------------------------------------------------


def _actions_section(report: dict[str, Any]) -> str:
    actions = report.get("actions")
    if not actions:
        return "<p>No action distributions in this report.</p>"
    levels = actions["quantile_levels"]
    rows = []
    for name in actions["names"]:
        dimension = actions["dimensions"][name]
        for series in actions["series"]:
            cells = [html.escape(name), html.escape(series), _number(dimension["mean"][series])]
            cells.append(_number(dimension["std"][series]))
            cells += [_number(q) for q in dimension["quantiles"][series]]
            rows.append(("", cells))
    header = ["dimension", "actions", "mean", "standard deviation", *(f"q{100 * q:g}" for q in levels)]
    what = (
        "the share of decisions that insert a live stream is the mean"
        if actions["kind"] == "binary"
        else "each dimension is the logit of one signal's fusion weight"
    )
    note = (
        f"<p class='note'>Logged: the behaviour's actions in the logs. Candidate"
        f"{' and incumbent' if 'incumbent' in actions['series'] else ''}: one action drawn at each of the "
        f"{actions['states']:,} logged states (seed {actions['seed']}); {what}.</p>"
    )
    return _png(actions_figure(actions)) + _table(header, rows) + note


def actions_figure(actions: dict[str, Any]) -> Figure:
    """Per dimension, every series' histogram over shared bins; logits share one x axis (one unit), and
    all panels count the same states, so they share the y axis too. A 0/1 insert is one bar per series."""
    series = actions["series"]
    dimensions = actions["dimensions"]
    if actions["kind"] == "binary":
        figure, axis = plt.subplots(figsize=(5, 3))
        for x, name in enumerate(series):
            for dimension in dimensions.values():  # the one dimension, insert
                axis.bar(x, 100 * dimension["mean"][name], color=_SERIES_COLOURS.get(name, _BLUE), label=name)
        axis.set_xticks(range(len(series)), series)
        axis.set_ylabel("decisions inserting a live stream, %")
        axis.legend(fontsize=8)
        return figure
    names = actions["names"]
    columns = min(4, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(3.2 * columns, 2.4 * rows + 0.5), sharex=True, sharey=True, squeeze=False
    )
    for index, axis in enumerate(axes.flat):
        if index >= len(names):
            axis.set_visible(False)
            continue
        dimension = dimensions[names[index]]
        edges = np.asarray(dimension["edges"])
        for name in series:
            counts = np.asarray(dimension["counts"][name], float)
            axis.stairs(
                counts / max(counts.sum(), 1.0), edges, color=_SERIES_COLOURS.get(name, _BLUE), label=name
            )
        axis.set_title(f"{names[index]} weight", fontsize=9)
        axis.tick_params(labelsize=7)
        axis.tick_params(axis="x", labelbottom=True)
    axes[0][0].set_ylabel("share of states", fontsize=8)
    handles = [Line2D([], [], color=_SERIES_COLOURS.get(name, _BLUE), label=name) for name in series]
    figure.legend(
        handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(series), fontsize=8
    )
    figure.supxlabel("fusion-weight logit", fontsize=8)
    figure.tight_layout()
    return figure


# -- ground truth -------------------------------------------------------------------------------------


def _ground_truth_section(report: dict[str, Any]) -> str:
    truth = report.get("ground_truth")
    if truth is None:
        return ""
    world = truth["world"]
    check = truth["world_check"]
    if check["passed"]:
        status = (
            f"<p class='pass'>World check passed: the behaviour policy in this world gives "
            f"{_with_stderr(check['behaviour_truth'])} {html.escape(check['signal'])} per decision; the logs "
            f"{_with_stderr(check['logged'])} ({_number(check['z'], 2)} standard errors apart).</p>"
        )
    else:
        status = (
            f"<p class='fail'>World check failed: the behaviour policy in this world gives "
            f"{_with_stderr(check['behaviour_truth'])} {html.escape(check['signal'])} per decision, the logs "
            f"{_with_stderr(check['logged'])} ({_number(check['z'], 2)} standard errors apart, limit "
            f"{check['limit']:g}): the declared world (or the logging policy) is not the one that wrote "
            "these logs, and the truth here is not theirs.</p>"
        )
    return (
        f"<h2>Simulator ground truth</h2><p>World of {world['users']:,} users, seed {world['seed']}, "
        f"{world['days']} day{'s' if world['days'] > 1 else ''}; {world['repeats']} fresh episode seeds "
        f"({world['episode_seed']} to {world['episode_seed'] + world['repeats'] - 1}) pooled, "
        f"{truth['sessions']['candidate']:,} candidate sessions. "
        f"{html.escape(truth['declared'][0].upper() + truth['declared'][1:])}. Rewards: "
        f"{html.escape(truth['rewards'])}. The truth sits beside the estimates in the tables and charts "
        f"above.</p>{status}"
    )


# -- importance weights -------------------------------------------------------------------------------


def _weights_plot(histogram: dict[str, Any]) -> str:
    figure, axis = plt.subplots(figsize=(6, 3))
    edges = np.asarray(histogram["log10_edges"])
    if edges.size:
        axis.stairs(histogram["counts"], edges, fill=True, color=_BLUE, label="candidate")
        axis.legend(fontsize=8)
    axis.set_xlabel("log10 importance weight of the candidate")
    axis.set_ylabel("logged decisions")
    return _png(figure)


def _ess_plot(diagnostics: dict[str, Any]) -> str:
    groups = _groups(diagnostics)
    names = ["all", *groups]
    fractions = [
        diagnostics["decision"]["ess_fraction"],
        *(diagnostics["groups"][g]["ess_fraction"] for g in groups),
    ]
    figure, axis = plt.subplots(figsize=(6, 2.8))
    axis.bar(names, [100 * f for f in fractions], color="#66aa55", label="candidate, decision level")
    axis.set_ylabel("ESS, % of decisions")
    axis.tick_params(axis="x", labelsize=7, rotation=30)
    axis.legend(fontsize=8)
    return _png(figure)


# -- verdict -------------------------------------------------------------------------------------------


def _status(verdict: dict[str, Any]) -> str:
    """The headline, coloured: green only for a clean blessing, amber for one with warnings."""
    style = "fail" if not verdict["passed"] else "warn" if verdict["warnings"] else "pass"
    return f'<span class="{style}">{html.escape(verdict["headline"])}</span>'


def verdict_line(verdict: dict[str, Any]) -> str:
    """The verdict in one line of text: its headline (which counts the warnings) and, when the gate is
    looser than the recommended one, how many settings are: "BLESSED" alone would overstate both."""
    loose = verdict.get("loose_settings") or []
    if not loose:
        return verdict["headline"]
    return (
        f"{verdict['headline']} by a LOOSE gate ({len(loose)} setting{'s' if len(loose) > 1 else ''} looser)"
    )


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


def _excluded(report: dict[str, Any]) -> str:
    excluded = report["lift"].get("excluded") or {}
    if not excluded:
        return ""
    parts = ", ".join(
        f"{counts['sessions']:,} sessions ({counts['decisions']:,} decisions): {html.escape(reason)}"
        for reason, counts in excluded.items()
    )
    return f"<p class='warn'>Left out of the logs before estimation: {parts}.</p>"


def render(report: dict[str, Any]) -> str:
    """The page for ``report`` (see ``recsys_rl.ope.evaluate``), from the report alone."""
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
    weights = report.get("importance_weights")
    weights_plot = _weights_plot(weights) if weights else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>OPE report: {candidate}</title>
<style>{_STYLE}</style></head><body>
<h1>Offline evaluation: {candidate} vs {baseline}</h1>
<p>{status} by the gate on <b>{html.escape(estimator)}</b> with {html.escape(gate["interval"])} intervals at
{_confidence(report)} ({gate["resamples"]} resamples by {html.escape(report["lift"]["interval"]["unit"])}) on
dataset <code>{html.escape(inputs["dataset"]["version"])}</code>: {report["lift"]["rows"]:,} decisions in
{report["lift"]["sessions"]:,} sessions.
Candidate policy sha256 <code>{inputs["candidate"]["policy_sha256"]}</code>.</p>
{_excluded(report)}{why_not}{gated}
<h2>Gate checks</h2><ul>{checks}</ul>
{_gate_section(report)}
<h2>Values per signal ({html.escape(estimator)})</h2>{_absolute_table(report)}
<h2>Lift per signal and user group ({html.escape(estimator)})</h2>{_lift_plot(report, estimator)}
<h2>Estimator agreement (overall relative lift and interval)</h2>{_png(agreement_figure(report))}
<p class="note">DM and FQE are a fitted model's prediction alone: their bootstrap holds the model fixed,
so their intervals leave its error out ({MODEL_ERROR_NOTE}) and no gate may use them.</p>
{_estimator_table(report)}
<h2>Reward model fit</h2>{_reward_fit_table(report)}
<h2>Risk: the session-return distribution</h2>{_risk_section(report)}
<h2>Actions: candidate against logged</h2>{_actions_section(report)}
{_ground_truth_section(report)}
<h2>Importance weights</h2>{weights_plot}
<p>Effective sample size {decision["ess"]:,.0f} ({decision["ess_fraction"]:.1%} of decisions);
largest single weight share {decision["max_weight_share"]:.4f}.</p>
{_ess_plot(diagnostics)}
<h2>Diagnostic warnings</h2><ul>{warnings}</ul>
<p>Created {html.escape(report["created_at"])} by recsys-rl evaluate.</p>
</body></html>
"""


# -- several candidates --------------------------------------------------------------------------------


def ranking_figure(ranking: dict[str, Any]) -> Figure:
    """Each candidate's main-signal relative lift with its interval, in rank order on one axis, with the
    simulator's true lift where known."""
    entries = ranking["candidates"]
    figure, axis = plt.subplots(figsize=(max(4.0, 1.1 * len(entries) + 2), 3.2))
    truth_shown = False
    for x, entry in enumerate(entries):
        relative = entry["main"]["relative"]
        low, high = relative["interval"]
        colour = _GREEN if entry["passed"] else "#b00020"
        if low is not None and high is not None:
            axis.vlines(x, 100 * low, 100 * high, color=colour)
        if relative["value"] is not None:
            axis.plot([x], [100 * relative["value"]], "o", color=colour)
        truth = entry.get("truth")
        if truth and truth["relative"]["value"] is not None:
            axis.plot([x], [100 * truth["relative"]["value"]], "x", color="black", markersize=8)
            truth_shown = True
    axis.axhline(0.0, color="grey", linewidth=0.8)
    gate = ranking["gate"]["min_main_lift"]
    axis.axhline(100 * gate, color="black", linestyle=":", linewidth=1)
    axis.set_xticks(
        range(len(entries)), [f"{e['rank']}. {_name(e)}" for e in entries], rotation=30, fontsize=7
    )
    axis.set_ylabel(f"{ranking['main_signal']} lift over baseline, %", fontsize=8)
    handles = [
        Line2D([], [], color=_GREEN, marker="o", label="blessed"),
        Line2D([], [], color="#b00020", marker="o", label="not blessed"),
        Line2D([], [], color="black", linestyle=":", label=f"gate's minimum lift ({100 * gate:+g}%)"),
    ]
    if truth_shown:
        handles.append(Line2D([], [], color="black", marker="x", linestyle="", label="simulator truth"))
    axis.legend(handles=handles, fontsize=8)
    return figure


def _name(entry: dict[str, Any]) -> str:
    """A ranked candidate's name: its directory's, which is its version made unique."""
    return entry["directory"].rsplit("/", 1)[-1]


def render_ranking(ranking: dict[str, Any]) -> str:
    """The page of several candidates ranked (``recsys_rl.ope.evaluate.rank``), linking each one's report."""
    main, unit = ranking["main_signal"], scale_unit(ranking["scale"], ranking["main_signal"])
    truth_column = any(e.get("truth") for e in ranking["candidates"])
    rows = []
    for entry in ranking["candidates"]:
        style = "fail" if not entry["passed"] else "warn" if entry["warnings"] else "pass"
        link = f"{html.escape(entry['directory'])}/report.html"
        cells = [
            str(entry["rank"]),
            f'<a href="{link}">{html.escape(_name(entry))}</a>',
            f'<span class="{style}">{html.escape(entry["headline"])}</span>',
            _percent(entry["lower_bound"]),
            _with_interval(entry["main"]["relative"], percent=True),
            _with_interval(entry["main"]["candidate"]),
        ]
        if truth_column:
            truth = entry.get("truth")
            cells.append("n/a" if not truth else _with_stderr(truth["relative"], percent=True))
        cells.append(f"<code>{entry['policy_sha256'][:12]}</code>")
        rows.append(("", cells))
    header = [
        "rank",
        "candidate",
        "verdict",
        "lower bound",
        "relative lift",
        f"{html.escape(main)} ({html.escape(unit)})",
    ]
    if truth_column:
        header.append("relative lift, simulator truth")
    header.append("policy sha256")
    loose = ranking["loose_settings"]
    loose_note = (
        f'<p class="warn">Loose gate: {len(loose)} setting{"s" if len(loose) > 1 else ""} looser than the '
        "recommended defaults.</p>"
        if loose
        else ""
    )
    check = ranking.get("world_check")
    world = ""
    if check is not None and not check["passed"]:
        world = (
            "<p class='fail'>World check failed: the declared simulated world does not reproduce the "
            "logs.</p>"
        )
    reasons = "".join(
        f"<li>{entry['rank']}. {html.escape(_name(entry))}: {html.escape(reason)}</li>"
        for entry in ranking["candidates"]
        for reason in entry["reasons"]
    )
    why_not = f"<h2>Why not blessed</h2><ul>{reasons}</ul>" if reasons else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>OPE ranking: {len(ranking["candidates"])} candidates</title>
<style>{_STYLE}</style></head><body>
<h1>Offline evaluation: {len(ranking["candidates"])} candidates vs {html.escape(ranking["baseline"])}</h1>
<p>Ranked by the {html.escape(ranking["ranked_by"])}, on dataset
<code>{html.escape(ranking["dataset"]["version"])}</code>, all with bootstrap seed {ranking["seed"]}, so their
intervals are comparable. Each candidate's full report, and the blessing the registry attaches, is in its
own directory.</p>
{loose_note}{world}
{_table(header, rows)}
{_png(ranking_figure(ranking))}
{why_not}
<p>Created {html.escape(ranking["created_at"])} by recsys-rl evaluate.</p>
</body></html>
"""
