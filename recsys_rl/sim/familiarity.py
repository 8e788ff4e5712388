"""The users' memory of authors in the simulated world: how many of each author's items each user has seen.

Familiarity (docs/simulator.md, "Familiarity") raises the appeal of an author's videos with the user's
earlier views of that author, up to ``familiarity_saturation_views`` and then flat. Every candidate of
every page reads it, so it is a dense users x authors table of bytes, indexed directly: the sorted pair
keys the feature store's ``PairTable`` searches took a fifth of the simulator's time for this one read
(about twenty cache-missing steps a candidate, against one here). Views past saturation change nothing,
so the count stops there and a byte holds it; the table costs ``n_users * n_authors`` bytes (60 MB for
30,000 users and 2,000 authors, the largest world a benchmark builds).

Like the pair table, it is updated at each day's end: a user's familiarity stands still within a day.
"""

from __future__ import annotations

import numpy as np

MOST_COUNTED = int(np.iinfo(np.uint8).max)  # views a byte holds


class Familiarity:
    """Views of each author's items per user, counted up to the saturation (where familiarity is full)."""

    def __init__(self, n_users: int, n_authors: int, saturation_views: int) -> None:
        """``saturation_views`` is at most ``MOST_COUNTED`` (``SimConfig`` checks it)."""
        self._n_authors = n_authors
        self._saturation = saturation_views
        self._views = np.zeros(n_users * n_authors, np.uint8)

    def add_day(self, users: np.ndarray, authors: np.ndarray) -> None:
        """Count a day's views: one (user, author) per viewed item."""
        pairs, views = np.unique(users.astype(np.int64) * self._n_authors + authors, return_counts=True)
        self._views[pairs] = np.minimum(self._views[pairs] + views, self._saturation)

    def views(self, users: np.ndarray, authors: np.ndarray) -> np.ndarray:
        """The views of each author's items each user has had through the last finished day, up to the
        saturation (shapes that broadcast)."""
        return self._views[np.asarray(users, np.int64) * self._n_authors + authors]
