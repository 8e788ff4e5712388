"""Importance-weight diagnostics: is the logged data able to say anything about the target policy?

An off-policy estimate can look precise and still rest on a few rows, or on actions the behaviour policy
almost never took. These numbers say how much: effective sample size ESS = (sum w)^2 / sum w^2 (the
rows a plain sample of the target's value would need for the same variance), weight quantiles, the largest
single weight's share of the total, and two support checks. ``mass_above_large`` is the share of the
total weight carried by weights above ``large_weight``; ``low_density_mass`` is the share carried by the
rows whose logged action had one of the lowest behaviour densities (the bottom ``low_density_quantile``
of log-propensities): if the target puts much of its mass where the behaviour policy rarely goes, the
estimate extrapolates. Session-level numbers use each session's product of weights, which is what the
sequential estimators weight by.

ESS and shares are computed from the log weights (log-sum-exp), not from the weights: a support failure
makes weights like exp(800), whose squares overflow, and that is exactly when the ESS must be right.

The ESS and weight-share lines (``min_ess``, ``max_weight_share``) are the rollout gate's own: when the
gate evaluates, ``recsys_rl.ope.gate.GateConfig.diagnostic_thresholds`` puts its settings here, and the
gate's defaults are ``MIN_ESS`` and ``MAX_WEIGHT_SHARE`` below, so a warning and a gate failure never
draw two different lines for the same number.

The result is a JSON-able dict (see ``diagnose``) with a list of human-readable warnings; an empty list
sets ``ok``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from recsys_rl.ope.estimators import importance_weights
from recsys_rl.ope.logged import LoggedSteps, group_label
from recsys_rl.ope.sequential import session_log_ratio

WEIGHT_QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: The recommended support lines (the gate's defaults): an estimate resting on fewer than a thousand
#: effective decisions (or sessions, for sequential estimators), or on one row carrying over 1% of the
#: weight, is no evidence.
MIN_ESS = 1000.0
MAX_WEIGHT_SHARE = 0.01


@dataclass(frozen=True)
class DiagnosticThresholds:
    """When a diagnostic becomes a warning."""

    min_ess: float = MIN_ESS  # effective decisions (decision level) or sessions (session level)
    max_weight_share: float = MAX_WEIGHT_SHARE  # largest single weight / total weight, at either level
    min_group_ess_fraction: float = 0.05  # a user group's decision ESS / its decisions (not gated)
    large_weight: float = 10.0  # a weight above this is "large"
    max_large_weight_mass: float = 0.2  # share of the total weight on large weights
    low_density_quantile: float = 0.01  # "rarely taken" = this bottom share of behaviour log-densities
    max_low_density_mass: float = 0.1  # share of the total weight on rarely taken actions
    max_mean_weight_deviation: float = 0.1  # |mean weight - 1|; the mean is 1 when the target has support


def _log_sum_exp(values: np.ndarray) -> float:
    """log(sum(exp(values))) without overflow; -inf for no values or all -inf (all weights zero)."""
    if values.size == 0:
        return -np.inf
    top = float(np.max(values))
    if not np.isfinite(top):
        return top
    return top + float(np.log(np.sum(np.exp(values - top))))


def _share(part: np.ndarray, log_total: float) -> float:
    """sum(exp(part)) / exp(log_total) from logs; 0 when the total weight is zero."""
    if not np.isfinite(log_total):
        return 0.0
    return float(np.exp(_log_sum_exp(part) - log_total))


def weight_summary(log_weights: np.ndarray) -> dict[str, Any]:
    """Size, mean, ESS, largest share and quantiles of the weights exp(``log_weights``).

    ESS = exp(2 logsumexp(l) - logsumexp(2 l)) and the largest share exp(max(l) - logsumexp(l)), computed
    as (sum v)^2 / sum v^2 and 1 / sum v with v = exp(l - max l) <= 1: the same numbers, exact for any
    finite log weight, and exactly n for n equal weights. ``mean``, ``max`` and the quantiles are of the
    weights as the estimators use them (capped at exp(MAX_LOG_WEIGHT), so they stay finite);
    ``max_log_weight`` is uncapped.
    """
    log_weights = np.asarray(log_weights, np.float64)
    weights = importance_weights(log_weights)
    top = float(np.max(log_weights))
    if np.isfinite(top):
        scaled = np.exp(log_weights - top)  # the largest is 1: nothing overflows
        total = float(scaled.sum())
        ess, share = total * total / float(np.square(scaled).sum()), 1.0 / total
    else:  # every weight is zero: the target never takes a logged action
        ess, share = 0.0, 1.0
    quantiles = np.quantile(weights, WEIGHT_QUANTILES)
    return {
        "count": int(weights.size),
        "mean": float(weights.mean()),
        "max": float(weights.max()),
        "max_log_weight": top if np.isfinite(top) else None,
        "ess": ess,
        "ess_fraction": ess / weights.size,
        "max_weight_share": share,
        "quantiles": {str(q): float(v) for q, v in zip(WEIGHT_QUANTILES, quantiles, strict=True)},
    }


def diagnose(
    logged: LoggedSteps, log_ratio: np.ndarray, thresholds: DiagnosticThresholds | None = None
) -> dict[str, Any]:
    """Diagnostics of the target's importance weights on ``logged``.

    Returns ``{"ok", "warnings": [str], "warnings_by_level": {"decision" | "session" | "groups": [str]},
    "thresholds": {...}, "decision": {weight_summary + "mass_above_large", "share_above_large",
    "low_density_mass"}, "session": weight_summary of per-session weight products, "groups": {group name:
    weight_summary}}``. ``warnings`` is the three lists of ``warnings_by_level`` in that order; the gate
    of a single-decision estimator leaves the session level's out of its verdict.
    """
    t = thresholds or DiagnosticThresholds()
    log_ratio = np.asarray(log_ratio, np.float64)
    log_total = _log_sum_exp(log_ratio)
    large = log_ratio > np.log(t.large_weight)
    rare = logged.behaviour_log_prob <= np.quantile(logged.behaviour_log_prob, t.low_density_quantile)
    decision = weight_summary(log_ratio)
    decision["share_above_large"] = float(large.mean())
    decision["mass_above_large"] = _share(log_ratio[large], log_total)
    decision["low_density_mass"] = _share(log_ratio[rare], log_total)
    session = weight_summary(session_log_ratio(logged, log_ratio))
    groups = {
        group_label(int(code)): weight_summary(log_ratio[logged.groups == code])
        for code in np.unique(logged.groups)
    }

    by_level: dict[str, list[str]] = {"decision": [], "session": [], "groups": []}
    for level, summary, units in (("decision", decision, "decisions"), ("session", session, "sessions")):
        # the session level is what the sequential estimators rest on; the gate reads the level of its own
        prefix = "" if level == "decision" else "session level: "
        if summary["ess"] < t.min_ess:
            by_level[level].append(
                f"{prefix}effective sample size {summary['ess']:,.0f} ({summary['ess_fraction']:.1%} of "
                f"{summary['count']:,} {units}) is below {t.min_ess:,.0f}"
            )
        if summary["max_weight_share"] > t.max_weight_share:
            by_level[level].append(
                f"{prefix}one {level} carries {summary['max_weight_share']:.1%} of the total weight "
                f"(threshold {t.max_weight_share:.1%})"
            )
    by_level["decision"].extend(_support_warnings(decision, t))
    for name, summary in groups.items():
        if summary["ess_fraction"] < t.min_group_ess_fraction:
            by_level["groups"].append(
                f"group {name}: effective sample size {summary['ess']:,.0f} is {summary['ess_fraction']:.1%} "
                f"of its {summary['count']:,} decisions (threshold {t.min_group_ess_fraction:.1%})"
            )
    warnings = [w for level in by_level.values() for w in level]
    return {
        "ok": not warnings,
        "warnings": warnings,
        "warnings_by_level": by_level,
        "thresholds": asdict(t),
        "decision": decision,
        "session": session,
        "groups": groups,
    }


def _support_warnings(decision: dict[str, Any], t: DiagnosticThresholds) -> list[str]:
    """Where the decision-level weight goes: onto large weights, onto rarely logged actions, off support."""
    warnings = []
    if decision["mass_above_large"] > t.max_large_weight_mass:
        warnings.append(
            f"weights above {t.large_weight:g} ({decision['share_above_large']:.2%} of decisions) carry "
            f"{decision['mass_above_large']:.1%} of the total weight "
            f"(threshold {t.max_large_weight_mass:.1%})"
        )
    if decision["low_density_mass"] > t.max_low_density_mass:
        warnings.append(
            f"the {t.low_density_quantile:.0%} of logged actions least likely under the behaviour policy "
            f"carry {decision['low_density_mass']:.1%} of the target's weight (threshold "
            f"{t.max_low_density_mass:.1%}): the target relies on actions the logs rarely contain"
        )
    if abs(decision["mean"] - 1.0) > t.max_mean_weight_deviation:
        warnings.append(
            f"mean importance weight is {decision['mean']:.3f}, not 1: the target puts mass outside the "
            "logged actions' support, or the weights are too heavy-tailed for this sample"
        )
    return warnings
