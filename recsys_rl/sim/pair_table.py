"""Every user-author pair's history as a ranker sees it in the simulator: what the feature store serves.

In production a ranker reads a pair's history from the feature store, materialised once a day from the
logs (issue 22); a pair's state on a day is its history through the last finished day
(``pipelines.user_author``). This table is that store for a policy running in the simulator: it takes
each finished day's views (``add_day``, what the day's feedback events say: the item's author, click,
follow, gift) and answers any (user, author) with the pair's state (``states``), so a ranking term in the
simulator sees exactly what the pipeline would have trained it on.

The same counts are the users' memory of authors in the simulated world: the views a user has had of an
author make that author's videos more appealing (``views``; docs/simulator.md, "Familiarity").

Pairs are keyed ``user * n_authors + author`` in sorted arrays, as the follow graph is: a page asks for
tens of thousands of pairs at once, and a sorted search answers them without a Python loop.
"""

from __future__ import annotations

import numpy as np

from recsys_rl.pair_state import pair_states


class PairTable:
    """The running totals of every pair that has met: views, clicks, followed, gifts, last meeting."""

    def __init__(self, n_authors: int) -> None:
        self._n_authors = n_authors
        self._keys = np.zeros(0, np.int64)
        self._views = np.zeros(0, np.int64)
        self._clicks = np.zeros(0, np.int64)
        self._followed = np.zeros(0, bool)
        self._gifts = np.zeros(0, np.float64)
        self._last_ms = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return self._keys.size

    def add_day(
        self,
        users: np.ndarray,
        authors: np.ndarray,
        time_ms: np.ndarray,
        click: np.ndarray,
        follow: np.ndarray,
        gift: np.ndarray,
    ) -> None:
        """Count a day's meetings, one per viewed item: its user, its author and what the user did."""
        keys = users.astype(np.int64) * self._n_authors + authors
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])  # each met pair's first row
        met = keys[starts]
        today = (
            np.diff(np.r_[starts, keys.size]),
            np.add.reduceat((click[order] > 0).astype(np.int64), starts),
            np.logical_or.reduceat(follow[order] > 0, starts),
            np.add.reduceat(gift[order].astype(np.float64), starts),
            np.maximum.reduceat(time_ms[order].astype(np.int64), starts),
        )
        at = np.searchsorted(self._keys, met)
        known = at < self._keys.size
        known[known] = self._keys[at[known]] == met[known]
        columns = [self._views, self._clicks, self._followed, self._gifts, self._last_ms]
        combine = (np.add, np.add, np.logical_or, np.add, np.maximum)
        for column, values, how in zip(columns, today, combine, strict=True):
            column[at[known]] = how(column[at[known]], values[known])  # pairs met before: in place
        # pairs met for the first time: inserted where they sort, one linear pass per column
        fresh = at[~known]
        self._keys = np.insert(self._keys, fresh, met[~known])
        self._views, self._clicks, self._followed, self._gifts, self._last_ms = (
            np.insert(column, fresh, values[~known]) for column, values in zip(columns, today, strict=True)
        )

    def _columns(self, users: np.ndarray, authors: np.ndarray):
        """A reader of any column at the pairs (users, authors) (shapes that broadcast), with a default for
        pairs that never met."""
        keys = np.asarray(users, np.int64) * self._n_authors + np.asarray(authors, np.int64)
        at = np.minimum(np.searchsorted(self._keys, keys), max(self._keys.size - 1, 0))
        found = self._keys[at] == keys if self._keys.size else np.zeros(keys.shape, bool)

        def column(values: np.ndarray, default):
            return np.where(found, values[at], default) if values.size else np.full(keys.shape, default)

        return column

    def views(self, users: np.ndarray, authors: np.ndarray) -> np.ndarray:
        """How many of each author's items each user has seen through the last finished day."""
        return self._columns(users, authors)(self._views, 0)

    def states(self, users: np.ndarray, authors: np.ndarray, at_ms: np.ndarray) -> np.ndarray:
        """The states (..., D) of the pairs (users, authors) at ``at_ms``: shapes that broadcast."""
        column = self._columns(users, authors)
        return pair_states(
            column(self._views, 0),
            column(self._clicks, 0),
            column(self._followed, False),
            column(self._gifts, 0.0),
            column(self._last_ms, -1),
            at_ms,
        )
