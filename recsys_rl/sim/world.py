"""The static world of a simulation: users, videos and live streams, drawn once from a seed.

Everything is a column array indexed by id so that a whole batch of requests can be simulated with numpy
fancy indexing. A simulator changes only its own copy of the users' interests (``interests``, drift);
what the platform learns of its users is in ``stored_features``, who follows whom in ``follows``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys_rl.sim.parameters import SimConfig
from recsys_rl.state import ACTIVITY_GROUPS

#: The signals that have their own user and item factors (docs/simulator.md, "Distinct drivers").
FACTOR_SIGNALS: tuple[str, ...] = ("like", "follow", "comment", "share", "hate")


@dataclass(frozen=True)
class Users:
    group: np.ndarray  # (n,) int: activity group id
    interest: np.ndarray  # (n, topics): topic preference, rows sum to 1 (hidden from policies)
    click_bias: np.ndarray  # (n,): personal click propensity (hidden)
    live_affinity: np.ndarray  # (n,) in [0, 1]: liking for live streams (hidden)
    propensity: np.ndarray  # (n, len(FACTOR_SIGNALS)): log-factor of each signal's rate (hidden)
    social: np.ndarray  # (n,) in (0, 1): how much interactions bring the user back (hidden)


#: Columns of ``Videos.attributes``: the float attributes the response model reads for every candidate.
VIDEO_ATTRIBUTES: tuple[str, ...] = (
    "quality",
    "clickbait",
    "duration_s",
    *(f"factor_{s}" for s in FACTOR_SIGNALS),
)
_FACTORS = slice(VIDEO_ATTRIBUTES.index("factor_like"), len(VIDEO_ATTRIBUTES))


@dataclass(frozen=True)
class Videos:
    """The catalogue. Its float attributes are stored attribute-major, one contiguous row per attribute:
    the response model gathers every candidate's value of one attribute at a time and then computes on
    contiguous (requests, candidates) arrays. With one column per video and the attributes side by side,
    every elementwise step strode over the short attribute axis, and the model ran at half the speed."""

    topic: np.ndarray  # (n,) int, videos are sorted by topic
    author: np.ndarray  # (n,) int
    # (len(VIDEO_ATTRIBUTES), n) float64: quality (standard normal); clickbait in [0, 1] (raises clicks,
    # lowers the watch fraction, raises hates); duration in seconds; the factor (mean 1) that multiplies
    # each factor signal's rate (follow: the author's). Factors, not their logs: the response model
    # multiplies them in rather than taking one exponential per signal and candidate.
    attributes: np.ndarray
    topic_start: np.ndarray  # (topics,) first video index of each topic
    topic_count: np.ndarray  # (topics,) number of videos of each topic

    @property
    def quality(self) -> np.ndarray:
        return self.attributes[0]

    @property
    def clickbait(self) -> np.ndarray:
        return self.attributes[1]

    @property
    def duration_s(self) -> np.ndarray:
        return self.attributes[2]

    @property
    def signal_factors(self) -> np.ndarray:
        """(len(FACTOR_SIGNALS), n) factors of each signal's rate, in FACTOR_SIGNALS order."""
        return self.attributes[_FACTORS]


@dataclass(frozen=True)
class Lives:
    quality: np.ndarray  # (n,) standard normal
    author: np.ndarray  # (n,) int


@dataclass(frozen=True)
class World:
    users: Users
    videos: Videos
    lives: Lives

    @classmethod
    def of_seed(cls, config: SimConfig, seed: int) -> World:
        """The world a simulator run with ``seed`` plays in (its world stream, child 0 of the seed), for
        whoever needs what is hidden in it: a benchmark's author table, an oracle's user traits."""
        return cls.generate(config, np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,))))

    @classmethod
    def generate(cls, config: SimConfig, rng: np.random.Generator) -> World:
        return cls(
            users=_generate_users(config, rng),
            videos=_generate_videos(config, rng),
            lives=Lives(
                quality=rng.standard_normal(config.n_lives),
                author=rng.integers(0, config.n_authors, config.n_lives),
            ),
        )


def _log_factors(rng: np.random.Generator, shape, spread: float) -> np.ndarray:
    """Normal log-factors whose exponent has mean 1: they spread a rate without moving its average."""
    return spread * rng.standard_normal(shape) - spread**2 / 2.0


def _generate_users(config: SimConfig, rng: np.random.Generator) -> Users:
    n = config.n_users
    group = rng.choice(len(ACTIVITY_GROUPS), size=n, p=np.asarray(config.group_probs))
    interest = rng.dirichlet(np.full(config.n_topics, config.interest_concentration), size=n)
    # A floor keeps every topic reachable: the candidate generator samples topics from these weights.
    interest = (1.0 - config.interest_floor) * interest + config.interest_floor / config.n_topics
    click_bias = 0.3 * rng.standard_normal(n)
    live_affinity = rng.beta(0.6, 2.0, size=n)
    propensity = _log_factors(rng, (n, len(FACTOR_SIGNALS)), config.user_signal_spread)
    # users who like a lot tend to be the ones whom interactions bring back: the link makes the trait
    # visible in logged history (hist_interaction_rate), as personalisation needs
    like = (propensity[:, 0] + config.user_signal_spread**2 / 2.0) / config.user_signal_spread
    link = config.social_link
    social = 1.0 / (1.0 + np.exp(-(link * like + np.sqrt(1.0 - link**2) * rng.standard_normal(n))))
    return Users(group, interest, click_bias, live_affinity, propensity, social)


def _generate_videos(config: SimConfig, rng: np.random.Generator) -> Videos:
    n = config.n_videos
    # each author posts at their own rate, heavy-tailed across authors; the catalogue is what they posted
    output = np.exp(config.author_output_spread * rng.standard_normal(config.n_authors))
    author = rng.choice(config.n_authors, size=n, p=output / output.sum())
    # most of an author's videos are on the author's own topic, the rest anywhere (authors' niches)
    niche = rng.integers(0, config.n_topics, config.n_authors)
    on_niche = rng.random(n) < config.author_niche_share
    topic = np.where(on_niche, niche[author], rng.integers(0, config.n_topics, n))
    # Every topic gets at least one video so that candidate sampling never hits an empty topic.
    topic[: config.n_topics] = np.arange(config.n_topics)
    by_topic = np.argsort(topic, kind="stable")
    topic, author = topic[by_topic], author[by_topic]
    counts = np.bincount(topic, minlength=config.n_topics)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    duration_s = np.clip(rng.lognormal(np.log(26.0), 0.55, n), 5.0, 300.0)
    quality = rng.standard_normal(n)
    clickbait = rng.beta(1.0, 6.0, n)
    appeal = _log_factors(rng, (n, len(FACTOR_SIGNALS)), config.item_signal_spread)
    # a follow goes to the author, so its pull is the author's, shared by all their videos
    follow = FACTOR_SIGNALS.index("follow")
    appeal[:, follow] = _log_factors(rng, config.n_authors, config.item_signal_spread)[author]
    attributes = np.vstack([quality, clickbait, duration_s, np.exp(appeal).T]).astype(np.float32)
    return Videos(topic, author, attributes, starts, counts)
