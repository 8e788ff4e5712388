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
