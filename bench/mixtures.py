"""Mixtures of fusion weightings over users: the constrained frontier between a search's candidates.

A search on ground truth finds single weightings, and the ones that hold every constraint are few and far
apart: the best of them says little about where the constrained optimum lies. A mixture, each user served
one candidate throughout, drawn once with the mixture's probabilities, reaches any point between the
candidates, and the best one under the constraints is a linear program. It is a randomised policy that
reads no state, so it is a global line, and a stronger one than the best single candidate.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from recsys_rl import signals
from recsys_rl.sim.reference_lines import UserGroupedFeedPolicy

_WATCH = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)
_SIGNS = np.asarray(signals.directions(signals.FEED_SIGNALS), dtype=np.float64)


def best_mixture(totals: np.ndarray, units: np.ndarray, reference: np.ndarray) -> np.ndarray | None:
    """The mixture of candidates (weights (C,) summing to 1) with the most watch time per unit among those
    holding every constraint against ``reference`` (K,), the behaviour's value per unit; None when no
    mixture holds.

    ``totals`` (C, K) is each candidate's signals per user over the days and ``units`` (C,) what its value
    is per: 1 for the multi-day objective, its requests per user for a per-request one. A mixture's value
    per unit is sum_c w_c totals_c / sum_c w_c units_c; with y = w / sum_c w_c units_c it is totals' y,
    subject to units' y = 1 and, per auxiliary signal k, sign_k (totals_k - reference_k units)' y >= 0,
    y >= 0: a linear program (Charnes and Cooper 1962), whose w = y / sum(y)."""
    margins = _SIGNS[None, 1:] * (totals[:, 1:] - reference[None, 1:] * units[:, None])
    solved = linprog(
        -totals[:, _WATCH],
        A_ub=-margins.T,
        b_ub=np.zeros(margins.shape[1]),
        A_eq=units[None, :],
        b_eq=[1.0],
        bounds=(0, None),
        method="highs",
    )
    if solved.status == 2:  # infeasible
        return None
    if not solved.success:
        raise RuntimeError(f"the mixture's linear program failed: {solved.message}")
    return solved.x / solved.x.sum()


def mixture_watch_lift(
    weights: np.ndarray, totals: np.ndarray, units: np.ndarray, reference: np.ndarray
) -> float:
    """The watch-time lift per unit of the mixture ``weights`` over ``reference`` (best_mixture's terms)."""
    return float(weights @ totals[:, _WATCH] / (weights @ units) / reference[_WATCH] - 1.0)


def mixture_assignment(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Each user's candidate under the mixture ``weights`` (C,), from the user's uniform draw (U,): the
    inverse of the mixture's distribution function, so that two mixtures given the same draws serve a
    user different candidates only as far as their weights differ."""
    return np.minimum(np.searchsorted(np.cumsum(weights), uniforms, side="right"), weights.size - 1)


def mixture_policy(
    candidates: np.ndarray, state_coef: np.ndarray, weights: np.ndarray, *, users: int, world: int
) -> UserGroupedFeedPolicy:
    """The mixture ``weights`` of the ``candidates`` (C, K) logits on the world of seed ``world`` with
    ``users`` users: each user's candidate drawn from a uniform number keyed by the world, so that every
    mixture on one world draws from the same numbers."""
    uniforms = np.random.default_rng(np.random.SeedSequence(world, spawn_key=(11,))).random(users)
    return UserGroupedFeedPolicy(
        candidates, state_coef, mixture_assignment(weights, uniforms), version="global-mixture"
    )
