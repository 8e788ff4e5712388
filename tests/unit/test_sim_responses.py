"""What a simulated user does: distinct drivers per signal, satiation and patience within a session."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.responses import LiveResponseProbs, VideoResponseProbs
from recsys_rl.sim.simulator import Simulator
from recsys_rl.sim.world import FACTOR_SIGNALS, World

CONFIG = SimConfig(n_users=2000)
WORLD = World.generate(CONFIG, np.random.default_rng(0))
MODEL = CONFIG.response


def _without_signal_factors(world: World) -> World:
    users = dataclasses.replace(world.users, propensity=np.zeros_like(world.users.propensity))
    attributes = world.videos.attributes.copy()
    attributes[-len(FACTOR_SIGNALS) :] = 1.0  # every item multiplies each rate by one
    videos = dataclasses.replace(world.videos, attributes=attributes)
    return dataclasses.replace(world, users=users, videos=videos)


def _probs(world: World, topic_clicks=None) -> VideoResponseProbs:
    users = np.arange(CONFIG.n_users)
    videos = np.tile(np.arange(0, CONFIG.n_videos, 50), (users.size, 1))
    return VideoResponseProbs.of(world, MODEL, users, videos, topic_clicks)


def test_each_interaction_has_its_own_user_and_item_drivers():
    """A user who comments is not just a user who likes: their rates vary apart across users and items,
    so the four interaction constraints measure different things."""
    probs = _probs(WORLD)
    ratio = np.log(probs.interaction["comment"] / probs.interaction["like"])
    assert ratio.mean(axis=1).std() > 0.4  # across users
    assert ratio.mean(axis=0).std() > 0.4  # across videos
    # with the factors switched off, the ratio is the same constant everywhere
    flat = _without_signal_factors(WORLD)
    flat_ratio = np.log(_probs(flat).interaction["comment"] / _probs(flat).interaction["like"])
    assert flat_ratio.std() < 1e-5  # float32 rounding only


def test_factors_spread_the_rates_without_moving_their_average():
    spread = _probs(WORLD).interaction["share"].mean()
    flat = _without_signal_factors(WORLD)
    assert abs(spread / _probs(flat).interaction["share"].mean() - 1.0) < 0.1


def test_social_users_are_the_ones_who_like_more():
    """The hidden social trait shows in logged history through the like rate (personalisation can see it)."""
    like = WORLD.users.propensity[:, 0]
    assert np.corrcoef(like, WORLD.users.social)[0, 1] > 0.5


def test_earlier_clicks_on_a_topic_make_its_videos_less_appealing():
    fresh = _probs(WORLD)
    topics = WORLD.videos.topic[np.arange(0, CONFIG.n_videos, 50)]
    sated = np.zeros((CONFIG.n_users, CONFIG.n_topics))
    sated[:, topics[0]] = 3.0  # three clicked views of the first video's topic earlier in the session
    tired = _probs(WORLD, sated)
    same_topic = topics == topics[0]
    assert np.all(tired.click[:, same_topic] < fresh.click[:, same_topic])
    assert np.all(tired.watch_fraction[:, same_topic] < fresh.watch_fraction[:, same_topic])
    np.testing.assert_array_equal(tired.click[:, ~same_topic], fresh.click[:, ~same_topic])


def test_a_good_start_keeps_a_user_longer_once_patience_counts_the_session_so_far():
    """With patience, the leave hazard depends on the session so far, not only on the current view: the
    clicks of a session's first page say more about how long it lasts."""

    def first_page_clicks_vs_pages(patience_weight: float) -> float:
        response = dataclasses.replace(MODEL, patience_weight=patience_weight)
        config = dataclasses.replace(CONFIG, n_users=3000, response=response)
        feed = Simulator(config, 1).run_day(behaviour_feed_policy(), behaviour_allocation_policy()).feed
        first = feed.page == 0
        pages = np.bincount(feed.session)[feed.session[first]]
        return float(np.corrcoef(feed.reward[first, 1], pages)[0, 1])

    assert first_page_clicks_vs_pages(MODEL.patience_weight) > first_page_clicks_vs_pages(0.0) + 0.03


# The response model's equations (docs/simulator.md, "Immediate response") in float64 scalars, one user and
# video at a time, against the vectorised float32 model.
def _expected_probs(world: World, model, user: int, video: int, clicks: float, followed: bool, seen: int):
    quality, bait, duration, *factors = world.videos.attributes[:, video]
    topic = world.videos.topic[video]
    appeal = (
        model.affinity_weight * math.log(world.users.interest[user, topic] * world.users.interest.shape[1])
        + model.quality_weight * quality
        - model.satiation * clicks
        + model.follow_affinity * followed
        + model.familiarity_appeal
        * min(seen, model.familiarity_saturation_views)
        / model.familiarity_saturation_views
    )
    user_factor = np.exp(world.users.propensity[user])
    click = _logistic(
        model.click_bias
        + model.click_appeal * appeal
        + model.click_bait * bait
        + world.users.click_bias[user]
    )
    fraction = _logistic(model.watch_bias + model.watch_appeal * appeal - model.watch_bait * bait)
    rates = [
        min(rate * user_factor[i] * math.exp(model.interaction_appeal * appeal) * factors[i], 0.9)
        for i, rate in enumerate((model.like_rate, model.follow_rate, model.comment_rate, model.share_rate))
    ]
    if followed:
        rates[1] = 0.0
    hate = min(
        model.hate_rate
        * user_factor[-1]
        * math.exp(model.hate_bait * bait - model.hate_appeal * appeal)
        * factors[-1],
        0.9,
    )
    return [click, fraction, duration, *rates, hate]


def _logistic(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.parametrize(
    "model",
    [MODEL, dataclasses.replace(MODEL, like_rate=3.0, hate_rate=3.0)],  # the second reaches the 0.9 caps
    ids=["default", "capped"],
)
def test_video_response_probabilities_follow_the_documented_equations(model):
    users, videos = (
        np.array([3, 3, 70, 1999]),
        np.array([[5, 900, 7_000], [12, 13, 14], [0, 1, 2], [8, 9, 10]]),
    )
    clicks = np.zeros((users.size, CONFIG.n_topics))
    clicks[0, WORLD.videos.topic[900]] = 2.0
    followed = np.zeros(videos.shape, bool)
    followed[[0, 2], [1, 0]] = True
    seen = np.array([[0, 3, 40], [1, 0, 10], [0, 0, 0], [5, 5, 5]])
    probs = VideoResponseProbs.of(WORLD, model, users, videos, clicks, followed, seen)
    assert probs.table.dtype == np.float32
    for (row, column), video in np.ndenumerate(videos):
        user = users[row]
        topic_clicks = clicks[row, WORLD.videos.topic[video]]
        expected = _expected_probs(
            WORLD, model, user, video, topic_clicks, followed[row, column], seen[row, column]
        )
        np.testing.assert_allclose(probs.table[:, row, column], expected, rtol=2e-5)
    if model is not MODEL:
        assert (probs.table[3] == np.float32(0.9)).any() and (probs.table[-1] == np.float32(0.9)).any()
    # and the expected responses from them: a skipped video still plays its preview
    t = probs.table.astype(np.float64)
    click, fraction, duration = t[0], t[1], t[2]
    expected = probs.expected(model)
    assert expected.dtype == np.float32
    np.testing.assert_allclose(
        expected,
        np.stack(
            [click * duration * fraction + (1 - click) * np.minimum(model.preview_s, duration), click]
            + [click * t[3 + i] for i in range(4)]
            + [t[7]],
            axis=-1,
        ),
        rtol=1e-5,
    )


def test_video_responses_are_drawn_from_their_own_uniforms():
    """Each response reads its own column of uniforms and happens below its probability, not at it; the
    watch of a click is the Beta(1, (1 - m) / m) quantile of its uniform."""
    probs = VideoResponseProbs(
        np.array([[[0.5]], [[0.25]], [[40.0]], [[0.4]], [[0.3]], [[0.2]], [[0.1]], [[0.05]]], np.float32)
    )
    table = probs.table[:, 0, 0].astype(np.float64)
    m = table[1]
    # a click, its watch uniform 0.75; each interaction just below (like, comment) or at its probability
    uniforms = np.array([[[0.25, 0.75, table[3] - 1e-9, table[4], table[5] - 1e-9, table[6], table[7]]]])
    out, satisfaction = probs.sample(MODEL, uniforms)
    fraction = 1.0 - 0.25 ** (m / (1.0 - m))
    np.testing.assert_allclose(out[0, 0], [fraction * 40.0, 1, 1, 0, 1, 0, 0])
    np.testing.assert_allclose(satisfaction[0, 0], fraction + MODEL.sat_like + MODEL.sat_comment)
    # at its probability nothing happens: no click (the preview plays), and no hate
    skipped = uniforms.copy()
    skipped[..., 0] = table[0]
    out, satisfaction = probs.sample(MODEL, skipped)
    np.testing.assert_allclose(out[0, 0], [MODEL.preview_s, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(satisfaction[0, 0], MODEL.sat_skip)
    hated = skipped.copy()
    hated[..., 6] = table[7] - 1e-9
    out, satisfaction = probs.sample(MODEL, hated)
    assert out[0, 0, 6] == 1
    np.testing.assert_allclose(satisfaction[0, 0], MODEL.sat_skip - MODEL.sat_hate)


def test_live_responses_follow_the_documented_equations():
    users, lives = np.array([0, 5, 1999]), np.array([3, 3, 7])
    probs = LiveResponseProbs.of(WORLD, MODEL, users, lives)
    affinity, quality = WORLD.users.live_affinity[users], WORLD.lives.quality[lives]
    enter = [
        _logistic(
            MODEL.live_enter_bias
            + MODEL.live_enter_affinity * (a - MODEL.live_affinity_pivot)
            + MODEL.live_enter_quality * q
        )
        for a, q in zip(affinity, quality, strict=True)
    ]
    np.testing.assert_allclose(probs.enter, enter)
    mean_watch = MODEL.live_watch_mean_s * (0.5 + 2.0 * affinity) * np.exp(0.3 * quality)
    np.testing.assert_allclose(probs.watch_mean_s, mean_watch)
    np.testing.assert_allclose(probs.gift_rate, MODEL.live_gift_rate * affinity)
    watch, gift = probs.expected(MODEL)
    np.testing.assert_allclose(watch, probs.enter * mean_watch)
    np.testing.assert_allclose(gift, probs.enter * probs.gift_rate * MODEL.live_gift_mean)
    # entered (its gift uniform at the rate: no gift), entered and gifted (just below the rate), not entered
    # (its entry uniform at the probability)
    uniforms = np.array(
        [
            [probs.enter[0] / 2, 0.9, probs.gift_rate[0], 0.2],
            [probs.enter[1] / 2, 0.01, probs.gift_rate[1] - 1e-9, 0.2],
            [probs.enter[2], 0.5, 0.0001, 0.2],
        ]
    )
    watch, gift, satisfaction = probs.sample(MODEL, uniforms)
    drawn = -mean_watch[:2] * np.log([0.9, 0.01])
    np.testing.assert_allclose(watch, [*drawn, 0.0])
    np.testing.assert_allclose(gift, [0.0, -MODEL.live_gift_mean * math.log(0.2), 0.0])
    np.testing.assert_allclose(
        satisfaction, [*np.minimum(drawn / 30.0, 2.0), -MODEL.live_skip_dislike * (1.0 - affinity[2])]
    )
    assert drawn[1] / 30.0 > 2.0 > drawn[0] / 30.0  # one capped, one not
