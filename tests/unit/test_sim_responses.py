"""What a simulated user does: distinct drivers per signal, satiation and patience within a session."""

from __future__ import annotations

import dataclasses

import numpy as np

from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.responses import VideoResponseProbs
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
