"""Who follows whom: follows persist, and a followed author's videos reach the user more often.

A follow subscribes the user to the author: the upstream ranker then draws part of the user's
candidates from followed authors (a following feed mixed into the main one), and the user finds those
authors' videos more appealing than a stranger's (docs/simulator.md, "Follows"). Without this, a follow
would be a button press with no consequence, and the follow constraint would count nothing lasting.

The following feed shows what the followed authors post, so each author fills it in proportion to
their own supply of videos: following a prolific author brings more of them than following one who
rarely posts (docs/simulator.md, "Authors' supply").
"""

from __future__ import annotations

import numpy as np


class FollowGraph:
    """The set of (user, author) follows, as sorted int64 keys user * n_authors + author."""

    def __init__(self, n_authors: int, video_author: np.ndarray) -> None:
        self._n_authors = n_authors
        self._keys = np.empty(0, dtype=np.int64)
        # each author's videos, for drawing candidates by author
        self._by_author = np.argsort(video_author, kind="stable")
        counts = np.bincount(video_author, minlength=n_authors)
        self._author_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._author_count = counts
        self._videos_through = np.empty(0, dtype=np.int64)  # per key: the followed videos up to it

    def __len__(self) -> int:
        return int(self._keys.size)

    def add(self, users: np.ndarray, authors: np.ndarray) -> None:
        self._keys = np.union1d(self._keys, users.astype(np.int64) * self._n_authors + authors)
        self._videos_through = np.cumsum(self._author_count[self._keys % self._n_authors])

    def follows(self, users: np.ndarray, authors: np.ndarray) -> np.ndarray:
        """Whether each user follows the author beside them (any shapes that broadcast)."""
        keys = np.asarray(users, np.int64) * self._n_authors + np.asarray(authors, np.int64)
        if self._keys.size == 0:
            return np.zeros(keys.shape, dtype=bool)
        found = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        return self._keys[found] == keys

    def following_anyone(self, users: np.ndarray) -> np.ndarray:
        """Whether each user follows at least one author."""
        low = np.searchsorted(self._keys, users.astype(np.int64) * self._n_authors)
        return np.searchsorted(self._keys, (users.astype(np.int64) + 1) * self._n_authors) > low

    def followed_videos(self, users: np.ndarray, pick: np.ndarray) -> np.ndarray:
        """One video per user, drawn by the uniforms ``pick`` (n,) from all the videos of every author the
        user follows, so an author who posts more comes up more often; -1 where the user follows no one
        who has videos."""
        if self._keys.size == 0:
            return np.full(users.size, -1, dtype=np.int64)
        low = np.searchsorted(self._keys, users.astype(np.int64) * self._n_authors)
        high = np.searchsorted(self._keys, (users.astype(np.int64) + 1) * self._n_authors)
        through = np.r_[0, self._videos_through]  # through[i]: the videos of the keys before key i
        before, total = through[low], through[high] - through[low]
        nth = before + np.minimum((pick * total).astype(np.int64), np.maximum(total - 1, 0))
        key = np.minimum(np.searchsorted(self._videos_through, nth, side="right"), self._keys.size - 1)
        author = self._keys[key] % self._n_authors
        video = self._author_start[author] + nth - through[key]
        return np.where(total > 0, self._by_author[np.minimum(video, self._by_author.size - 1)], -1)
