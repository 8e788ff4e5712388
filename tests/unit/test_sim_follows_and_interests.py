"""Follows persist and feed the user their authors; authors keep to their niches and grow familiar;
interests drift toward what the user watched."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.follows import FollowGraph
from recsys_rl.sim.interests import drifted
from recsys_rl.sim.parameters import ResponseModel, SimConfig
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


def test_the_following_feed_meets_each_followed_video_once_author_by_author_in_id_order():
    """Evenly spread picks meet every video of the user's followed authors once: authors in id order, each
    author's videos in id order (the catalogue is not sorted by author). The cases are the edges: the
    first author and the last, an author with one video and authors with none (the last two of six post
    nothing), neighbouring users, and picks of exactly 0 and 1."""
    video_author = np.random.default_rng(5).integers(0, 4, 80)
    video_author[[10, 40]] = 4  # author 4 posts two videos, author 1 one, authors 5 and 6 none
    video_author[video_author == 1] = 0
    video_author[20] = 1
    graph = FollowGraph(n_authors=7, video_author=video_author)
    graph.add(np.array([1, 1, 1, 1, 2, 0, 3, 3]), np.array([4, 0, 5, 2, 1, 6, 0, 4]))

    def feed_of(*authors: int) -> np.ndarray:
        return np.concatenate([np.flatnonzero(video_author == author) for author in authors])

    expected = feed_of(0, 2, 4)
    picks = np.r_[0.0, (np.arange(expected.size) + 0.5) / expected.size, 1.0]
    drawn = graph.followed_videos(np.ones(picks.size, np.int64), picks)
    np.testing.assert_array_equal(drawn, np.r_[expected[0], expected, expected[-1]])
    # user 2 follows the author of one video, user 0 one with none, user 4 nobody
    single = graph.followed_videos(np.array([2, 2, 2]), np.array([0.0, 0.5, 1.0]))
    assert single.tolist() == [20, 20, 20]
    nothing = graph.followed_videos(np.array([0, 4]), np.array([0.5, 0.5]))
    assert nothing.tolist() == [-1, -1] and nothing.dtype == np.int64
    # the last user's authors, apart in the catalogue: the highest keys of the graph, the last of them
    # the last author who posts
    last = feed_of(0, 4)
    picks = (np.arange(last.size) + 0.5) / last.size
    np.testing.assert_array_equal(graph.followed_videos(np.full(last.size, 3), picks), last)


def test_one_follow_is_found_and_ids_past_int32_do_not_wrap():
    graph = FollowGraph(n_authors=5, video_author=VIDEO_AUTHOR)
    empty = graph.follows(np.array([0]), np.array([1]))
    assert empty.dtype == bool and not empty.any()
    assert graph.followed_videos(np.array([0]), np.array([0.5])).dtype == np.int64
    graph.add(np.array([0]), np.array([1]))
    assert graph.follows(np.array([0, 0]), np.array([1, 2])).tolist() == [True, False]
    graph.add(np.array([1]), np.array([4]))  # the last author, one video
    assert graph.followed_videos(np.array([1, 1]), np.array([0.0, 1.0])).tolist() == [6, 6]
    # user ids that arrive as int32: user * n_authors passes 2**31
    big = FollowGraph(n_authors=5, video_author=VIDEO_AUTHOR)
    user = np.array([500_000_000], np.int32)
    big.add(user, np.array([2], np.int32))
    assert big.follows(user, np.array([2], np.int32)).tolist() == [True]
    assert not big.follows(np.array([500_000_000 - 858_993_459], np.int64), np.array([2])).any()


def test_a_few_authors_post_most_of_the_catalogue():
    world = Simulator(SimConfig(n_users=10), 0).world
    posted = np.sort(np.bincount(world.videos.author, minlength=SimConfig().n_authors))[::-1]
    assert posted[: posted.size // 10].sum() > 0.3 * posted.sum()  # the top tenth posts over 30%
    flat = Simulator(SimConfig(n_users=10, author_output_spread=0.0), 0).world
    posted = np.sort(np.bincount(flat.videos.author, minlength=SimConfig().n_authors))[::-1]
    assert posted[: posted.size // 10].sum() < 0.2 * posted.sum()  # Poisson noise alone: about 16%


def _niche_share(config: SimConfig) -> float:
    """The share of the catalogue on its author's most common topic, over authors with 20 videos or more."""
    videos = Simulator(config, 0).world.videos
    keys = videos.author * config.n_topics + videos.topic
    per_topic = np.bincount(keys, minlength=config.n_authors * config.n_topics).reshape(config.n_authors, -1)
    prolific = per_topic.sum(axis=1) >= 20
    return per_topic[prolific].max(axis=1).sum() / per_topic[prolific].sum()


def test_authors_post_mostly_on_their_own_topic():
    # 0.7 on the niche, and the other 0.3 spread over 16 topics (one sixteenth of it lands on the niche)
    assert _niche_share(SimConfig(n_users=10)) == pytest.approx(0.7 + 0.3 / 16, abs=0.02)
    # without niches the most common of 16 topics holds little more than a sixteenth of 20+ videos
    assert _niche_share(SimConfig(n_users=10, author_niche_share=0.0)) < 0.25
    videos = Simulator(SimConfig(n_users=10), 0).world.videos
    assert np.all(np.diff(videos.topic) >= 0)  # still sorted by topic, as candidate sampling needs
    np.testing.assert_array_equal(videos.topic_count, np.bincount(videos.topic, minlength=16))


def test_an_authors_videos_grow_more_appealing_with_views_until_ten():
    sim = Simulator(SimConfig(n_users=20), 0)
    users, videos = np.arange(20), np.tile(np.arange(0, 20_000, 1000), (20, 1))
    model = sim.config.response

    def probs(seen: int) -> VideoResponseProbs:
        return VideoResponseProbs.of(
            sim.world, model, users, videos, author_views=np.full(videos.shape, seen)
        )

    never, five, ten, twenty = probs(0), probs(5), probs(10), probs(20)
    assert np.all(never.click < five.click) and np.all(five.click < ten.click)
    np.testing.assert_array_equal(ten.click, twenty.click)  # the effect has saturated by ten views
    # the full effect is familiarity_appeal of appeal: the click logit rises by click_appeal times it
    logit = np.log(ten.click / (1 - ten.click)) - np.log(never.click / (1 - never.click))
    np.testing.assert_allclose(logit, model.click_appeal * model.familiarity_appeal, rtol=1e-3)
    plain = VideoResponseProbs.of(sim.world, model, users, videos)
    np.testing.assert_array_equal(plain.click, never.click)


def test_the_world_remembers_yesterdays_views_of_an_author_and_not_todays():
    """Day 0 has no history, so familiarity cannot change it; from day 1 on, the views of day 0 count."""
    config = SimConfig(n_users=300)
    unfamiliar = SimConfig(n_users=300, response=ResponseModel(familiarity_appeal=0.0))
    days = {}
    for name, cfg in {"familiar": config, "unfamiliar": unfamiliar}.items():
        sim = Simulator(cfg, 2)
        days[name] = [sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy()) for _ in range(2)]
    np.testing.assert_array_equal(days["familiar"][0].views.signals, days["unfamiliar"][0].views.signals)
    assert not np.array_equal(days["familiar"][1].feed.predictions, days["unfamiliar"][1].feed.predictions)
    # the higher appeal is on the candidates whose authors the user met on day 0, and only there
    sim = Simulator(config, 2)
    day0 = sim.run_day(behaviour_feed_policy(), behaviour_allocation_policy())
    feed1 = days["familiar"][1].feed
    seen = sim.familiarity.views(feed1.user[:, None], sim.world.videos.author[feed1.candidates]) > 0
    assert 0 < seen.mean() < 0.5 and day0.views.user.size > 0
    # the first pages of day 1 are the same users and candidates in both runs (their paths part later)
    familiar, other = feed1, days["unfamiliar"][1].feed
    first = slice(0, 50)
    np.testing.assert_array_equal(familiar.candidates[first], other.candidates[first])
    more, plain = familiar.predictions[first, :, 1], other.predictions[first, :, 1]
    assert seen[first].any() and np.all(more[seen[first]] > plain[seen[first]])
    np.testing.assert_array_equal(more[~seen[first]], plain[~seen[first]])


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


def test_interests_step_toward_the_shares_of_watch_however_short_the_watching():
    """The step's target is each topic's share of the day's watch: the same for 0.4 s as for 40 s."""
    interest = np.array([[0.5, 0.3, 0.2]])
    steps = [
        drifted(interest, np.array([0, 0]), np.array([2, 1]), np.array([w * 0.75, w * 0.25]), 0.1, 0.05)
        for w in (0.4, 40.0)
    ]
    np.testing.assert_allclose(steps[0], steps[1])
    # nothing falls to the floor here, so the step is the plain mix of interest and target
    np.testing.assert_allclose(steps[0][0], 0.9 * interest[0] + 0.1 * np.array([0.0, 0.25, 0.75]))
