"""Mixtures of fusion weightings over users: the constrained frontier between a search's candidates.

A search on ground truth finds single weightings, and the ones that hold every constraint are few and far
apart: the best of them says little about where the constrained optimum lies. A mixture, each user served
one candidate throughout, drawn once with the mixture's probabilities, reaches any point between the
candidates, and the best one under the constraints is a linear program. It is a randomised policy that
reads no state, so it is a global line, and a stronger one than the best single candidate.

A mixture is valued by its expectation over that draw: per user, its candidates' values for the user
weighted by the mixture. Users are independent in the simulator (their draws are keyed per user,
docs/simulator.md), so this is what the mixture gives each user on average, without the noise of one
draw of who gets what: with 20,000 users and a handful of candidates, one draw moved a mixture's
constraint verdicts from all held to four broken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog

from recsys_rl import signals
from recsys_rl.sim.ground_truth import PolicyValues
from recsys_rl.sim.reference_lines import SegmentedFeedPolicy
from recsys_rl.sim.simulator import FeedPolicy

_WATCH = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)
_SIGNS = np.asarray(signals.directions(signals.FEED_SIGNALS), dtype=np.float64)
#: Weights below this are the linear program's rounding, not a candidate it chose.
_NEGLIGIBLE = 1e-9


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


@dataclass(frozen=True)
class Mixture:
    """Feed policies mixed over users with ``weights``, every weight positive and their sum 1."""

    weights: np.ndarray
    policies: tuple[FeedPolicy, ...]

    @classmethod
    def of_candidates(cls, weights: np.ndarray, candidates: np.ndarray, state_coef: np.ndarray) -> Mixture:
        """The mixture ``weights`` (C,) of the global weightings ``candidates`` (C, K), the candidates it
        gives no weight left out."""
        used = np.flatnonzero(weights > _NEGLIGIBLE)
        return cls(
            weights[used] / weights[used].sum(),
            tuple(SegmentedFeedPolicy.global_weighting(candidates[c], state_coef) for c in used),
        )


def mixed_values(weights: np.ndarray, values: Sequence[PolicyValues]) -> PolicyValues:
    """A mixture's values from its policies' ``values`` on one world and draws: per user, the expectation
    over which policy serves the user. The session-discounted estimates (``feed``, ``live``) are left
    empty: a mixture is judged per user over the days."""
    totals = np.stack([v.per_user.sum(axis=0) for v in values])  # (C, K)
    requests = totals[:, _WATCH] / np.array([v.per_request[signals.FEED_MAIN_SIGNAL] for v in values])
    return PolicyValues(
        feed={},
        live={},
        per_request=dict(zip(signals.FEED_SIGNALS, weights @ totals / (weights @ requests), strict=True)),
        episodes=round(float(weights @ np.array([v.episodes for v in values]))),
        return_rate=float(weights @ np.array([v.return_rate for v in values])),
        per_user=np.tensordot(weights, np.stack([v.per_user for v in values]), axes=1),
    )


def components(policy: Any) -> tuple[Any, ...]:
    """What runs for ``policy`` on a world: a mixture's policies, or the policy itself."""
    return policy.policies if isinstance(policy, Mixture) else (policy,)


def combined(policy: Any, values: Sequence[PolicyValues]) -> PolicyValues:
    """``policy``'s values on a world from its ``components``' values there, in their order."""
    return mixed_values(policy.weights, values) if isinstance(policy, Mixture) else values[0]
