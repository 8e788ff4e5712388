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

The result is a JSON-able dict (see ``diagnose``) with a list of human-readable warnings; an empty list
sets ``ok``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from recsys_rl.ope.estimators import importance_weights
from recsys_rl.ope.logged import LoggedSteps, group_label
from recsys_rl.ope.sequential import cumulative_log_ratio

WEIGHT_QUANTILES = (0.5, 0.9, 0.99, 0.999)


@dataclass(frozen=True)
class DiagnosticThresholds:
    """When a diagnostic becomes a warning."""

    min_ess_fraction: float = 0.05  # decision ESS / rows, and per group
    max_weight_share: float = 0.01  # largest single weight / total weight
    large_weight: float = 10.0  # a weight above this is "large"
    max_large_weight_mass: float = 0.2  # share of the total weight on large weights
    low_density_quantile: float = 0.01  # "rarely taken" = this bottom share of behaviour log-densities
    max_low_density_mass: float = 0.1  # share of the total weight on rarely taken actions
    max_mean_weight_deviation: float = 0.1  # |mean weight - 1|; the mean is 1 when the target has support
    min_session_ess_fraction: float = 0.01  # session ESS / sessions, for the sequential estimators


def weight_summary(weights: np.ndarray) -> dict[str, Any]:
    """Size, mean, ESS, largest share and quantiles of non-negative weights."""
    total = float(weights.sum())
    squares = float(np.square(weights).sum())
    ess = total * total / squares if squares > 0 else 0.0
    quantiles = np.quantile(weights, WEIGHT_QUANTILES)
    return {
        "count": int(weights.size),
        "mean": float(weights.mean()),
        "max": float(weights.max()),
        "ess": ess,
        "ess_fraction": ess / weights.size,
        "max_weight_share": float(weights.max()) / total if total > 0 else 1.0,
        "quantiles": {str(q): float(v) for q, v in zip(WEIGHT_QUANTILES, quantiles, strict=True)},
    }


def diagnose(
    logged: LoggedSteps, log_ratio: np.ndarray, thresholds: DiagnosticThresholds | None = None
) -> dict[str, Any]:
    """Diagnostics of the target's importance weights on ``logged``.

    Returns ``{"ok", "warnings": [str], "thresholds": {...}, "decision": {weight_summary + "mass_above_large",
    "share_above_large", "low_density_mass"}, "session": weight_summary of per-session weight products,
    "groups": {group name: weight_summary}}``.
    """
    t = thresholds or DiagnosticThresholds()
    weights = importance_weights(log_ratio)
    total = weights.sum()
    large = weights > t.large_weight
    rare = logged.behaviour_log_prob <= np.quantile(logged.behaviour_log_prob, t.low_density_quantile)
    decision = weight_summary(weights)
    decision["share_above_large"] = float(large.mean())
    decision["mass_above_large"] = float(weights[large].sum() / total) if total > 0 else 0.0
    decision["low_density_mass"] = float(weights[rare].sum() / total) if total > 0 else 0.0
    final = cumulative_log_ratio(logged, log_ratio)[np.r_[logged.session_starts[1:], logged.rows] - 1]
    session = weight_summary(importance_weights(final))
    groups = {
        group_label(int(code)): weight_summary(weights[logged.groups == code])
        for code in np.unique(logged.groups)
    }

    warnings: list[str] = []
    if decision["ess_fraction"] < t.min_ess_fraction:
        warnings.append(
            f"effective sample size {decision['ess']:,.0f} is {decision['ess_fraction']:.1%} of "
            f"{decision['count']:,} decisions (threshold {t.min_ess_fraction:.1%})"
        )
    if decision["max_weight_share"] > t.max_weight_share:
        warnings.append(
            f"one decision carries {decision['max_weight_share']:.1%} of the total weight "
            f"(threshold {t.max_weight_share:.1%})"
        )
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
    if session["ess_fraction"] < t.min_session_ess_fraction:
        warnings.append(
            f"session-level effective sample size {session['ess']:,.0f} is {session['ess_fraction']:.1%} of "
            f"{session['count']:,} sessions (threshold {t.min_session_ess_fraction:.1%}): sequential "
            "estimates rest on few sessions"
        )
    for name, summary in groups.items():
        if summary["ess_fraction"] < t.min_ess_fraction:
            warnings.append(
                f"group {name}: effective sample size {summary['ess']:,.0f} is {summary['ess_fraction']:.1%} "
                f"of its {summary['count']:,} decisions"
            )
    return {
        "ok": not warnings,
        "warnings": warnings,
        "thresholds": asdict(t),
        "decision": decision,
        "session": session,
        "groups": groups,
    }
