"""Logged per-user aggregates: what a production system knows about a user from past days.

Policies never see the simulator's hidden user traits; they see these aggregates (the same ones the
Feast feature views hold in production), turned into features by ``recsys_rl.state.history_features``,
as serving does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys_rl.state import history_features


@dataclass
class UserHistory:
    views: np.ndarray
    clicks: np.ndarray
    watch_s: np.ndarray
    interactions: np.ndarray
    live_views: np.ndarray
    live_watch_s: np.ndarray
    returned_yesterday: np.ndarray  # float 0/1

    @classmethod
    def fresh(cls, n_users: int) -> UserHistory:
        return cls(*(np.zeros(n_users) for _ in range(7)))

    def features(self, users: np.ndarray) -> np.ndarray:
        """(n, 4): click rate, watch s per view / 10, interactions per view x10, live s per view / 60."""
        return history_features(
            self.views[users],
            self.clicks[users],
            self.watch_s[users],
            self.interactions[users],
            self.live_views[users],
            self.live_watch_s[users],
        )

    def add_day(self, views, returning: np.ndarray) -> None:
        """Fold one day's ``ViewLog`` into the aggregates."""
        n = self.views.size
        video = ~views.is_live
        user, sig = views.user, views.signals

        def per_user(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
            w = None if weights is None else weights[mask]
            return np.bincount(user[mask], weights=w, minlength=n)

        self.views += per_user(video)
        self.clicks += per_user(video, sig[:, 1])
        self.watch_s += per_user(video, sig[:, 0])
        self.interactions += per_user(video, sig[:, 2:6].sum(axis=1))
        self.live_views += per_user(views.is_live)
        self.live_watch_s += per_user(views.is_live, sig[:, 8])
        self.returned_yesterday = returning.astype(np.float64)
