"""Configuration of the short-video simulator.

Two dataclasses: ``SimConfig`` sizes the world and the sessions (what a user of the simulator changes),
``ResponseModel`` holds the calibrated coefficients of how users respond (what calibration changes).
The response constants were tuned so that the behaviour policy's per-view rates land inside the KuaiRand
ranges of DESIGN 11; ``tests/unit/test_sim_calibration.py`` guards that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recsys_rl.sim.familiarity import MOST_COUNTED
from recsys_rl.state import ACTIVITY_GROUPS


@dataclass(frozen=True)
class ResponseModel:
    """Coefficients of the user response model (logits, rates and their sensitivities)."""

    # appeal = affinity_weight * log topic affinity + quality_weight * quality: what makes an item good
    affinity_weight: float = 0.6
    quality_weight: float = 0.5
    # click (per view): sigmoid(click_bias + click_appeal * appeal + click_bait * clickbait + user bias)
    click_bias: float = -1.0
    click_appeal: float = 0.5
    click_bait: float = 2.0
    # mean watch fraction of a clicked item (Beta(1, b) around it, responses.py): sigmoid(watch_bias +
    # watch_appeal * appeal - watch_bait * clickbait)
    watch_bias: float = 0.5
    watch_appeal: float = 0.8
    watch_bait: float = 2.5
    # seconds a non-clicked item is on screen before the swipe
    preview_s: float = 2.5
    # interactions given a click: rate * exp(sensitivity * appeal), capped below 1
    like_rate: float = 0.0122
    follow_rate: float = 0.00045
    comment_rate: float = 0.0025
    share_rate: float = 0.0011
    interaction_appeal: float = 0.8
    # hate (per view): hate_rate * exp(-hate_appeal * appeal + hate_bait * clickbait)
    hate_rate: float = 0.0007
    hate_appeal: float = 0.8
    hate_bait: float = 2.0
    # satisfaction of one view, which drives exits and next-day return
    sat_like: float = 2.0
    sat_follow: float = 3.0
    sat_comment: float = 1.0
    sat_share: float = 1.0
    sat_hate: float = 5.0
    sat_skip: float = -0.15
    # within a session, each earlier clicked view of a topic lowers the appeal of its videos (satiation)
    satiation: float = 0.15
    # appeal added to the videos of an author the user follows
    follow_affinity: float = 0.3
    # familiarity (mere exposure, docs/simulator.md "Familiarity"): appeal added to an author's videos
    # after the user has seen that author's items, growing linearly to its full size at
    # familiarity_saturation_views earlier views, then flat
    familiarity_appeal: float = 0.27
    familiarity_saturation_views: int = 10
    # per-view exit probability:
    #   exit_base[group] * exp(-exit_satisfaction * (sat - exit_reference) - patience_weight * patience)
    # where patience is the session so far: patience <- patience_decay * patience + (sat - exit_reference)
    exit_satisfaction: float = 1.5
    exit_reference: float = 0.3
    patience_weight: float = 0.3
    patience_decay: float = 0.9
    # next-day return: sigmoid(logit(return_base[group]) + return_satisfaction * (remembered - reference)),
    # where a day's retention satisfaction is its mean view satisfaction plus the user's social weight
    # times return_interactions times (interactions per view - interaction_reference), and the
    # remembered satisfaction is its exponential average over days (memory: the weight of older days)
    return_satisfaction: float = 4.0
    return_reference: float = 0.3
    return_interactions: float = 25.0
    interaction_reference: float = 0.018
    return_memory: float = 0.5
    # live streams: entry, watch and gifts for users with live affinity; a dislike for users without
    live_enter_bias: float = -1.0
    live_enter_affinity: float = 3.0
    live_enter_quality: float = 0.5
    live_affinity_pivot: float = 0.3
    live_watch_mean_s: float = 40.0
    live_gift_rate: float = 0.12
    live_gift_mean: float = 5.0
    live_skip_dislike: float = 1.0
    # noise of the upstream ranker's predictions (log-normal sigma)
    prediction_noise: float = 0.3


@dataclass(frozen=True)
class SimConfig:
    """Sizes of the simulated world and its sessions."""

    n_users: int = 1_000
    n_videos: int = 20_000
    n_authors: int = 2_000
    n_topics: int = 16
    n_lives: int = 200
    #: candidates the upstream ranker supplies per request (the policy re-ranks them)
    n_candidates: int = 20
    #: items returned per feed page
    page_size: int = 6
    #: a session ends after this many pages even if the user would go on
    max_pages: int = 30
    #: probability that a user belongs to each activity group, in ACTIVITY_GROUPS order
    group_probs: tuple[float, ...] = (0.2, 0.3, 0.25, 0.25)
    #: mean sessions per returning day, per group
    sessions_per_day: tuple[float, ...] = (3.0, 2.0, 1.5, 1.1)
    #: day-one return probability, and the baseline of later days, per group
    return_base: tuple[float, ...] = (0.95, 0.85, 0.65, 0.4)
    #: per-view exit probability at reference satisfaction, per group
    exit_base: tuple[float, ...] = (0.025, 0.035, 0.05, 0.07)
    #: Dirichlet concentration of user topic interests (small: users like few topics)
    interest_concentration: float = 0.3
    #: share of interest every topic keeps at least (times 1 / n_topics), so that every topic stays reachable
    interest_floor: float = 0.05
    #: daily step of a user's interests toward the topics they watched that day (interest drift)
    interest_drift: float = 0.1
    #: candidates per request drawn from followed authors' videos, for a user who follows someone
    followed_candidates: int = 2
    #: spread (log-normal sigma) of how many videos each author posts: a few prolific authors post most of
    #: the catalogue (docs/simulator.md, "Authors' supply")
    author_output_spread: float = 1.0
    #: share of each author's videos on the author's own topic (their niche); the rest on random topics
    #: (docs/simulator.md, "Authors' niches")
    author_niche_share: float = 0.7
    #: spread (log-normal sigma) of each user's own rate of like, follow, comment, share and hate, drawn
    #: independently per signal, and of each video's (an author's, for follows): distinct drivers per
    #: signal (docs/simulator.md)
    user_signal_spread: float = 0.6
    item_signal_spread: float = 0.6
    #: correlation between a user's like propensity and how much interactions bring them back
    social_link: float = 0.7
    #: fraction of requests for which upstream offers a live stream to allocate
    live_availability: float = 0.5
    #: page slot that an allocated live stream takes
    live_position: int = 2
    #: event time of day 0, 00:00 UTC, in milliseconds since the epoch (2026-01-01)
    start_time_ms: int = 1_767_225_600_000
    #: minimum inactivity between two sessions of a user: above the 30-minute sessionisation gap
    min_session_gap_s: float = 31 * 60.0
    #: seconds of swipe and load overhead per viewed item
    item_overhead_s: float = 1.5
    response: ResponseModel = field(default_factory=ResponseModel)

    def __post_init__(self) -> None:
        positive = {
            "n_users": self.n_users,
            "n_videos": self.n_videos,
            "n_authors": self.n_authors,
            "n_topics": self.n_topics,
            "n_lives": self.n_lives,
            "n_candidates": self.n_candidates,
            "page_size": self.page_size,
            "max_pages": self.max_pages,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"SimConfig.{name} should be at least 1, but is {value}")
        if self.n_videos < self.n_topics:
            raise ValueError(
                f"SimConfig.n_videos should be at least n_topics={self.n_topics}, but is {self.n_videos}"
            )
        if self.page_size > self.n_candidates:
            raise ValueError(
                f"SimConfig.page_size should be at most n_candidates={self.n_candidates}, "
                f"but is {self.page_size}"
            )
        if not 0 <= self.live_position < self.page_size:
            raise ValueError(
                f"SimConfig.live_position should be in [0, {self.page_size}), but is {self.live_position}"
            )
        per_group = {
            "group_probs": self.group_probs,
            "sessions_per_day": self.sessions_per_day,
            "return_base": self.return_base,
            "exit_base": self.exit_base,
        }
        for name, values in per_group.items():
            if len(values) != len(ACTIVITY_GROUPS):
                raise ValueError(
                    f"SimConfig.{name} should have {len(ACTIVITY_GROUPS)} values (one per activity group), "
                    f"but has {len(values)}"
                )
        if abs(sum(self.group_probs) - 1.0) > 1e-6:
            raise ValueError(f"SimConfig.group_probs should sum to 1, but sums to {sum(self.group_probs)}")
        if not 1 <= self.response.familiarity_saturation_views <= MOST_COUNTED:
            raise ValueError(
                "SimConfig.response.familiarity_saturation_views (the views at which familiarity is full, "
                f"counted in a byte) should be in [1, {MOST_COUNTED}], but is "
                f"{self.response.familiarity_saturation_views}"
            )
        shares = {"live_availability": self.live_availability, "author_niche_share": self.author_niche_share}
        for name, value in shares.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"SimConfig.{name} should be in [0, 1], but is {value}")
        spreads = {
            "author_output_spread": self.author_output_spread,
            "user_signal_spread": self.user_signal_spread,
            "item_signal_spread": self.item_signal_spread,
        }
        for name, value in spreads.items():
            if not value >= 0.0:
                raise ValueError(f"SimConfig.{name} is a standard deviation, so at least 0, but is {value}")
