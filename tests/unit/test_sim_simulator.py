"""Structure, determinism and internal consistency of the simulator."""

import copy
import dataclasses
import itertools
import math

import numpy as np
import pytest

from recsys_rl.fusion import fusion_scores, top_k
from recsys_rl.sim.behaviour import GaussianFeedPolicy, behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.draws import KeyedDraws, Purpose
from recsys_rl.sim.ground_truth import evaluate_logs
from recsys_rl.sim.interests import drifted
from recsys_rl.sim.parameters import ResponseModel, SimConfig
from recsys_rl.sim.responses import LiveResponseProbs, VideoResponseProbs
from recsys_rl.sim.retention import remembered_satisfaction
from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS, Simulator, _leave
from recsys_rl.state import (
    DAY_MS,
    FEED_STATE_FEATURES,
    LIVE_STATE_FEATURES,
    feed_states,
    live_states,
    user_groups,
)

FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()


def _days(seed: int, days: int = 2, users: int = 300):
    sim = Simulator(SimConfig(n_users=users), seed)
    return [sim.run_day(FEED, LIVE) for _ in range(days)]


def test_same_seed_gives_identical_logs_and_another_seed_does_not():
    a, b, c = _days(5), _days(5), _days(6)
    for day_a, day_b in zip(a, b, strict=True):
        for part in ("feed", "live", "views"):
            for name, col in vars(getattr(day_a, part)).items():
                np.testing.assert_array_equal(col, vars(getattr(day_b, part))[name], err_msg=f"{part}.{name}")
    assert a[0].feed.request.size != c[0].feed.request.size or not np.array_equal(
        a[0].feed.action, c[0].feed.action
    )


def test_episode_seed_redraws_traffic_on_the_same_world():
    config = SimConfig(n_users=200)
    first, second = Simulator(config, 3, episode_seed=0), Simulator(config, 3, episode_seed=1)
    np.testing.assert_array_equal(first.world.videos.quality, second.world.videos.quality)
    assert not np.array_equal(
        first.run_day(FEED, LIVE).feed.action[:10], second.run_day(FEED, LIVE).feed.action[:10]
    )


def test_logs_are_consistent_with_each_other():
    day = _days(11, days=1)[0]
    feed, live, views = day.feed, day.live, day.views
    config = SimConfig()
    assert feed.state.shape[1] == len(FEED_STATE_FEATURES)
    assert live.state.shape[1] == len(LIVE_STATE_FEATURES)
    assert np.unique(feed.request).size == feed.request.size
    # every session ends exactly once, on its last page
    assert np.unique(feed.session).size == day.sessions == int(feed.done.sum())
    last_page = {s: p for s, p in zip(feed.session, feed.page, strict=True)}
    assert all(last_page[s] == p for s, p in zip(feed.session[feed.done], feed.page[feed.done], strict=True))
    # feed rewards are exactly the sum of the page's video views
    video = ~views.is_live
    per_request = np.zeros((feed.request.max() + 1, 7))
    np.add.at(per_request, views.request[video], views.signals[video, :7])
    np.testing.assert_allclose(per_request[feed.request], feed.reward)
    # live rewards are the live views' watch and gifts; insertions are the live_slot pages
    live_watch = np.zeros(feed.request.max() + 1)
    np.add.at(live_watch, views.request[views.is_live], views.signals[views.is_live, 8])
    np.testing.assert_allclose(live_watch[live.request], live.reward[:, 0])
    assert np.array_equal(feed.live_inserted, feed.live_slot >= 0)
    assert set(feed.request[feed.live_inserted]) == set(live.request[live.action == 1])
    assert np.all(feed.live_slot[feed.live_inserted] == config.live_position)
    # displaced time only where a live stream was inserted
    assert np.all(live.reward[live.action == 0, 2] == 0)
    # one session_end view per session that had views, and views happen after their request
    assert int(views.session_end.sum()) == np.unique(views.session).size
    request_time = dict(zip(feed.request, feed.time_ms, strict=True))
    assert all(t >= request_time[r] for r, t in zip(views.request[:500], views.time_ms[:500], strict=True))


def test_sessions_of_a_user_are_separated_by_more_than_the_inactivity_gap():
    day = _days(2, days=1, users=400)[0]
    views = day.views
    order = np.lexsort((views.time_ms, views.user))
    user, session, t = views.user[order], views.session[order], views.time_ms[order]
    new_session = (user[1:] == user[:-1]) & (session[1:] != session[:-1])
    assert new_session.any()
    gaps_s = (t[1:] - t[:-1])[new_session] / 1000.0
    assert gaps_s.min() > 30 * 60


def test_behaviour_policy_log_propensities_match_its_density():
    day = _days(4, days=1)[0]
    np.testing.assert_allclose(
        FEED.log_prob(day.feed.state.astype(float), day.feed.action.astype(float)),
        day.feed.log_propensity,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        LIVE.log_prob(day.live.state.astype(float), day.live.action), day.live.log_propensity, atol=1e-5
    )


def test_behaviour_policy_density_is_the_closed_form_gaussian_with_non_unit_sigmas():
    sigma = np.array([0.05, 0.2, 0.5, 1.0, 1.5, 2.5, 4.0])  # prod = 0.075
    policy = GaussianFeedPolicy(FEED.base_logits, FEED.state_coef, sigma)
    rng = np.random.default_rng(3)
    states = rng.random((50, len(FEED_STATE_FEATURES)))
    actions, logged = policy.act(states, rng)
    mean = FEED.base_logits + states @ FEED.state_coef
    # independent reference: the log of the product of the univariate normal densities
    pdf = np.exp(-0.5 * ((actions - mean) / sigma) ** 2) / (sigma * math.sqrt(2.0 * math.pi))
    expected = np.log(pdf.prod(axis=1))
    np.testing.assert_allclose(logged, expected, rtol=1e-9)
    np.testing.assert_allclose(policy.log_prob(states, actions), expected, rtol=1e-9)
    # at the mean: -(7/2) ln(2 pi) - ln(0.075) = -6.432570 + 2.590267
    assert policy.log_prob(states[:1], mean[:1])[0] == pytest.approx(-3.842303, abs=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"n_users": 0}, "n_users should be at least 1, but is 0", id="no-users"),
        pytest.param({"page_size": 30}, "page_size should be at most n_candidates=20", id="page-too-big"),
        pytest.param({"live_position": 6}, r"live_position should be in \[0, 6\)", id="live-slot-off-page"),
        pytest.param({"group_probs": (0.5, 0.5)}, "group_probs should have 4 values", id="wrong-group-count"),
        pytest.param({"group_probs": (0.5, 0.5, 0.5, 0.5)}, "should sum to 1", id="probs-not-normalised"),
        pytest.param({"live_availability": 1.5}, "live_availability should be in", id="availability"),
        pytest.param({"author_niche_share": -0.1}, "author_niche_share should be in", id="niche"),
        pytest.param(
            {"response": ResponseModel(familiarity_saturation_views=0)},
            r"familiarity_saturation_views .* should be in \[1, 255\], but is 0",
            id="familiar-at-zero-views",
        ),
        pytest.param(
            {"response": ResponseModel(familiarity_saturation_views=256)},
            r"familiarity_saturation_views .* should be in \[1, 255\], but is 256",
            id="familiar-past-a-byte",
        ),
        pytest.param({"n_videos": 3}, "n_videos should be at least n_topics", id="too-few-videos"),
        pytest.param(
            {"author_output_spread": -0.5},
            "author_output_spread is a standard deviation",
            id="negative-spread",
        ),
        pytest.param(
            {"item_signal_spread": float("nan")}, "item_signal_spread is a standard", id="nan-spread"
        ),
    ],
)
def test_invalid_sim_config_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)


def test_each_activity_group_returns_on_day_zero_at_its_configured_rate():
    # Day 0 has every user at the reference satisfaction, so a user returns with exactly return_base of
    # their group. A random stream shared between the world and the day's draws breaks this (the draws
    # that assigned the groups decided the returns: no low-active user ever came back on day 0).
    config = SimConfig(n_users=8_000)
    sim = Simulator(config, seed=7)
    day = sim.run_day(FEED, LIVE)
    groups = sim.world.users.group
    returned = np.zeros(config.n_users, bool)
    returned[day.feed.user] = True
    for group, base in enumerate(config.return_base):
        members = groups == group
        rate = returned[members].mean()
        margin = 4.0 * np.sqrt(base * (1.0 - base) / members.sum())
        assert abs(rate - base) < margin, (group, rate, base)


def test_states_are_built_from_the_stored_rows_and_the_request_context_alone():
    """As serving builds them: a day's states are ``feed_states`` of the rows stored when the day began and
    of each request's logged context, time included; no hidden trait of the user goes in."""
    users = 300
    sim = Simulator(SimConfig(n_users=users), 4)
    sim.run_day(FEED, LIVE)
    stored = sim.store.lookup(np.arange(users))  # what the nightly run left for day 1
    day = sim.run_day(FEED, LIVE)
    feed, live = day.feed, day.live
    rebuilt = feed_states(stored.take(feed.user), feed.contexts())
    np.testing.assert_array_equal(feed.state, rebuilt)
    row = {int(r): i for i, r in enumerate(feed.request)}
    of_live = [row[int(r)] for r in live.request]
    np.testing.assert_array_equal(live.state, live_states(rebuilt[of_live], live.predictions))
    # the group is the published one; yesterday's users have yesterday's history, the others none
    assert np.array_equal(user_groups(feed.state), sim.world.users.group[feed.user])
    returned = feed.state[:, FEED_STATE_FEATURES.index("returned_yesterday")] == 1
    assert 0 < returned.mean() < 1


def test_a_day_stays_in_its_utc_day_with_a_users_sessions_in_order():
    config = SimConfig(n_users=600)
    sim = Simulator(config, 9)
    for d in range(3):
        day = sim.run_day(FEED, LIVE)
        utc_day = (day.views.time_ms - config.start_time_ms) // DAY_MS
        assert np.all(utc_day == d) and np.all((day.feed.time_ms - config.start_time_ms) // DAY_MS == d)
        # no session opens after 23:00, however late the gap after the previous one pushed it
        start_h = (day.feed.time_ms[day.feed.page == 0] - config.start_time_ms - d * DAY_MS) / 3_600_000
        assert start_h.max() <= 23.0
        # a user's sessions run one after another: each starts the gap after the previous one's last view
        # (to the millisecond both times are rounded to)
        first_page = day.feed.page == 0
        starts = sorted(
            zip(
                day.feed.user[first_page].tolist(),
                day.feed.time_ms[first_page].tolist(),
                day.feed.session[first_page].tolist(),
                strict=True,
            )
        )
        last_view: dict[int, int] = {}
        for session, t in zip(day.views.session.tolist(), day.views.time_ms.tolist(), strict=True):
            last_view[session] = max(t, last_view.get(session, t))
        followed = 0
        for (user, _, session), (next_user, next_start, _) in itertools.pairwise(starts):
            if user == next_user:
                assert next_start - last_view[session] >= config.min_session_gap_s * 1000 - 1
                followed += 1
        assert followed > 100


def _unbiased_and_less_noisy(expected: np.ndarray, drawn: np.ndarray, columns: dict[int, str]) -> None:
    for column, name in columns.items():
        gap = drawn[:, column] - expected[:, column]
        stderr = gap.std(ddof=1) / np.sqrt(gap.size)
        assert abs(gap.mean()) < 4.0 * stderr, name  # unbiased: the draws' mean within noise
        assert expected[:, column].var() < drawn[:, column].var(), name  # less noise than the draws


def test_expected_rewards_are_the_viewed_videos_expectations_and_agree_with_the_draws():
    """Ground truth sums each viewed video's expected responses: no draw of its own, the same mean."""
    feed = _days(13, days=1, users=3000)[0].feed
    expected, drawn = feed.expected_reward, feed.reward
    assert expected.shape == drawn.shape
    # probabilities, not draws: fractional where draws are counts, and a click per viewed video at most
    assert np.any((expected[:, 1] > 0) & (expected[:, 1] % 1 != 0))
    viewed_videos = np.count_nonzero(feed.served >= 0, axis=1)  # an upper bound on the page's views
    assert np.all(expected[:, 1] <= viewed_videos)
    _unbiased_and_less_noisy(expected, drawn, {0: "watch_time", 1: "click", 2: "like"})


def test_live_expected_rewards_agree_with_the_draws_and_count_only_what_was_viewed():
    """The allocation's ground truth: an inserted live stream's expected watch and gift where it was
    viewed, the displaced video's expected watch where the user would have reached it."""
    day = _days(13, days=1, users=3000)[0]
    live = day.live
    expected, drawn = live.expected_reward, live.reward
    assert expected.shape == drawn.shape
    skipped = live.action == 0
    assert np.all(expected[skipped] == 0)  # nothing inserted: no live view, no displaced video
    viewed = np.isin(live.request, day.views.request[day.views.is_live])
    assert np.all(expected[viewed, 0] > 0) and np.all(expected[~viewed, :2] == 0)
    assert np.any(~viewed & ~skipped)  # some users left the page before its live slot
    _unbiased_and_less_noisy(expected, drawn, {0: "live_watch", 1: "gift", 2: "displaced_watch"})


def test_each_views_expected_signals_agree_with_its_draws_and_its_kind():
    """A view's expected signals are what its own draws came from: their mean within noise of the draws',
    and zero where the view's kind cannot have the signal (no gift from a video, no follow from a live)."""
    views = _days(13, days=1, users=3000)[0].views
    expected, drawn, live = views.expected, views.signals, views.is_live
    assert expected.shape == drawn.shape
    video_only = [VIEW_SIGNAL_COLUMNS.index(s) for s in ("like", "follow", "comment", "share", "hate")]
    live_only = [VIEW_SIGNAL_COLUMNS.index(s) for s in ("gift", "live_watch_time")]
    assert np.all(expected[np.ix_(live, video_only)] == 0) and np.all(expected[np.ix_(~live, live_only)] == 0)
    assert np.all((expected[:, 1] > 0) & (expected[:, 1] < 1))  # a click (a live entry) is a probability
    names = dict(enumerate(VIEW_SIGNAL_COLUMNS))
    _unbiased_and_less_noisy(expected[~live], drawn[~live], {i: names[i] for i in [0, 1, *video_only]})
    _unbiased_and_less_noisy(expected[live], drawn[live], {i: names[i] for i in [1, *live_only]})


def _first_pages(feed) -> np.ndarray:
    """Rows of each user's first page of the day, before anything the policy showed (a follow, which
    adds followed authors' candidates to later pages) could differ."""
    first_session = np.zeros(feed.user.max() + 1, np.int64) + np.iinfo(np.int64).max
    np.minimum.at(first_session, feed.user, feed.session)
    return (feed.page == 0) & (feed.session == first_session[feed.user])


class _GreedyDrawer:
    """The behaviour policy, drawing many extra numbers from the policies' generator on every call."""

    version = "greedy-drawer"

    def act(self, states, rng):
        rng.standard_normal((states.shape[0], 1000))
        return FEED.act(states, rng)


def test_what_a_policy_draws_does_not_move_the_users_draws():
    """Common random numbers: users' draws are keyed by who and where, not by a shared stream's position."""
    config = SimConfig(n_users=300)
    plain, drawer = Simulator(config, 8), Simulator(config, 8)
    a, b = plain.run_day(FEED, LIVE), drawer.run_day(_GreedyDrawer(), LIVE)
    # the same users came and opened the same first pages: same candidates and upstream predictions
    assert a.returning_users == b.returning_users
    first_a, first_b = _first_pages(a.feed), _first_pages(b.feed)
    np.testing.assert_array_equal(a.feed.user[first_a], b.feed.user[first_b])
    np.testing.assert_array_equal(a.feed.candidates[first_a], b.feed.candidates[first_b])
    np.testing.assert_array_equal(a.feed.predictions[first_a], b.feed.predictions[first_b])
    # drawn after the ranking policy acted on the page: which rows were offered which live stream
    offered_a = np.isin(a.live.request, a.feed.request[first_a])
    offered_b = np.isin(b.live.request, b.feed.request[first_b])
    np.testing.assert_array_equal(a.live.user[offered_a], b.live.user[offered_b])
    np.testing.assert_array_equal(a.live.live[offered_a], b.live.live[offered_b])
    # while the policy's own draws did move: the actions differ
    assert not np.array_equal(a.feed.action[first_a], b.feed.action[first_b])


class _ShiftedForSome:
    """The behaviour's fusion, its watch-time logit raised for the users in ``shifted``."""

    version = "shifted-for-some"

    def __init__(self, shifted: np.ndarray) -> None:
        self.shifted = shifted

    def act_in_context(self, states, rng, context):
        actions, log_p = FEED.act(states, rng)
        actions[np.isin(context.users, self.shifted), 0] += 1.0
        return actions, log_p


def test_a_users_days_do_not_depend_on_the_policy_other_users_get():
    """Users are independent, exploration included (the behaviour's Gaussian fusion and Bernoulli live
    allocation): what pairs every per-user comparison, and what lets an oracle add up its groups' values."""
    users = 300
    shifted = np.arange(0, users, 2)
    plain, mixed = Simulator(SimConfig(n_users=users), 11), Simulator(SimConfig(n_users=users), 11)
    a = evaluate_logs([plain.run_day(FEED, LIVE) for _ in range(2)], users).per_user
    b = evaluate_logs([mixed.run_day(_ShiftedForSome(shifted), LIVE) for _ in range(2)], users).per_user
    others = np.setdiff1d(np.arange(users), shifted)
    np.testing.assert_array_equal(a[others], b[others])
    assert not np.array_equal(a[shifted], b[shifted])


def test_two_rankings_of_one_world_are_compared_on_the_same_users_draws():
    """A different ranking changes what users see, not who comes back on day one or their candidates."""
    config = SimConfig(n_users=400)
    watch_heavy = behaviour_feed_policy()
    watch_heavy = type(watch_heavy)(
        watch_heavy.base_logits + np.eye(len(watch_heavy.base_logits))[0],
        watch_heavy.state_coef,
        watch_heavy.sigma,
    )
    a = Simulator(config, 9).run_day(FEED, LIVE)
    b = Simulator(config, 9).run_day(watch_heavy, LIVE)
    first_a, first_b = _first_pages(a.feed), _first_pages(b.feed)
    np.testing.assert_array_equal(a.feed.candidates[first_a], b.feed.candidates[first_b])
    assert not np.array_equal(a.feed.served[first_a], b.feed.served[first_b])


def test_leaving_by_hand():
    """docs/simulator.md, "Leaving the session": after each view, leave with probability min(1, exit_base *
    exp(-1.5 * surplus - 0.3 * patience)), the patience before the view; then patience <- 0.9 * patience
    + surplus. A uniform at the probability stays."""
    model = ResponseModel()
    surplus = np.array([[0.0, 1.0, -1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    patience = np.array([0.0, 2.0, 0.0])
    uniforms = np.array(
        [
            [0.25, 0.06, 0.8],  # p = 0.25 exactly (stays), 0.25 e^-1.5 = 0.056 (stays), 0.25 e^1.2 = 0.83
            [0.3, 0.29, 0.0],  # p = 0.5 e^-0.6 = 0.274 (stays), 0.5 e^-0.54 = 0.291 (leaves)
            [0.5, 0.5, 0.5],  # p = 0.01 throughout
        ]
    )
    viewed, exits, alive = _leave(surplus, np.array([0.25, 0.5, 0.01]), patience, uniforms, model)
    assert viewed.tolist() == [[True, True, True], [True, True, False], [True, True, True]]
    assert exits.tolist() == [[False, False, True], [False, True, False], [False, False, False]]
    assert alive.tolist() == [False, False, True]
    # row 0: 0 -> 0 -> 1 -> 0.9 - 1; row 1: 2 -> 1.8 -> 1.62, and no further once gone
    np.testing.assert_allclose(patience, [-0.1, 1.62, 0.0])


def test_a_sessions_patience_carries_over_its_pages_into_every_exit():
    """docs/simulator.md, "Leaving the session", over whole sessions: a page starts with the patience the
    session's page before left (0 on its first page), and each view ends the session exactly when its exit
    draw falls under the hazard that patience gives (but for the page cap's end)."""
    config = SimConfig(n_users=300)
    model = config.response
    sim = Simulator(config, 4)
    day = sim.run_day(FEED, LIVE)
    feed, views = day.feed, day.views
    surplus = _view_satisfaction(day, sim.world, model) - model.exit_reference
    keys = sim.draws.rows(feed.user, np.zeros(feed.user.size, np.int64), _session_ranks(feed), feed.page)
    exit_draws = sim.draws.uniform(keys, Purpose.EXIT, (config.page_size,))
    exit_base = np.asarray(config.exit_base)[sim.world.users.group]
    row_of = {request: row for row, request in enumerate(feed.request.tolist())}
    patience: dict[int, float] = {}
    checked = 0
    for view in np.lexsort((views.position, views.request)):  # a session's pages come in request order
        row = row_of[int(views.request[view])]
        session = int(feed.session[row])
        before = patience.get(session, 0.0)
        hazard = exit_base[feed.user[row]] * math.exp(
            -model.exit_satisfaction * surplus[view] - model.patience_weight * before
        )
        uniform = exit_draws[row, views.position[view]]
        if feed.page[row] < config.max_pages - 1 and abs(uniform - hazard) > 1e-4:  # float32 in the model
            assert views.session_end[view] == (uniform < hazard), f"view {view}"
            checked += 1
        patience[session] = model.patience_decay * before + surplus[view]
    assert checked > 0.99 * views.request.size
    assert (feed.page > 0).mean() > 0.5  # most pages start with a session's patience


def _view_satisfaction(day, world, model) -> np.ndarray:
    """Each view's satisfaction from its logged signals (docs/simulator.md): a clicked video its watched
    fraction, a skipped one sat_skip, plus each interaction's weight, less sat_hate for a hate; a live
    stream entered min(watch / 30, 2), one skipped the dislike of a user who does not like live content."""
    views, signals = day.views, day.views.signals
    video = ~views.is_live
    duration = world.videos.attributes[2, np.where(video, views.item, 0)].astype(np.float32)
    weights = np.array([model.sat_like, model.sat_follow, model.sat_comment, model.sat_share])
    on_video = np.where(signals[:, 1] > 0, signals[:, 0] / duration, model.sat_skip)
    on_video += signals[:, 2:6] @ weights - model.sat_hate * signals[:, 6]
    affinity = world.users.live_affinity[views.user]
    on_live = np.where(
        signals[:, 8] > 0, np.minimum(signals[:, 8] / 30.0, 2.0), -model.live_skip_dislike * (1.0 - affinity)
    )
    return np.where(video, on_video, on_live)


def _session_ranks(feed) -> np.ndarray:
    """Each request's session's rank among its user's sessions of the day (the draws' key): sessions are
    numbered in their planned order, and the ones a day opens are the first of them."""
    rank_of = {}
    for user in np.unique(feed.user):
        rank_of |= {session: rank for rank, session in enumerate(np.unique(feed.session[feed.user == user]))}
    return np.array([rank_of[session] for session in feed.session.tolist()], np.int64)


def test_a_day_replays_through_the_response_model_and_leaves_tomorrow_its_state():
    """Day 1 of a small world, replayed from its logs: every short video's expected responses are the
    response model's given the session's earlier clicks (satiation), the follows made before the request
    and yesterday's familiarity; the pages, clocks and ends of each session add up; and the day leaves the
    follows, interests and retention memory its views imply."""
    config = SimConfig(n_users=200)
    model = config.response
    sim = Simulator(config, 9)
    day0 = sim.run_day(FEED, LIVE)
    follows_before = set(sim.follows._keys.tolist())
    familiarity = copy.deepcopy(sim.familiarity)  # yesterday's, as the day reads it
    interest = sim.world.users.interest.copy()
    memory = sim._satisfaction.copy()
    day = sim.run_day(FEED, LIVE)
    world = sim.world
    feed, live, views = day.feed, day.live, day.views

    # the day's end: follows, interests and memory from the day's views
    video = ~views.is_live
    followed_today = video & (views.signals[:, 3] > 0)
    author = world.videos.author[np.where(video, views.item, 0)]
    keys = views.user * config.n_authors + author
    assert followed_today.any()
    assert set(sim.follows._keys.tolist()) == follows_before | set(keys[followed_today].tolist())
    clicked = video & (views.signals[:, 1] > 0)
    topic = world.videos.topic[views.item[clicked]]
    np.testing.assert_allclose(
        world.users.interest,
        drifted(
            interest,
            views.user[clicked],
            topic,
            views.signals[clicked, 0],
            config.interest_drift,
            config.interest_floor,
        ),
    )
    satisfaction = _view_satisfaction(day, world, model)
    per_user = np.bincount(views.user, satisfaction, config.n_users)
    seen = np.bincount(views.user, minlength=config.n_users)
    came = np.where(seen > 0, per_user / np.maximum(seen, 1), np.nan)
    interactions = np.bincount(views.user[video], views.signals[video, 2:6].sum(axis=1), config.n_users)
    np.testing.assert_allclose(
        sim._satisfaction,
        remembered_satisfaction(
            memory,
            came,
            interactions,
            np.bincount(views.user[video], minlength=config.n_users),
            world.users.social,
            model,
        ),
        rtol=1e-5,
    )

    # each video view's expected responses, replayed in request order
    replay_interest = dataclasses.replace(world, users=dataclasses.replace(world.users, interest=interest))
    topic_clicks: dict[int, np.ndarray] = {}
    followed_now = set(follows_before)
    by_request = np.argsort(views.request, kind="stable")
    rows, clicks, follows = [], [], []
    before_page = {}  # per request: the session's clicks by topic and the follows, as the page saw them
    for request, group in itertools.groupby(by_request, key=lambda i: views.request[i]):
        mine = list(group)
        session = views.session[mine[0]]
        so_far = topic_clicks.setdefault(session, np.zeros(config.n_topics))
        before_page[int(request)] = (so_far.copy(), set(followed_now))
        for i in mine:
            if video[i]:
                rows.append(i)
                clicks.append(so_far.copy())
                follows.append(keys[i] in followed_now)
        for i in mine:  # the page's own clicks and follows count from the next page on
            if clicked[i]:
                so_far[world.videos.topic[views.item[i]]] += 1
            if followed_today[i]:
                followed_now.add(int(keys[i]))
    rows = np.array(rows)
    probs = VideoResponseProbs.of(
        replay_interest,
        model,
        views.user[rows],
        views.item[rows, None],
        np.array(clicks),
        np.array(follows)[:, None],
        familiarity.views(views.user[rows, None], author[rows, None]),
    )
    assert np.array(follows).any() and (np.array(clicks).sum(axis=1) > 0).any()
    np.testing.assert_allclose(views.expected[rows, :7], probs.expected(model)[:, 0], rtol=1e-5)

    # sessions: pages in order, the watch and the click rate so far, and the last view ends the session
    order = np.lexsort((feed.page, feed.session))
    starts = np.r_[True, feed.session[order][1:] != feed.session[order][:-1]]
    first_row = np.maximum.accumulate(np.where(starts, np.arange(order.size), 0))
    np.testing.assert_array_equal(feed.page[order], np.arange(order.size) - first_row)
    watch = feed.reward[order, 0]
    before = np.cumsum(watch) - watch
    np.testing.assert_allclose(feed.session_watch_s[order], before - before[first_row], atol=1e-6)
    viewed = np.bincount(views.request, minlength=feed.request.max() + 1)[feed.request[order]]
    rate = feed.reward[order, 1] / viewed
    np.testing.assert_allclose(feed.last_click_rate[order][1:][~starts[1:]], rate[:-1][~starts[1:]])
    in_order = np.lexsort((views.position, views.request, views.session))
    last = np.r_[views.session[in_order][1:] != views.session[in_order][:-1], True]
    np.testing.assert_array_equal(views.session_end[in_order], last)
    done = dict(zip(feed.request.tolist(), feed.done.tolist(), strict=True))
    assert live.done.tolist() == [done[r] for r in live.request.tolist()] and live.done.any()
    # each view ends after the page's views so far: watch, live watch and the overhead of each item
    request_ms = dict(zip(feed.request.tolist(), feed.time_ms.tolist(), strict=True))
    in_page = np.lexsort((views.position, views.request))
    spent = views.signals[in_page, 0] + views.signals[in_page, 8] + config.item_overhead_s
    page_start = np.r_[True, views.request[in_page][1:] != views.request[in_page][:-1]]
    total = np.cumsum(spent)
    offset = total - (total - spent)[np.maximum.accumulate(np.where(page_start, np.arange(spent.size), 0))]
    since_request = views.time_ms[in_page] - np.array(
        [request_ms[r] for r in views.request[in_page].tolist()]
    )
    assert np.abs(since_request - offset * 1000.0).max() <= 1.0
    # an inserted live stream stands in its slot; the live ids spread over the catalogue of streams
    inserted = feed.live_inserted
    live_of = dict(zip(live.request.tolist(), live.live.tolist(), strict=True))
    assert inserted.any() and set(np.unique(feed.live_slot)) == {-1, config.live_position}
    assert feed.served[inserted, config.live_position].tolist() == [
        live_of[r] for r in feed.request[inserted].tolist()
    ]
    assert np.unique(live.live).size > 10
    # the page is the fusion's top six, an inserted live stream pushing the sixth out of its slot, and the
    # live decision saw the pushed-out video's prediction
    scores = fusion_scores(feed.predictions.astype(np.float64), feed.action.astype(np.float64))
    ranked = top_k(scores, config.page_size)
    ranked_items = np.take_along_axis(feed.candidates, ranked, axis=1)
    video_slots = np.delete(np.arange(config.page_size), config.live_position)
    np.testing.assert_array_equal(feed.served[~inserted], ranked_items[~inserted])
    np.testing.assert_array_equal(feed.served[inserted][:, video_slots], ranked_items[inserted, :-1])
    row = {r: i for i, r in enumerate(feed.request.tolist())}
    decided = np.array([row[r] for r in live.request.tolist()])
    np.testing.assert_array_equal(live.predictions[:, 2], feed.predictions[decided, ranked[decided, -1], 0])
    # the live predictions carry the upstream ranker's log-normal noise, drawn apart for watch and gift
    watch, gift = LiveResponseProbs.of(world, model, live.user, live.live).expected(model)
    noise = np.log(live.predictions[:, :2] / np.column_stack([watch, gift])) / model.prediction_noise
    assert abs(noise.mean()) < 0.15 and np.allclose(noise.std(axis=0), 1.0, atol=0.1)
    assert abs(np.corrcoef(noise.T)[0, 1]) < 0.15
    # an insertion that the user scrolled past counts the pushed-out video's expected watch, as the page
    # before it would have shown it
    reached = np.bincount(views.request, minlength=feed.request.max() + 1)[live.request] == config.page_size
    counted = (live.action == 1) & reached
    assert counted.any()
    pushed_out = feed.candidates[decided, ranked[decided, -1]][counted]
    seen_before = [before_page[r] for r in live.request[counted].tolist()]
    users = live.user[counted]
    pushed = VideoResponseProbs.of(
        replay_interest,
        model,
        users,
        pushed_out[:, None],
        np.array([clicks for clicks, _ in seen_before]),
        np.array(
            [
                [u * config.n_authors + world.videos.author[v] in f]
                for u, v, (_, f) in zip(users, pushed_out, seen_before, strict=True)
            ]
        ),
        familiarity.views(users[:, None], world.videos.author[pushed_out][:, None]),
    )
    np.testing.assert_allclose(live.expected_reward[counted, 2], pushed.expected(model)[:, 0, 0], rtol=1e-5)
    # and its drawn watch from the page's own uniforms at the pushed-out rank
    pages = decided[counted]
    page_keys = sim.draws.rows(
        users, np.ones(users.size, np.int64), _session_ranks(feed)[pages], feed.page[pages]
    )
    uniforms = sim.draws.uniform(page_keys, Purpose.VIDEO_RESPONSE, (config.page_size, 7))[:, -1:]
    np.testing.assert_allclose(live.reward[counted, 2], pushed.sample(model, uniforms)[0][:, 0, 0])
    assert day0.feed.request.size > 0


class _RecordingAllocation:
    """The behaviour's allocation, recording the page context each decision is given."""

    def __init__(self) -> None:
        self.contexts = []

    def act_in_context(self, states, rng, context):
        self.contexts.append(context)
        return LIVE.act(states, rng)


def test_days_number_their_requests_and_sessions_and_draw_from_their_keys():
    """Requests and sessions are numbered from 0 through the run; each day's first sessions start at the
    first of the user's planned hours (keyed by user, day and session rank), and the first candidates come
    from the page's keyed draws (by user, day, session rank and page); a day's pages follow each other
    without a gap; the default episodes are seed 0's, child 0 of spawn key 1."""
    config = SimConfig(n_users=150)
    sim = Simulator(config, 4)
    recorder = _RecordingAllocation()
    days = [sim.run_day(FEED, recorder) for _ in range(3)]
    assert [day.day for day in days] == [0, 1, 2]
    requests = np.concatenate([day.feed.request for day in days])
    np.testing.assert_array_equal(np.sort(requests), np.arange(requests.size))
    # a session's number is taken when it is planned, so the numbers run on from day to day
    sessions = [np.unique(day.feed.session) for day in days]
    assert sessions[0][0] == 0 and all(a[-1] < b[0] for a, b in itertools.pairwise(sessions))
    assert days[0].feed.page.dtype == np.int64 and days[0].feed.request.dtype == np.int64
    # float32, as a serving request carries them
    assert (
        days[0].feed.predictions.dtype
        == days[0].feed.action.dtype
        == days[0].live.predictions.dtype
        == np.float32
    )
    expected_key = np.random.SeedSequence(4).spawn(2)[1].spawn(1)[0]
    assert sim.draws.rows(np.array([3]))[0] == KeyedDraws(expected_key).rows(np.array([3]))[0]
    assert (
        Simulator(config, 4).draws.rows(np.array([3]))[0]
        == Simulator(config, 4, 0).draws.rows(np.array([3]))[0]
    )
    day = days[1]
    feed, live = day.feed, day.live
    users = np.unique(feed.user)
    group = sim.world.users.group[users]
    user_day = sim.draws.rows(users, np.full(users.size, 1))
    extra = sim.draws.poisson(
        user_day, Purpose.EXTRA_SESSIONS, np.asarray(config.sessions_per_day)[group] - 1.0
    )
    first_hour = [
        min(
            sim.draws.uniform(
                sim.draws.rows(np.full(n + 1, u), np.full(n + 1, 1), np.arange(n + 1)), Purpose.SESSION_HOUR
            )
        )
        for u, n in zip(users, extra, strict=True)
    ]
    planned_ms = config.start_time_ms + np.round(
        (86_400.0 + (7.0 + 16.0 * np.array(first_hour)) * 3600.0) * 1000.0
    )
    first_ms = np.array([feed.time_ms[feed.user == u].min() for u in users])
    np.testing.assert_array_equal(first_ms, planned_ms.astype(np.int64))
    # the first candidates: a topic by the user's interests, then a video of it, from the page's draws
    rows = sim.draws.rows(feed.user, np.full(feed.user.size, 1), _session_ranks(feed), feed.page)
    topic_u = sim.draws.uniform(rows, Purpose.CANDIDATE_TOPIC, (config.n_candidates,))
    video_u = sim.draws.uniform(rows, Purpose.CANDIDATE_VIDEO, (config.n_candidates,))
    topic = sim.world.videos.topic[feed.candidates]
    topic_of = sim.world.videos.topic_start[topic] + (video_u * sim.world.videos.topic_count[topic]).astype(
        np.int64
    )
    drawn = slice(0, config.n_candidates - config.followed_candidates)
    np.testing.assert_array_equal(feed.candidates[:, drawn], topic_of[:, drawn])
    assert np.all(topic_u[:, drawn] > 0)
    # the next page asks when the last view of the page before it ended
    last_view_ms = {r: t for r, t in zip(day.views.request.tolist(), day.views.time_ms.tolist(), strict=True)}
    order = np.lexsort((feed.page, feed.session))
    following = np.flatnonzero(feed.session[order][1:] == feed.session[order][:-1])
    gaps = feed.time_ms[order][following + 1] - [
        last_view_ms[r] for r in feed.request[order][following].tolist()
    ]
    assert following.size > 0 and np.abs(gaps).max() <= 1
    # an allocation policy that reads the page's context gets the live candidate's own
    contexts = recorder.contexts
    seen = {
        int(r): (int(u), int(session), int(page), int(c[0]), p[0].tolist())
        for ctx in contexts
        for r, u, session, page, c, p in zip(
            ctx.requests,
            ctx.users,
            ctx.sessions,
            ctx.request.page_index,
            ctx.candidates,
            ctx.predictions,
            strict=True,
        )
    }
    for r, u, session, page, lid, p in zip(
        live.request.tolist(),
        live.user.tolist(),
        live.session.tolist(),
        live.page.tolist(),
        live.live.tolist(),
        live.predictions,
        strict=True,
    ):
        assert seen[r] == (u, session, page, lid, p.tolist())


def test_a_page_cap_ends_the_session_on_its_last_page_and_views_carry_only_their_kinds_signals():
    config = SimConfig(n_users=1500, max_pages=2)
    day = Simulator(config, 6).run_day(FEED, LIVE)
    feed, views = day.feed, day.views
    assert feed.page.max() == 1 and np.all(feed.done[feed.page == 1])
    capped = np.isin(views.request, feed.request[feed.page == 1])
    last = np.r_[views.request[1:] != views.request[:-1], True]
    assert np.all(views.session_end[capped] == last[capped]) and views.session_end[capped].any()
    live, video = views.is_live, ~views.is_live
    assert np.all(views.signals[video, 7:] == 0) and np.all(
        views.signals[np.ix_(live, [0, 2, 3, 4, 5, 6])] == 0
    )
    np.testing.assert_array_equal(views.signals[live, 1], views.signals[live, 8] > 0)
    assert ((views.signals[live, 8] > 0) & (views.signals[live, 8] < 1)).any()  # a click under a second
    # with one page a session, every page's last view ends its session
    one_page = Simulator(SimConfig(n_users=300, max_pages=1), 6).run_day(FEED, LIVE).views
    np.testing.assert_array_equal(
        one_page.session_end, np.r_[one_page.request[1:] != one_page.request[:-1], True]
    )
    # the displaced video's watch counts only where the user reached the page's end
    per_request = np.bincount(views.request, minlength=feed.request.max() + 1)
    reached = per_request[day.live.request] == config.page_size
    assert np.all(day.live.reward[~reached, 2] == 0) and np.all(day.live.expected_reward[~reached, 2] == 0)
    assert (day.live.expected_reward[reached & (day.live.action == 1), 2] > 0).all()


def test_a_day_nobody_comes_back_has_empty_logs_with_every_column():
    config = SimConfig(n_users=50, return_base=(0.0, 0.0, 0.0, 0.0))
    with np.errstate(divide="ignore"):  # the log-odds of a base rate of 0
        day = Simulator(config, 1).run_day(FEED, LIVE)
    assert day.sessions == day.returning_users == 0
    assert day.feed.predictions.shape == (0, config.n_candidates, 7) and day.views.signals.shape == (0, 9)
    assert day.live.request.size == 0
