"""Single-decision off-policy estimators, every signal at once, as per-row ratio terms.

Each function returns ``RatioTerms`` whose ``value()`` is the textbook estimate (S,) over the rows it is
given; summing the terms over sessions first (``RatioTerms.sum_by``) leaves the value unchanged and lets
``recsys_rl.ope.intervals`` resample whole sessions. With importance weights w_i = pi(a_i|s_i) /
mu(a_i|s_i), rewards r_i, a reward model's prediction q_i = q(s_i, a_i) for the logged action and its
expectation v_i = E_{a~pi(s_i)} q(s_i, a) under the target:

* IPS          mean(w r)
* clipped IPS  mean(min(w, cap) r)
* NCIS         sum(min(w, cap) r) / sum(min(w, cap))   (normalised capped IS, the TSCAC paper's)
* SNIPS        sum(w r) / sum(w)
* DM           mean(v)
* DR           mean(v + w (r - q))
* SNDR         mean(v) + sum(w (r - q)) / sum(w)
* Switch-DR    mean(v + 1[w <= tau] w (r - q)): the DR correction where the weight is at most tau, the
               model alone where it is larger (Wang, Agarwal & Dudik 2017, in the form that needs only
               the logged action's weight, which is all continuous actions allow)
"""

from __future__ import annotations

import numpy as np

from recsys_rl.ope.terms import RatioTerms

#: log of the largest importance weight kept as is: exp(600) ~ 1e260 still sums over a billion rows
#: times any reward without overflowing; anything near it is a support failure the diagnostics report.
MAX_LOG_WEIGHT = 600.0


def log_importance_ratio(target_log_prob: np.ndarray, behaviour_log_prob: np.ndarray) -> np.ndarray:
    """log w = log pi - log mu, refusing NaN or +inf (a logged action the behaviour could not take)."""
    log_ratio = np.asarray(target_log_prob, np.float64) - np.asarray(behaviour_log_prob, np.float64)
    bad = np.isnan(log_ratio) | (log_ratio == np.inf)
    if np.any(bad):
        raise ValueError(
            f"{int(bad.sum())} of {bad.size} log importance ratios are NaN or +inf: a target log-density is "
            "NaN, or a logged log-propensity is -inf or NaN"
        )
    return log_ratio


def importance_weights(log_ratio: np.ndarray) -> np.ndarray:
    """exp(log ratio), computed from the difference of logs (never a ratio of densities) and capped at
    exp(MAX_LOG_WEIGHT) so sums cannot overflow; a target density of zero gives weight 0."""
    return np.exp(np.minimum(log_ratio, MAX_LOG_WEIGHT))


def ips(rewards: np.ndarray, weights: np.ndarray) -> RatioTerms:
    return RatioTerms.mean(weights[:, None] * rewards)


def clipped_ips(rewards: np.ndarray, weights: np.ndarray, cap: float) -> RatioTerms:
    return RatioTerms.mean(np.minimum(weights, cap)[:, None] * rewards)


def ncis(rewards: np.ndarray, weights: np.ndarray, cap: float) -> RatioTerms:
    capped = np.minimum(weights, cap)
    return RatioTerms((capped[:, None] * rewards)[:, None, :], capped[:, None])


def snips(rewards: np.ndarray, weights: np.ndarray) -> RatioTerms:
    return RatioTerms((weights[:, None] * rewards)[:, None, :], weights[:, None].astype(np.float64))


def dm(v_target: np.ndarray) -> RatioTerms:
    return RatioTerms.mean(v_target)


def dr(rewards: np.ndarray, weights: np.ndarray, q_logged: np.ndarray, v_target: np.ndarray) -> RatioTerms:
    return RatioTerms.mean(v_target + weights[:, None] * (rewards - q_logged))


def sndr(rewards: np.ndarray, weights: np.ndarray, q_logged: np.ndarray, v_target: np.ndarray) -> RatioTerms:
    correction = weights[:, None] * (rewards - q_logged)
    return RatioTerms(
        np.stack([v_target, correction], axis=1), np.column_stack([np.ones(weights.size), weights])
    )


def switch_dr(
    rewards: np.ndarray, weights: np.ndarray, q_logged: np.ndarray, v_target: np.ndarray, tau: float
) -> RatioTerms:
    switched = np.where(weights <= tau, weights, 0.0)
    return RatioTerms.mean(v_target + switched[:, None] * (rewards - q_logged))
