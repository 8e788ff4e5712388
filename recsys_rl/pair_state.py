"""The state of a user-author pair (issue 22): what its history says just before an interaction.

One module builds it for the transition pipeline (``pipelines.user_author``) and, later, for serving
from the feature store's pair rows, so the two cannot disagree. It depends on the pair's running totals
and the time since its last interaction only, which is what lets the pipeline stand the state at a
run's cut-off in for a next interaction that has not happened yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from recsys_rl.state import DAY_MS

#: The pair's state, in order: what the pair's history says just before a step.
PAIR_STATE_FEATURES: tuple[str, ...] = (
    "log_views",  # log(1 + earlier interactions)
    "log_clicks",  # log(1 + earlier clicks)
    "followed",  # 1 once the user has followed the author (follows persist)
    "log_gifts",  # log(1 + value of earlier gifts)
    "log_days_since_last",  # log(1 + days since the previous interaction); 0 before the first
    "first",  # 1 when the pair has never interacted before
)


class PairHistory(NamedTuple):
    """What is known of a pair before a step: the running totals its state is computed from.

    A tuple, not a dataclass: the pipeline makes one per interaction, and a frozen dataclass costs a
    microsecond more to make."""

    views: int = 0
    clicks: int = 0
    followed: bool = False
    gifts: float = 0.0
    last_time_ms: int | None = None

    def state(self, at_ms: int) -> list[float]:
        """The pair's state at ``at_ms``, in ``PAIR_STATE_FEATURES`` order."""
        first = self.last_time_ms is None
        days = 0.0 if first else max(0, at_ms - self.last_time_ms) / DAY_MS
        return [
            math.log1p(self.views),
            math.log1p(self.clicks),
            float(self.followed),
            math.log1p(self.gifts),
            math.log1p(days),
            float(first),
        ]

    def after(self, fact: Mapping) -> PairHistory:
        """The history once ``fact`` (a view fact of this pair) has happened."""
        return PairHistory(
            self.views + 1,
            self.clicks + (fact["click"] > 0),
            self.followed or fact["follow"] > 0,
            self.gifts + float(fact["gift"]),
            int(fact["event_time_ms"]),
        )


def pair_states(
    views: np.ndarray,
    clicks: np.ndarray,
    followed: np.ndarray,
    gifts: np.ndarray,
    last_time_ms: np.ndarray,
    at_ms: np.ndarray,
) -> np.ndarray:
    """``PairHistory.state`` of many pairs at once (..., D): the same function over arrays of any shapes
    that broadcast, ``last_time_ms`` negative for a pair that never met. For a ranker that scores every
    candidate's pair on a page; the pipeline builds one row at a time, where numpy's call costs more."""
    first = last_time_ms < 0
    days = np.where(first, 0.0, np.maximum(0, at_ms - last_time_ms) / DAY_MS)
    shape = np.broadcast_shapes(*(np.shape(a) for a in (views, clicks, followed, gifts, last_time_ms, at_ms)))
    columns = (np.log1p(views), np.log1p(clicks), followed, np.log1p(gifts), np.log1p(days), first)
    return np.stack([np.broadcast_to(np.asarray(c, np.float64), shape) for c in columns], axis=-1)
