"""Logged per-user aggregates: what a production system knows about a user from past days.

Policies never see the simulator's hidden user traits; they see these aggregates (the same ones the
Feast feature views hold in production). Pseudo-counts at typical rates make a new user's features
sensible before any history exists, instead of 0/0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_PRIOR_VIEWS = 20.0
_PRIOR_CLICK_RATE = 0.45
_PRIOR_WATCH_PER_VIEW_S = 13.0
_PRIOR_INTERACTION_RATE = 0.02


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
        views = self.views[users] + _PRIOR_VIEWS
        return np.column_stack(
            [
                (self.clicks[users] + _PRIOR_VIEWS * _PRIOR_CLICK_RATE) / views,
                (self.watch_s[users] + _PRIOR_VIEWS * _PRIOR_WATCH_PER_VIEW_S) / views / 10.0,
                (self.interactions[users] + _PRIOR_VIEWS * _PRIOR_INTERACTION_RATE) / views * 10.0,
                self.live_watch_s[users] / (self.live_views[users] + 1.0) / 60.0,
            ]
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
