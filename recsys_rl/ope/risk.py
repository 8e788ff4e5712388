"""Risk of a policy: the distribution of its session returns, not only their mean (as in SCOPE-RL).

Two policies with the same expected watch time can differ in how often a session goes badly, and a
rollout should see that. Following SCOPE-RL's cumulative-distribution OPE (Kiyohara et al. 2023, the
self-normalised trajectory-wise importance sampling estimator of Chandak et al. 2021), the target's
distribution of a session's discounted return G is the logged returns re-weighted by each session's
importance weight (the product of its decisions' ratios):

    F(t) = sum_i w_i 1{G_i <= t} / sum_i w_i

and from it the mean, the variance, the lower quartile (the return a quarter of sessions stay below) and
CVaR at ``alpha`` (the mean return of the worst ``alpha`` share of sessions). With every weight 1 this is
the logged sessions' own distribution. Point estimates: the same weights make them as fragile as the
session-level effective sample size in the diagnostics says.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recsys_rl.ope.estimators import importance_weights
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.sequential import default_gammas, on_policy_return, session_log_ratio

#: The tail whose mean is CVaR: the worst tenth of sessions.
CVAR_ALPHA = 0.1
LOWER_QUANTILE = 0.25


def session_weights(logged: LoggedSteps, log_ratio: np.ndarray | None) -> np.ndarray:
    """Each session's importance weight (the product of its ratios); ones for the logging policy."""
    if log_ratio is None:
        return np.ones(logged.sessions)
    return importance_weights(session_log_ratio(logged, log_ratio))


def weighted_quantile(values: np.ndarray, weights: np.ndarray, level: float) -> float:
    """inf{t : F(t) >= level} of the weighted distribution of ``values``."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(int(np.searchsorted(cumulative, level)), values.size - 1)])


def conditional_value_at_risk(values: np.ndarray, weights: np.ndarray, alpha: float) -> float:
    """The mean of the lowest ``alpha`` of the weighted distribution's mass (the boundary value taken in
    part, so the tail holds exactly ``alpha``)."""
    order = np.argsort(values, kind="stable")
    mass = weights[order] / weights.sum()
    taken = np.clip(alpha - (np.cumsum(mass) - mass), 0.0, mass)
    return float((taken * values[order]).sum() / alpha)


def return_distribution(logged: LoggedSteps, log_ratio: np.ndarray | None) -> dict[str, Any]:
    """Per signal: mean, variance, lower quartile and CVaR of the session return under the target
    (``log_ratio`` its per-decision log ratios; None for the logging policy itself)."""
    weights = session_weights(logged, log_ratio)
    if not np.isfinite(weights.sum()) or weights.sum() <= 0:
        raise ValueError("the session weights sum to zero or overflow: the logs do not support this policy")
    terms = on_policy_return(logged, default_gammas(logged))
    returns = terms.numerator[:, 0, :] / terms.denominator[:, :1]
    out = {}
    for i, signal in enumerate(logged.signals):
        g = returns[:, i]
        mean = float(np.average(g, weights=weights))
        out[signal] = {
            "mean": mean,
            "variance": float(np.average(np.square(g - mean), weights=weights)),
            "lower_quartile": weighted_quantile(g, weights, LOWER_QUANTILE),
            "cvar": conditional_value_at_risk(g, weights, CVAR_ALPHA),
        }
    return {"cvar_alpha": CVAR_ALPHA, "lower_quantile": LOWER_QUANTILE, "signals": out}
