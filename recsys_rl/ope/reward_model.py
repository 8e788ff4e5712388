"""Cross-fitted value models: the reward model of DM/DR and, with bootstrapping, fitted Q evaluation.

Sessions are split at random (seeded) into ``folds`` folds; the model that scores a row is fitted on the
other folds only, so no prediction a DR correction subtracts was fitted to that row's own reward
(cross-fitting; a model scored in-sample would absorb part of the noise DR is meant to correct). Whole
sessions go to one fold because the rows of a session share a user and, for FQE, chain into each other.
``folds=1`` fits and scores on all rows (in-sample), which only comparisons should use.

``v_target`` is E_{a ~ pi(s)} q(s, a), estimated by Monte Carlo: ``samples`` actions drawn from
``target.act`` with a seeded generator. The model is linear in the features, so this is the model at the
mean features of the draws (``linear.expected_features``). For a deterministic policy all draws coincide
and the estimate is exact; a stochastic one needs its ``act`` to sample the density its ``log_prob``
describes, the same density the importance weights use.

Results depend only on the data, the target and ``seed``: folds, draws for next states and draws for
current states come from three separate seeded streams, each consumed in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys_rl.ope.linear import Statistics, expected_features, feature_width, features, solve_ridge
from recsys_rl.ope.logged import LoggedSteps, ScoredPolicy

#: Rows per pass-chunk: the chunk's features (156 float64 columns) are the largest temporary.
CHUNK_ROWS = 32_768


@dataclass(frozen=True)
class QPredictions:
    """A cross-fitted model's predictions at every logged row."""

    q_logged: np.ndarray  # (n, S): q(s_i, a_i), the logged action
    v_target: np.ndarray  # (n, S): E_{a ~ pi(s_i)} q(s_i, a)
    folds: np.ndarray  # (n,): the fold each row was held out in, i.e. whose model scored it
    coefficients: np.ndarray  # (folds, F, S): the model fitted without each fold


def session_folds(sessions: int, folds: int, seed: int) -> np.ndarray:
    """A fold per session, as even as possible, in seeded random order."""
    if folds < 1:
        raise ValueError(f"folds should be at least 1, but is {folds}")
    if folds > sessions:
        raise ValueError(f"cannot split {sessions} sessions into {folds} folds")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    return rng.permutation(sessions) % folds


def fit_reward_model(
    logged: LoggedSteps,
    target: ScoredPolicy,
    *,
    folds: int = 5,
    ridge: float = 1e-3,
    samples: int = 4,
    seed: int = 0,
) -> QPredictions:
    """Per-signal ridge of the immediate reward on x(s, a), cross-fitted by session."""
    gammas = np.zeros(len(logged.signals))
    return fit_q_model(
        logged, target, gammas=gammas, iterations=0, folds=folds, ridge=ridge, samples=samples, seed=seed
    )


def fit_q_model(
    logged: LoggedSteps,
    target: ScoredPolicy,
    *,
    gammas: np.ndarray,
    iterations: int,
    folds: int,
    ridge: float,
    samples: int,
    seed: int,
    step_buckets: int = 0,
) -> QPredictions:
    """A linear Q of the target policy after ``iterations`` fitted-Q steps (0: the reward model), with
    the session position among its inputs when ``step_buckets`` > 0 (``linear.features``)."""
    if samples < 1 or iterations < 0:
        raise ValueError(f"samples should be >= 1 and iterations >= 0, but are {samples} and {iterations}")
    row_fold = session_folds(logged.sessions, folds, seed)[logged.session]
    width = feature_width(logged.states.shape[1], logged.actions.shape[1], step_buckets)
    stats = Statistics.zeros(folds, width, len(logged.signals))
    next_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    # rows in fold order, so every chunk belongs to one fold and adds to that fold's statistics
    order = np.argsort(row_fold, kind="stable")
    bounds = np.searchsorted(row_fold[order], np.arange(folds + 1))
    for k in range(folds):
        for chunk in _chunks(bounds[k + 1] - bounds[k]):
            rows = order[bounds[k] : bounds[k + 1]][chunk]
            x = features(logged.states[rows], logged.actions[rows], logged.step[rows], step_buckets)
            stats.gram[k] += x.T @ x
            stats.response[k] += x.T @ logged.rewards[rows]
            if iterations > 0:
                following = np.zeros_like(x)
                live = np.flatnonzero(~logged.done[rows])
                following[live] = _target_features(
                    target,
                    logged.next_states[rows[live]],
                    logged.step[rows[live]] + 1,
                    step_buckets,
                    samples,
                    next_rng,
                )
                stats.transition[k] += x.T @ following
    coefficients = np.stack(
        [
            solve_ridge(*stats.training(k), ridge=ridge, gammas=np.asarray(gammas), iterations=iterations)
            for k in range(folds)
        ]
    )
    q_logged, v_target = _predict(logged, target, coefficients, row_fold, samples, seed, step_buckets)
    return QPredictions(q_logged, v_target, row_fold, coefficients)


def _predict(
    logged: LoggedSteps,
    target: ScoredPolicy,
    coefficients: np.ndarray,
    row_fold: np.ndarray,
    samples: int,
    seed: int,
    step_buckets: int,
) -> tuple[np.ndarray, np.ndarray]:
    folds, width, signals = coefficients.shape
    stacked = coefficients.transpose(1, 0, 2).reshape(width, folds * signals)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    q_logged = np.empty((logged.rows, signals))
    v_target = np.empty((logged.rows, signals))
    for rows in _chunks(logged.rows):
        pick = row_fold[rows][:, None, None]
        x = features(logged.states[rows], logged.actions[rows], logged.step[rows], step_buckets)
        q_logged[rows] = np.take_along_axis((x @ stacked).reshape(-1, folds, signals), pick, axis=1)[:, 0]
        expected = _target_features(
            target, logged.states[rows], logged.step[rows], step_buckets, samples, rng
        )
        v_target[rows] = np.take_along_axis((expected @ stacked).reshape(-1, folds, signals), pick, axis=1)[
            :, 0
        ]
    return q_logged, v_target


def _target_features(
    target: ScoredPolicy,
    states: np.ndarray,
    steps: np.ndarray,
    step_buckets: int,
    samples: int,
    rng: np.random.Generator,
) -> np.ndarray:
    draws = np.stack([target.act(states, rng)[0] for _ in range(samples)])
    return expected_features(states, draws, steps, step_buckets)


def _chunks(rows: int) -> list[slice]:
    return [slice(start, min(start + CHUNK_ROWS, rows)) for start in range(0, rows, CHUNK_ROWS)]
