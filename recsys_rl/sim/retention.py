"""Whether a user comes back tomorrow: the retention model (docs/simulator.md, "Retention").

A user remembers how their days went, an exponential average over days of each day's retention
satisfaction, and tomorrow's return probability rises with it from their group's base rate. A day's
retention satisfaction is its mean view satisfaction plus a part that differs between users: how far
the day's interactions per short-video view were above the typical rate, weighted by the user's social
trait. So a watch-maximising day brings a watcher back and leaves a social user cold, and the best
trade-off between watch time and interactions differs between users.
"""

from __future__ import annotations

import numpy as np

from recsys_rl.sim.parameters import ResponseModel


def remembered_satisfaction(
    previous: np.ndarray,
    mean_view_satisfaction: np.ndarray,
    interactions: np.ndarray,
    video_views: np.ndarray,
    social: np.ndarray,
    model: ResponseModel,
) -> np.ndarray:
    """Each user's memory after a day; NaN mean view satisfaction: the user did not come.

    ``interactions`` are the day's likes, follows, comments and shares on ``video_views`` short-video
    views; a day away lets the memory fade toward the reference.
    """
    per_view = interactions / np.maximum(video_views, 1)
    social_part = np.where(
        video_views > 0, social * model.return_interactions * (per_view - model.interaction_reference), 0.0
    )
    came = ~np.isnan(mean_view_satisfaction)
    day = np.where(came, np.nan_to_num(mean_view_satisfaction) + social_part, model.return_reference)
    return model.return_memory * previous + (1.0 - model.return_memory) * day


def return_probability(base: np.ndarray, remembered: np.ndarray, model: ResponseModel) -> np.ndarray:
    """sigmoid(logit(base) + return_satisfaction * (remembered - return_reference))."""
    logit = np.log(base / (1.0 - base)) + model.return_satisfaction * (remembered - model.return_reference)
    return 1.0 / (1.0 + np.exp(-logit))
