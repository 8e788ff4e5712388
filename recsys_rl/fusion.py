"""Fusion of per-candidate predictions into one ranking score, from a feed action (DESIGN 3.1).

The feed action a in R^K is a vector of fusion-weight logits. ``w_k = sign_k * exp(a_k)`` keeps every
weight's direction fixed by the signal registry (a hate prediction can only push an item down) while the
policy learns magnitudes on a log scale. Predictions are divided by a typical per-view value first, so
that a logit of 0 means the same "one typical unit" for watch seconds and for rare follows alike.
"""

from __future__ import annotations

import numpy as np

from recsys_rl import signals

FEED_ACTION_NAMES: tuple[str, ...] = signals.FEED_SIGNALS

#: Typical per-view value of each prediction, in FEED_ACTION_NAMES order (KuaiRand scale, DESIGN 11).
PREDICTION_SCALE = np.array([13.0, 0.45, 0.014, 0.0005, 0.0028, 0.0011, 0.00035])

_SIGNS = np.array(signals.directions(FEED_ACTION_NAMES), dtype=np.float64)


def fusion_weights(actions: np.ndarray) -> np.ndarray:
    """Signed fusion weights (n, K) for actions (n, K)."""
    return _SIGNS * np.exp(actions)


#: Each prediction's scale with its weight's sign: dividing by it is, to the bit, multiplying by the
#: sign and then dividing by the scale (IEEE negation is exact), one numpy call fewer a request.
_SIGNED_SCALE = _SIGNS * PREDICTION_SCALE


def fusion_scores(predictions: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Scores (n, C) of candidates with predictions (n, C, K) under per-request actions (n, K)."""
    return np.einsum("nck,nk->nc", predictions, np.exp(actions) / _SIGNED_SCALE)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices (n, k) of the k best scores per row, best first; ties go to the lower index."""
    order = (-scores).argsort(axis=1, kind="stable")  # the method: numpy's wrapper costs a server more
    return order[:, :k]
