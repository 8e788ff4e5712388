"""Who follows whom: follows persist, and a followed author's videos reach the user more often.

A follow subscribes the user to the author: the upstream ranker then draws part of the user's
candidates from followed authors (a following feed mixed into the main one), and the user finds those
authors' videos more appealing than a stranger's (docs/simulator.md, "Follows"). Without this, a follow
would be a button press with no consequence, and the follow constraint would count nothing lasting.
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

    def __len__(self) -> int:
        return int(self._keys.size)

    def add(self, users: np.ndarray, authors: np.ndarray) -> None:
        self._keys = np.union1d(self._keys, users.astype(np.int64) * self._n_authors + authors)

    def follows(self, users: np.ndarray, authors: np.ndarray) -> np.ndarray:
        """Whether each user follows the author beside them (any shapes that broadcast)."""
        keys = np.asarray(users, np.int64) * self._n_authors + np.asarray(authors, np.int64)
        if self._keys.size == 0:
            return np.zeros(keys.shape, dtype=bool)
        found = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        return self._keys[found] == keys

    def followed_videos(
        self, users: np.ndarray, pick_author: np.ndarray, pick_video: np.ndarray
    ) -> np.ndarray:
        """One video of a followed author per user, chosen by the uniforms ``pick_author`` and
        ``pick_video`` (n,); -1 where the user follows no one who has videos."""
        if self._keys.size == 0:
            return np.full(users.size, -1, dtype=np.int64)
        low = np.searchsorted(self._keys, users.astype(np.int64) * self._n_authors)
        high = np.searchsorted(self._keys, (users.astype(np.int64) + 1) * self._n_authors)
        count = high - low
        key = self._keys[np.minimum(low + (pick_author * count).astype(np.int64), self._keys.size - 1)]
        author = np.where(count > 0, key % self._n_authors, 0)
        videos = self._author_count[author]
        first = self._author_start[author] + (pick_video * videos).astype(np.int64)
        video = self._by_author[np.minimum(first, self._by_author.size - 1)]
        return np.where((count > 0) & (videos > 0), video, -1)
