"""The linear value model behind DM, DR and FQE: a fixed feature map of (state, action) and ridge regression.

Features x(s, a) = [1, s, a, s (x) a, a_i a_j for i <= j]. The reward of a feed page depends on the
action through a ranking, so its expectation is smooth but not linear in the fusion logits: the squares
and pairwise products let the model have an optimum in action space, and the state-action products let
that optimum move with the user (group, history, page). That is 1 + D + K + DK + K(K+1)/2 = 156 columns
for the feed's D = 15, K = 7: rich enough to take most of the variance out of DR, small enough that
the normal equations are a 156 x 156 solve.

FQE adds the step: one indicator column per position in the session (the last one shared by every later
position), since the value of the rest of a session depends on how much of it is left and the state need
not say (a model without it averages over positions: 9.5% off on sessions of fixed length).

Everything is fitted from sufficient statistics accumulated in one pass over the rows (Gram matrix
sum x x', sums x r', and for FQE sum (1 - done) x x_next'), so the design matrix of a million rows is
never held in memory and the fit on "all folds but k" is the total minus fold k. The ridge is solved on
standardised features (centred and scaled by the training rows' own moments, intercept unpenalised) and
mapped back to raw coefficients, so one penalty ``ridge`` means the same for every column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def feature_width(state_dim: int, action_dim: int, step_buckets: int = 0) -> int:
    """Columns of ``features``, intercept included."""
    return (
        1
        + state_dim
        + action_dim
        + state_dim * action_dim
        + action_dim * (action_dim + 1) // 2
        + step_buckets
    )


def features(
    states: np.ndarray, actions: np.ndarray, steps: np.ndarray | None = None, step_buckets: int = 0
) -> np.ndarray:
    """x(s, a) for rows of states (n, D) and actions (n, K), float64; with ``step_buckets`` > 0, the
    rows' positions ``steps`` (n,) as indicators of min(step, step_buckets - 1)."""
    actions = np.asarray(actions, np.float64)
    first, second = np.triu_indices(actions.shape[1])
    return _assemble(
        states, actions, actions[:, first] * actions[:, second], _step_indicators(steps, step_buckets)
    )


def expected_features(
    states: np.ndarray, action_samples: np.ndarray, steps: np.ndarray | None = None, step_buckets: int = 0
) -> np.ndarray:
    """The mean of x(s, a) over action samples (m, n, K) drawn at each state: since a linear model is
    linear in x, its prediction at these features is the Monte-Carlo mean of its predictions."""
    samples = np.asarray(action_samples, np.float64)
    first, second = np.triu_indices(samples.shape[2])
    return _assemble(
        states,
        samples.mean(axis=0),
        (samples[..., first] * samples[..., second]).mean(axis=0),
        _step_indicators(steps, step_buckets),
    )


def _step_indicators(steps: np.ndarray | None, buckets: int) -> np.ndarray | None:
    if buckets == 0:
        return None
    if steps is None:
        raise ValueError(f"step_buckets is {buckets}, so the rows' steps are needed")
    out = np.zeros((steps.shape[0], buckets))
    out[np.arange(steps.shape[0]), np.minimum(steps, buckets - 1)] = 1.0
    return out


def _assemble(
    states: np.ndarray, actions: np.ndarray, quadratic: np.ndarray, step_columns: np.ndarray | None
) -> np.ndarray:
    n, d = states.shape
    k = actions.shape[1]
    buckets = 0 if step_columns is None else step_columns.shape[1]
    out = np.empty((n, feature_width(d, k, buckets)))
    out[:, 0] = 1.0
    out[:, 1 : 1 + d] = states
    out[:, 1 + d : 1 + d + k] = actions
    out[:, 1 + d + k : 1 + d + k + d * k] = (states[:, :, None] * actions[:, None, :]).reshape(n, d * k)
    out[:, 1 + d + k + d * k : out.shape[1] - buckets] = quadratic
    if buckets:
        out[:, out.shape[1] - buckets :] = step_columns
    return out


@dataclass
class Statistics:
    """Sufficient statistics of a linear fit, one slice per fold (accumulated in place)."""

    gram: np.ndarray  # (folds, F, F): sum x x'
    response: np.ndarray  # (folds, F, S): sum x r'
    transition: np.ndarray  # (folds, F, F): sum (1 - done) x x_next' (zeros when not fitting FQE)

    @classmethod
    def zeros(cls, folds: int, width: int, signals: int) -> Statistics:
        return cls(
            np.zeros((folds, width, width)),
            np.zeros((folds, width, signals)),
            np.zeros((folds, width, width)),
        )

    def training(self, fold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Statistics of every fold but ``fold`` (of all rows when there is a single fold)."""
        if self.gram.shape[0] == 1:
            return self.gram[0], self.response[0], self.transition[0]
        return tuple(total.sum(axis=0) - total[fold] for total in (self.gram, self.response, self.transition))


def solve_ridge(
    gram: np.ndarray,
    response: np.ndarray,
    transition: np.ndarray,
    *,
    ridge: float,
    gammas: np.ndarray,
    iterations: int,
) -> np.ndarray:
    """Raw coefficients (F, S) of the ridge fit, then ``iterations`` fitted-Q steps.

    Iteration 0 regresses r on x. Step k + 1 regresses r + gamma (1 - done) Q_k(s', pi) on x, with
    Q_k(s', pi) = x_next' theta_k, so its normal equations are (G + n L) theta = R + gamma T theta_k:
    one small solve per step whatever the number of rows. ``gammas`` (S,) is the discount per signal.
    """
    rows = gram[0, 0]
    mean = gram[0, 1:] / rows
    variance = np.diag(gram)[1:] / rows - mean**2
    # a constant column (zero variance) keeps scale 1: centred it is zero and the penalty zeroes it
    scale = np.where(variance > 1e-12 * (1.0 + mean**2), np.sqrt(np.maximum(variance, 0.0)), 1.0)
    to_standard = np.zeros_like(gram)
    to_standard[0, 0] = 1.0
    to_standard[1:, 0] = -mean / scale
    to_standard[1:, 1:] = np.diag(1.0 / scale)
    lhs = to_standard @ gram @ to_standard.T / rows
    lhs[1:, 1:] += ridge * np.eye(lhs.shape[0] - 1)
    rhs = to_standard @ response / rows
    if iterations == 0:
        return to_standard.T @ np.linalg.solve(lhs, rhs)
    bootstrap = to_standard @ transition @ to_standard.T / rows
    inverse = np.linalg.inv(lhs)  # positive definite (ridge), inverted once for every iteration
    theta = inverse @ rhs
    for _ in range(iterations):
        theta = inverse @ (rhs + (bootstrap @ theta) * gammas[None, :])
    return to_standard.T @ theta
