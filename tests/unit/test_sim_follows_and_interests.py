"""Follows persist and feed the user their authors; interests drift toward what the user watched."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.follows import FollowGraph
from recsys_rl.sim.interests import drifted
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.responses import VideoResponseProbs
from recsys_rl.sim.simulator import Simulator

VIDEO_AUTHOR = np.array([0, 1, 1, 2, 2, 2, 4])  # author 3 has no videos


def test_a_follow_is_remembered_once_and_found_by_user_and_author():
    graph = FollowGraph(n_authors=5, video_author=VIDEO_AUTHOR)
    assert not graph.following_anyone(np.array([0, 1])).any()
    graph.add(np.array([0, 0, 2]), np.array([1, 1, 2]))
    assert len(graph) == 2
    assert graph.following_anyone(np.array([0, 1, 2, 3])).tolist() == [True, False, True, False]
    assert graph.follows(np.array([0, 0, 2, 1]), np.array([1, 2, 2, 1])).tolist() == [
        True,
        False,
        True,
        False,
    ]


def test_followed_videos_are_by_followed_authors_and_none_for_others():
    graph = FollowGraph(n_authors=5, video_author=VIDEO_AUTHOR)
    rng = np.random.default_rng(0)
    nobody = graph.followed_videos(np.array([0, 1]), rng.random(2))
    assert nobody.tolist() == [-1, -1]  # nobody follows anyone
    graph.add(np.array([0, 0, 1]), np.array([1, 2, 3]))
    users = np.array([0, 1, 2])
    drawn = np.array([graph.followed_videos(users, rng.random(3)) for _ in range(200)])
    assert set(drawn[:, 0]) == {1, 2, 3, 4, 5}  # every video of user 0's authors, and only them
    # author 3 has no videos; user 2 follows none
    assert set(drawn[:, 1]) == {-1} and set(drawn[:, 2]) == {-1}


def test_an_author_fills_the_following_feed_in_proportion_to_their_videos():
    """The following feed shows what followed authors post: author 2 posts three videos to author 1's
    two, so a follower of both sees author 2's 3/5 of the time (not half, as one pick per author gave)."""
    graph = FollowGraph(n_authors=5, video_author=VIDEO_AUTHOR)
    graph.add(np.array([0, 0]), np.array([1, 2]))
    picks = (np.arange(10_000) + 0.5) / 10_000
    authors = VIDEO_AUTHOR[graph.followed_videos(np.zeros(picks.size, np.int64), picks)]
    assert np.mean(authors == 2) == pytest.approx(3 / 5)


def test_a_few_authors_post_most_of_the_catalogue():
    world = Simulator(SimConfig(n_users=10), 0).world
    posted = np.sort(np.bincount(world.videos.author, minlength=SimConfig().n_authors))[::-1]
    assert posted[: posted.size // 10].sum() > 0.3 * posted.sum()  # the top tenth posts over 30%
    flat = Simulator(SimConfig(n_users=10, author_output_spread=0.0), 0).world
    posted = np.sort(np.bincount(flat.videos.author, minlength=SimConfig().n_authors))[::-1]
    assert posted[: posted.size // 10].sum() < 0.2 * posted.sum()  # Poisson noise alone: about 16%


def test_followers_meet_their_authors_again_and_like_them_better():
    sim = Simulator(SimConfig(n_users=1500), 4)
    for _ in range(2):
        sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
    assert len(sim.follows) > 0
    followed_before = sim.follows._keys.copy()  # user * n_authors + author, followed before the day
    day = sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
    authors = sim.world.videos.author[day.feed.candidates]
    followed = sim.follows.follows(day.feed.user[:, None], authors)
    # a follower's candidates include followed authors' videos far beyond chance (2000 authors)
    has_follows = np.unique(sim.follows._keys // sim.config.n_authors)
    rows = np.isin(day.feed.user, has_follows)
    assert followed[rows].any(axis=1).mean() > 0.5
    users = day.feed.user[rows][:50]
    videos = day.feed.candidates[rows][:50]
    model = sim.config.response
    plain = VideoResponseProbs.of(sim.world, model, users, videos, followed=np.zeros(videos.shape, bool))
    fan = VideoResponseProbs.of(sim.world, model, users, videos, followed=np.ones(videos.shape, bool))
    assert np.all(fan.click > plain.click) and np.all(fan.watch_fraction > plain.watch_fraction)
    # and never follow them again: a follow of a followed author would count a button that is not there
    assert np.all(fan.interaction["follow"] == 0) and np.all(plain.interaction["follow"] > 0)
    assert np.all(fan.interaction["like"] > plain.interaction["like"])  # the other interactions stay
    videos = ~day.views.is_live
    keys = day.views.user[videos] * sim.config.n_authors + sim.world.videos.author[day.views.item[videos]]
    follow_column = day.views.signals[videos, 3]
    assert follow_column[~np.isin(keys, followed_before)].any()
    assert (
        np.isin(keys, followed_before).sum() > 100 and not follow_column[np.isin(keys, followed_before)].any()
    )


def test_interests_step_toward_what_was_watched_and_keep_every_topic_reachable():
    interest = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    # user 0 watched topic 2 for 30 s and topic 1 for 10 s; user 1 clicked nothing
    after = drifted(
        interest, np.array([0, 0]), np.array([2, 1]), np.array([30.0, 10.0]), rate=0.1, floor=0.05
    )
    np.testing.assert_allclose(after.sum(axis=1), 1.0)
    np.testing.assert_allclose(after[1], interest[1])
    assert after[0, 2] == pytest.approx(0.9 * 0.2 + 0.1 * 0.75) and after[0, 0] < interest[0, 0]
    # a topic never watched decays, but not below the floor
    for _ in range(200):
        after = drifted(after, np.array([0]), np.array([2]), np.array([1.0]), rate=0.1, floor=0.05)
    assert after[0].min() >= 0.05 / 3 - 1e-12 and after[0, 2] > 0.9
