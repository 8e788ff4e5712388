"""Sequential off-policy estimators: a session's discounted return, per signal, under the target policy.

The value of a signal is E[sum_t gamma^t r_t] over a session (its decisions t = 0, 1, ...), with the
signal's own discount (``recsys_rl.signals.discounts``), so estimates compare with
``monte_carlo_values(...).feed``. With per-decision ratios rho_t = prod_{k <= t} w_k (rho_{-1} = 1), a
model's q_t = Q(s_t, a_t) and v_t = E_{a ~ pi} Q(s_t, a):

* PDIS     mean over sessions of sum_t gamma^t rho_t r_t
* WPDIS    sum_t gamma^t (sum_i rho_{i,t} r_{i,t}) / (sum_i rho_{i,t}): a session that has ended stays in
           the later steps' denominators with its final rho and reward 0 (an absorbing state whose
           actions leave rho unchanged), which keeps on-policy WPDIS equal to the mean return
* DR       mean over sessions of sum_t gamma^t (rho_t (r_t - q_t) + rho_{t-1} v_t)   (Jiang & Li 2016)
* FQE      mean over sessions of v_0, the fitted Q of the target at the session's first state

FQE iterates ridge regressions of r + gamma Q_k(s', a' ~ pi) on x(s, a) (``linear.solve_ridge``) a fixed
``FQE_ITERATIONS`` times from Q_0 = the reward model: iteration k is the k + 1 step truncated value, and
simulated sessions end after at most 30 pages, so 30 iterations reach their horizon; longer real sessions
are truncated there, a bias that shrinks as gamma^30 (0.21 for watch time, 0.04 for the rest). Its Q
takes the decision's position in the session as an input (``FQE_STEP_BUCKETS`` indicators, the last for
every later position), since what is left of a session depends on it. It is cross-fitted by session like
the reward model, and DR uses its Q.

All estimators return ``RatioTerms`` with one row per session (in session order).
"""

from __future__ import annotations

import numpy as np

from recsys_rl import signals as signal_registry
from recsys_rl.ope.estimators import MAX_LOG_WEIGHT, importance_weights
from recsys_rl.ope.logged import LoggedSteps, ScoredPolicy
from recsys_rl.ope.reward_model import QPredictions, fit_q_model
from recsys_rl.ope.terms import RatioTerms

FQE_ITERATIONS = 30
#: Positions FQE tells apart: one per page a simulated session can reach.
FQE_STEP_BUCKETS = 30


def default_gammas(logged: LoggedSteps) -> np.ndarray:
    return np.asarray(signal_registry.discounts(logged.signals))


def cumulative_log_ratio(logged: LoggedSteps, log_ratio: np.ndarray) -> np.ndarray:
    """log rho_t = sum of the session's log ratios up to and including each row.

    A running sum over all rows minus its value before each session start; log ratios are floored at
    -2 MAX_LOG_WEIGHT (a weight that is zero either way) so a zero target density cannot put -inf into
    the running sum.
    """
    running = np.cumsum(np.maximum(log_ratio, -2.0 * MAX_LOG_WEIGHT))
    starts = logged.session_starts
    before = running[starts] - np.maximum(log_ratio[starts], -2.0 * MAX_LOG_WEIGHT)
    return running - before[logged.session]


def session_log_ratio(logged: LoggedSteps, log_ratio: np.ndarray) -> np.ndarray:
    """Each session's log weight: the log of the product of its decisions' ratios, in session order."""
    return cumulative_log_ratio(logged, log_ratio)[np.r_[logged.session_starts[1:], logged.rows] - 1]


def _discounts(logged: LoggedSteps, gammas: np.ndarray) -> np.ndarray:
    return np.power(gammas[None, :], logged.step[:, None])


def _per_session(logged: LoggedSteps, row_values: np.ndarray) -> RatioTerms:
    """Terms of the mean over sessions of each session's sum of ``row_values`` (n, S)."""
    first = (logged.step == 0).astype(np.float64)
    return RatioTerms(row_values[:, None, :], first[:, None]).sum_by(logged.session_starts)


def pdis(logged: LoggedSteps, log_ratio: np.ndarray, gammas: np.ndarray) -> RatioTerms:
    rho = importance_weights(cumulative_log_ratio(logged, log_ratio))
    return _per_session(logged, _discounts(logged, gammas) * rho[:, None] * logged.rewards)


def wpdis(logged: LoggedSteps, log_ratio: np.ndarray, gammas: np.ndarray) -> RatioTerms:
    """One part per step t (memory: sessions x longest session x signals)."""
    rho = importance_weights(cumulative_log_ratio(logged, log_ratio))
    horizon = int(logged.step.max()) + 1
    numerator = np.zeros((logged.sessions, horizon, len(logged.signals)))
    numerator[logged.session, logged.step] = _discounts(logged, gammas) * rho[:, None] * logged.rewards
    denominator = np.zeros((logged.sessions, horizon))
    denominator[logged.session, logged.step] = rho
    lengths = np.diff(np.r_[logged.session_starts, logged.rows])
    final = rho[logged.session_starts + lengths - 1]
    ended = np.arange(horizon)[None, :] >= lengths[:, None]
    denominator = np.where(ended, final[:, None], denominator)
    return RatioTerms(numerator, denominator)


def sequential_dr(
    logged: LoggedSteps, log_ratio: np.ndarray, gammas: np.ndarray, model: QPredictions
) -> RatioTerms:
    cumulative = cumulative_log_ratio(logged, log_ratio)
    previous = np.where(logged.step > 0, np.r_[0.0, cumulative[:-1]], 0.0)
    rho, rho_before = importance_weights(cumulative), importance_weights(previous)
    terms = rho[:, None] * (logged.rewards - model.q_logged) + rho_before[:, None] * model.v_target
    return _per_session(logged, _discounts(logged, gammas) * terms)


def fqe(logged: LoggedSteps, model: QPredictions) -> RatioTerms:
    return RatioTerms.mean(model.v_target[logged.session_starts])


def on_policy_return(logged: LoggedSteps, gammas: np.ndarray) -> RatioTerms:
    """The behaviour policy's own value: the mean discounted return of the logged sessions."""
    return _per_session(logged, _discounts(logged, gammas) * logged.rewards)


def fit_fqe(
    logged: LoggedSteps,
    target: ScoredPolicy,
    *,
    gammas: np.ndarray,
    iterations: int = FQE_ITERATIONS,
    folds: int = 5,
    ridge: float = 1e-3,
    samples: int = 4,
    seed: int = 0,
) -> QPredictions:
    """The target's discounted Q per signal, cross-fitted by session (see the module docstring)."""
    return fit_q_model(
        logged,
        target,
        gammas=gammas,
        iterations=iterations,
        folds=folds,
        ridge=ridge,
        samples=samples,
        seed=seed,
        step_buckets=FQE_STEP_BUCKETS,
    )
