"""How a simulated user responds to a short video or a live stream.

The same response probabilities give both the upstream ranker's predictions (their expectation, plus
model noise) and the realised feedback (a draw), so a policy that weighs predictions well really does
collect more of each signal. Interactions happen only after a click; hates can come from any view.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys_rl.sim.parameters import ResponseModel
from recsys_rl.sim.world import FACTOR_SIGNALS, World

#: Column order of per-view feed responses; equal to recsys_rl.signals.FEED_SIGNALS.
FEED_RESPONSE_COLUMNS: tuple[str, ...] = ("watch_time", "click", "like", "follow", "comment", "share", "hate")
_INTERACTIONS = ("like", "follow", "comment", "share")
_FACTOR = {name: i for i, name in enumerate(FACTOR_SIGNALS)}


def take_in_rows(values: np.ndarray, columns: np.ndarray, row_axis: int = 0) -> np.ndarray:
    """``values``' entries at ``columns`` (n, k) along the axis after ``row_axis`` (n), row by row: what
    ``np.take_along_axis`` picks, as one flat ``np.take`` (4 to 10 times faster on the simulator's pages,
    where ``take_along_axis`` builds a broadcast index per call)."""
    n, m = values.shape[row_axis], values.shape[row_axis + 1]
    flat = (np.arange(n) * m)[:, None] + columns
    merged = values.reshape(*values.shape[:row_axis], n * m, *values.shape[row_axis + 2 :])
    return np.take(merged, flat, axis=row_axis)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


#: Rows of ``VideoResponseProbs.table``; the interactions and hate follow in FACTOR_SIGNALS order.
_PROB_ROWS = ("click", "watch_fraction", "duration_s", *FACTOR_SIGNALS)
_CLICK, _FRACTION, _DURATION = 0, 1, 2
_RATES = 3  # first of the interactions' probabilities given a click
_HATE = len(_PROB_ROWS) - 1


@dataclass(frozen=True)
class VideoResponseProbs:
    """Response probabilities of users for videos, stacked on the first axis of one array
    (``_PROB_ROWS``: click, mean watch fraction after a click, duration, the interactions' probabilities
    given a click, hate): picking the ranked items is one gather, and every row is a contiguous array
    (see ``world.Videos`` on why the layout is attribute-major)."""

    table: np.ndarray  # (len(_PROB_ROWS), n, m)

    @property
    def click(self) -> np.ndarray:
        return self.table[_CLICK]

    @property
    def watch_fraction(self) -> np.ndarray:
        return self.table[_FRACTION]

    @property
    def interaction(self) -> dict[str, np.ndarray]:
        return {name: self.table[_RATES + _FACTOR[name]] for name in _INTERACTIONS}

    @classmethod
    def of(
        cls,
        world: World,
        model: ResponseModel,
        users: np.ndarray,
        videos: np.ndarray,
        topic_clicks: np.ndarray | None = None,
        followed: np.ndarray | None = None,
        author_views: np.ndarray | None = None,
    ) -> VideoResponseProbs:
        """``users`` has shape (n,) and ``videos`` (n, m): one row of items per user. ``topic_clicks``
        (n, topics) counts each user's clicked views per topic earlier in the session (satiation);
        ``followed`` (n, m) says which videos are by an author the user follows; ``author_views`` (n, m)
        how many of the video's author's items the user has seen before (familiarity)."""
        v = world.videos
        attributes = np.take(v.attributes, videos, axis=1)  # (VIDEO_ATTRIBUTES, n, m)
        quality, bait, duration, factors = attributes[0], attributes[1], attributes[2], attributes[3:]
        topics = v.topic[videos]
        affinity = np.log(
            (world.users.interest[users[:, None], topics] * world.users.interest.shape[1]).astype(np.float32)
        )
        appeal = model.affinity_weight * affinity + model.quality_weight * quality
        if topic_clicks is not None:
            appeal -= (model.satiation * take_in_rows(topic_clicks, topics)).astype(np.float32)
        if followed is not None:
            appeal += model.follow_affinity * followed
        if author_views is not None:
            saturation = model.familiarity_saturation_views
            appeal += model.familiarity_appeal * np.minimum(author_views, saturation) / saturation
        table = np.empty((len(_PROB_ROWS), *videos.shape), np.float32)
        table[_CLICK] = _sigmoid(
            model.click_bias
            + model.click_appeal * appeal
            + model.click_bait * bait
            + world.users.click_bias[users].astype(np.float32)[:, None]
        )
        table[_FRACTION] = _sigmoid(model.watch_bias + model.watch_appeal * appeal - model.watch_bait * bait)
        table[_DURATION] = duration
        # each signal has its own user and item factor on top of the shared appeal (distinct drivers):
        # rate * exp(sensitivity * appeal) * the user's factor * the item's factor
        user_factors = np.exp(world.users.propensity[users]).T.astype(np.float32)  # (FACTOR_SIGNALS, n)
        shared = np.exp(model.interaction_appeal * appeal)
        rates = (model.like_rate, model.follow_rate, model.comment_rate, model.share_rate)
        for i, rate in enumerate(rates):
            np.minimum((rate * user_factors[i])[:, None] * shared * factors[i], 0.9, out=table[_RATES + i])
        if followed is not None:  # a user cannot follow an author twice: the button reads "following"
            table[_RATES + _INTERACTIONS.index("follow")][followed] = 0.0
        hate = np.exp(model.hate_bait * bait - model.hate_appeal * appeal) * factors[-1]
        np.minimum((model.hate_rate * user_factors[-1])[:, None] * hate, 0.9, out=table[_HATE])
        return cls(table)

    def take(self, columns: np.ndarray) -> VideoResponseProbs:
        """The probabilities of the items at ``columns`` (n, k) of each row (the ranked ones)."""
        return VideoResponseProbs(take_in_rows(self.table, columns, row_axis=1))

    def expected(self, model: ResponseModel) -> np.ndarray:
        """Expected per-view responses (n, m, 7), on a last axis in FEED_RESPONSE_COLUMNS order."""
        t = self.table
        click, duration = t[_CLICK], t[_DURATION]
        out = np.empty((*click.shape, len(FEED_RESPONSE_COLUMNS)), np.float32)
        out[..., 0] = click * duration * t[_FRACTION] + (1.0 - click) * np.minimum(model.preview_s, duration)
        out[..., 1] = click
        for i in range(len(_INTERACTIONS)):
            out[..., 2 + i] = click * t[_RATES + i]
        out[..., 6] = t[_HATE]
        return out

    def sample(self, model: ResponseModel, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Realised responses (n, k, 7) in FEED_RESPONSE_COLUMNS order, and the satisfaction of each view,
        from ``uniforms`` (n, k, 7): click, watch fraction, like, follow, comment, share, hate.

        The watch fraction of a click is Beta(1, b) with b = (1 - m) / m, whose mean is the model's m:
        the one beta family with a closed-form quantile, 1 - (1 - u)^(1 / b), so the draw is a function of
        its uniform (common random numbers, ``recsys_rl.sim.draws``). Its density falls from 0 for m < 0.5
        (most clicked videos abandoned early) and rises to 1 for m > 0.5 (most watched to the end), the two
        shapes of KuaiRand's play-ratio distribution.
        """
        t = self.table
        out = np.empty((*t.shape[1:], len(FEED_RESPONSE_COLUMNS)))
        clicked = uniforms[..., 0] < t[_CLICK]
        m = t[_FRACTION]
        fraction = 1.0 - (1.0 - uniforms[..., 1]) ** (m / (1.0 - m))
        out[..., 0] = np.where(clicked, fraction * t[_DURATION], np.minimum(model.preview_s, t[_DURATION]))
        out[..., 1] = clicked
        satisfaction = np.where(clicked, fraction, model.sat_skip)
        weights = (model.sat_like, model.sat_follow, model.sat_comment, model.sat_share)
        for i, weight in enumerate(weights):
            interacted = clicked & (uniforms[..., 2 + i] < t[_RATES + i])
            out[..., 2 + i] = interacted
            satisfaction += weight * interacted
        hate = uniforms[..., 6] < t[_HATE]
        out[..., 6] = hate
        return out, satisfaction - model.sat_hate * hate


@dataclass(frozen=True)
class LiveResponseProbs:
    """Entry probability, expected watch and gift rate of users for the live stream offered to them."""

    enter: np.ndarray
    watch_mean_s: np.ndarray
    gift_rate: np.ndarray
    live_affinity: np.ndarray

    @classmethod
    def of(
        cls, world: World, model: ResponseModel, users: np.ndarray, lives: np.ndarray
    ) -> LiveResponseProbs:
        affinity = world.users.live_affinity[users]
        quality = world.lives.quality[lives]
        enter = _sigmoid(
            model.live_enter_bias
            + model.live_enter_affinity * (affinity - model.live_affinity_pivot)
            + model.live_enter_quality * quality
        )
        watch_mean = model.live_watch_mean_s * (0.5 + 2.0 * affinity) * np.exp(0.3 * quality)
        return cls(enter, watch_mean, model.live_gift_rate * affinity, affinity)

    def expected(self, model: ResponseModel) -> tuple[np.ndarray, np.ndarray]:
        """Expected live watch seconds and gift value of one live view."""
        return self.enter * self.watch_mean_s, self.enter * self.gift_rate * model.live_gift_mean

    def sample(self, model: ResponseModel, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Realised live watch seconds, gift value and satisfaction of one live view per user, from
        ``uniforms`` (n, 4): entry, watch, gift, gift value (exponentials by their quantile).

        A user who skips the live stream is mildly annoyed in proportion to how little they like live
        content, which is what makes over-allocation cost short-video time through earlier exits.
        """
        entered = uniforms[:, 0] < self.enter
        watch = np.where(entered, -self.watch_mean_s * np.log(uniforms[:, 1]), 0.0)
        gifted = entered & (uniforms[:, 2] < self.gift_rate)
        gift = np.where(gifted, -model.live_gift_mean * np.log(uniforms[:, 3]), 0.0)
        satisfaction = np.where(
            entered, np.minimum(watch / 30.0, 2.0), -model.live_skip_dislike * (1.0 - self.live_affinity)
        )
        return watch, gift, satisfaction
