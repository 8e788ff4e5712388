"""The static world (``recsys_rl.sim.world``): its draws have the distributions the docstrings and
docs/simulator.md give them, so a changed constant shows as a changed world, not as a quiet drift of
every benchmark."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.world import FACTOR_SIGNALS, World

CONFIG = SimConfig(n_users=40_000, n_videos=60_000, n_authors=3_000, n_lives=5_000)


@pytest.fixture
def world() -> World:
    # one per test, not per module: the mutation run credits a module fixture's calls to its first test
    return World.generate(CONFIG, np.random.default_rng(11))


def _close(sample: np.ndarray, mean: float, tolerance: float) -> None:
    assert sample.mean() == pytest.approx(mean, abs=tolerance)


def test_users_traits_have_their_documented_distributions(world):
    users = world.users
    groups = np.bincount(users.group, minlength=len(CONFIG.group_probs)) / CONFIG.n_users
    np.testing.assert_allclose(groups, CONFIG.group_probs, atol=0.01)
    # interests are distributions that keep every topic at the floor's share or more
    np.testing.assert_allclose(users.interest.sum(axis=1), 1.0)
    floor = CONFIG.interest_floor / CONFIG.n_topics
    assert users.interest.min() >= floor and users.interest.min() < 1.05 * floor
    assert users.click_bias.std() == pytest.approx(0.3, rel=0.03)
    _close(users.live_affinity, 0.6 / 2.6, 0.005)  # Beta(0.6, 2.0)
    assert users.live_affinity.std() == pytest.approx(np.sqrt(0.6 * 2.0 / (2.6**2 * 3.6)), rel=0.03)
    # each signal's log-factor spreads its rate without moving the average: exp has mean 1
    factors = np.exp(users.propensity)
    np.testing.assert_allclose(factors.mean(axis=0), 1.0, atol=0.02)
    np.testing.assert_allclose(users.propensity.std(axis=0), CONFIG.user_signal_spread, rtol=0.03)


def test_the_social_trait_is_a_logistic_of_a_unit_normal_linked_to_the_like_propensity(world):
    users = world.users
    assert ((users.social > 0) & (users.social < 1)).all()
    logit = np.log(users.social / (1 - users.social))
    spread = CONFIG.user_signal_spread
    like = (users.propensity[:, FACTOR_SIGNALS.index("like")] + spread**2 / 2) / spread  # unit normal
    _close(logit, 0.0, 0.02)
    assert logit.std() == pytest.approx(1.0, rel=0.02)
    assert np.corrcoef(logit, like)[0, 1] == pytest.approx(CONFIG.social_link, abs=0.01)


def test_videos_are_sorted_by_topic_with_each_topics_range_and_their_attributes(world):
    videos = world.videos
    assert (np.diff(videos.topic) >= 0).all()
    counts = np.bincount(videos.topic, minlength=CONFIG.n_topics)
    np.testing.assert_array_equal(videos.topic_count, counts)
    np.testing.assert_array_equal(videos.topic_start, np.r_[0, np.cumsum(counts)[:-1]])
    assert videos.attributes.dtype == np.float32
    # clipped to [5, 300] s: 0.13% of a lognormal's draws fall below 5 s, so the lower clip binds
    assert videos.duration_s.min() == 5.0 and videos.duration_s.max() <= 300.0
    assert np.median(videos.duration_s) == pytest.approx(26.0, rel=0.02)  # lognormal(log 26, 0.55)
    assert np.log(videos.duration_s).std() == pytest.approx(0.55, rel=0.03)
    _close(videos.clickbait, 1 / 7, 0.003)  # Beta(1, 6)
    assert videos.clickbait.std() == pytest.approx(np.sqrt(6 / (49 * 8)), rel=0.03)
    np.testing.assert_allclose(videos.signal_factors.mean(axis=1), 1.0, atol=0.03)


def test_authors_keep_to_a_niche_of_any_topic_and_a_follow_factor_of_their_own(world):
    videos = world.videos
    per_author = np.zeros((CONFIG.n_authors, CONFIG.n_topics), int)
    np.add.at(per_author, (videos.author, videos.topic), 1)
    prolific = per_author.sum(axis=1) >= 40
    niche_share = per_author[prolific].max(axis=1) / per_author[prolific].sum(axis=1)
    expected = CONFIG.author_niche_share + (1 - CONFIG.author_niche_share) / CONFIG.n_topics
    _close(niche_share, expected, 0.015)
    niches = per_author[prolific].argmax(axis=1)
    assert set(niches) == set(range(CONFIG.n_topics))  # topic 0 and the last can be a niche
    off_niche = per_author[prolific].copy()
    off_niche[np.arange(len(niches)), niches] = 0
    spread = off_niche.sum(axis=0)  # the rest of an author's videos go to any topic alike
    assert spread.min() > 0.8 * spread.mean()
    # the follow factor is the author's: one value across all of an author's videos
    follow = videos.signal_factors[FACTOR_SIGNALS.index("follow")]
    first = np.unique(videos.author, return_index=True)[1]
    np.testing.assert_array_equal(follow, follow[first][np.searchsorted(videos.author[first], videos.author)])
    assert world.lives.author.min() == 0 and world.lives.author.max() == CONFIG.n_authors - 1


def test_a_seeds_world_is_the_first_child_of_the_seed_apart_from_the_users_draws():
    """``World.of_seed`` is the world a simulator run with that seed plays in, which benchmarks read the
    hidden traits of: the seed's first spawned child, so it cannot share a stream with the users' draws
    (children (1, episode), ``Simulator``)."""
    small = SimConfig(n_users=50, n_videos=200, n_authors=20, n_lives=10)
    first_child = np.random.SeedSequence(5).spawn(1)[0]
    expected = World.generate(small, np.random.default_rng(first_child))
    world = World.of_seed(small, 5)
    np.testing.assert_array_equal(world.users.interest, expected.users.interest)
    np.testing.assert_array_equal(world.videos.author, expected.videos.author)
    root = World.generate(small, np.random.default_rng(np.random.SeedSequence(5)))
    assert not np.array_equal(world.users.interest, root.users.interest)
