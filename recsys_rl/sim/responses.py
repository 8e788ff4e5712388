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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class VideoResponseProbs:
    """Response probabilities of users for videos; arrays broadcast to one shape."""

    click: np.ndarray
    watch_fraction: np.ndarray  # mean fraction of the duration watched after a click
    duration_s: np.ndarray
    interaction: dict[str, np.ndarray]  # probability given a click
    hate: np.ndarray

    @classmethod
    def of(
        cls,
        world: World,
        model: ResponseModel,
        users: np.ndarray,
        videos: np.ndarray,
        topic_clicks: np.ndarray | None = None,
        followed: np.ndarray | None = None,
    ) -> VideoResponseProbs:
        """``users`` has shape (n,) and ``videos`` (n, m): one row of items per user. ``topic_clicks``
        (n, topics) counts each user's clicked views per topic earlier in the session (satiation);
        ``followed`` (n, m) says which videos are by an author the user follows."""
        v = world.videos
        topics = v.topic[videos]
        affinity = np.log(world.users.interest[users[:, None], topics] * world.users.interest.shape[1])
        appeal = model.affinity_weight * affinity + model.quality_weight * v.quality[videos]
        if topic_clicks is not None:
            appeal = appeal - model.satiation * np.take_along_axis(topic_clicks, topics, axis=1)
        if followed is not None:
            appeal = appeal + model.follow_affinity * followed
        bait = v.clickbait[videos]
        click = _sigmoid(
            model.click_bias
            + model.click_appeal * appeal
            + model.click_bait * bait
            + world.users.click_bias[users][:, None]
        )
        fraction = _sigmoid(model.watch_bias + model.watch_appeal * appeal - model.watch_bait * bait)
        # each signal has its own user and item factor on top of the shared appeal (distinct drivers)
        factor = world.users.propensity[users][:, None, :] + v.appeal[videos]
        rates = {
            "like": model.like_rate,
            "follow": model.follow_rate,
            "comment": model.comment_rate,
            "share": model.share_rate,
        }
        shared = model.interaction_appeal * appeal
        interaction = {
            name: np.minimum(rate * np.exp(shared + factor[..., _FACTOR[name]]), 0.9)
            for name, rate in rates.items()
        }
        hate_logit = -model.hate_appeal * appeal + model.hate_bait * bait + factor[..., _FACTOR["hate"]]
        hate = np.minimum(model.hate_rate * np.exp(hate_logit), 0.9)
        return cls(click, fraction, v.duration_s[videos], interaction, hate)

    def take(self, columns: np.ndarray) -> VideoResponseProbs:
        """The probabilities of the items at ``columns`` (n, k) of each row (the ranked ones)."""

        def pick(values: np.ndarray) -> np.ndarray:
            return np.take_along_axis(values, columns, axis=1)

        interaction = {name: pick(values) for name, values in self.interaction.items()}
        return VideoResponseProbs(
            pick(self.click), pick(self.watch_fraction), pick(self.duration_s), interaction, pick(self.hate)
        )

    def expected(self, model: ResponseModel) -> np.ndarray:
        """Expected per-view responses, stacked on a last axis in FEED_RESPONSE_COLUMNS order."""
        preview = np.minimum(model.preview_s, self.duration_s)
        watch = self.click * self.duration_s * self.watch_fraction + (1.0 - self.click) * preview
        columns = [watch, self.click]
        columns += [self.click * self.interaction[name] for name in _INTERACTIONS]
        columns.append(self.hate)
        return np.stack(columns, axis=-1)

    def sample(self, model: ResponseModel, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Realised responses (..., 7) in FEED_RESPONSE_COLUMNS order, and the satisfaction of each view,
        from ``uniforms`` (..., 7): click, watch fraction, like, follow, comment, share, hate.

        The watch fraction of a click is Beta(1, b) with b = (1 - m) / m, whose mean is the model's m:
        the one beta family with a closed-form quantile, 1 - (1 - u)^(1 / b), so the draw is a function of
        its uniform (common random numbers, ``recsys_rl.sim.draws``). Its density falls from 0 for m < 0.5
        (most clicked videos abandoned early) and rises to 1 for m > 0.5 (most watched to the end), the two
        shapes of KuaiRand's play-ratio distribution.
        """
        clicked = uniforms[..., 0] < self.click
        m = self.watch_fraction
        fraction = 1.0 - (1.0 - uniforms[..., 1]) ** (m / (1.0 - m))
        preview = np.minimum(model.preview_s, self.duration_s)
        watch = np.where(clicked, fraction * self.duration_s, preview)
        draws = {
            name: clicked & (uniforms[..., 2 + i] < self.interaction[name])
            for i, name in enumerate(_INTERACTIONS)
        }
        hate = uniforms[..., 6] < self.hate
        satisfaction = (
            np.where(clicked, fraction, model.sat_skip)
            + model.sat_like * draws["like"]
            + model.sat_follow * draws["follow"]
            + model.sat_comment * draws["comment"]
            + model.sat_share * draws["share"]
            - model.sat_hate * hate
        )
        columns = [watch, clicked] + [draws[name] for name in _INTERACTIONS] + [hate]
        return np.stack(columns, axis=-1).astype(np.float64), satisfaction


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
