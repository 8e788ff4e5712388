"""Interests that move: what a user enjoyed today weighs more in what they like tomorrow.

Each day, a user's topic interests move a small step toward the topics of the videos they clicked,
weighted by how much of each they watched (docs/simulator.md, "Interest drift"). So a policy's
choices today shape tomorrow's world, and repeating one topic both satiates within the session and
narrows the user over days.
"""

from __future__ import annotations

import numpy as np


def drifted(
    interest: np.ndarray,
    users: np.ndarray,
    topics: np.ndarray,
    weights: np.ndarray,
    rate: float,
    floor: float,
) -> np.ndarray:
    """``interest`` (users, topics) after a day of clicked views (their user, topic and watch weight).

    Users without clicks keep their interests; no topic falls below ``floor`` / topics, so that every
    topic stays reachable, as at creation.
    """
    n_users, n_topics = interest.shape
    consumed = np.zeros((n_users, n_topics))
    np.add.at(consumed, (users, topics), weights)
    total = consumed.sum(axis=1, keepdims=True)
    moved = total[:, 0] > 0
    target = np.where(moved[:, None], consumed / np.maximum(total, 1e-12), interest)
    # every topic keeps floor / n_topics; the rest of the mass is shared in proportion to what is above it
    excess = np.maximum((1.0 - rate) * interest + rate * target - floor / n_topics, 0.0)
    return floor / n_topics + (1.0 - floor) * excess / excess.sum(axis=1, keepdims=True)
