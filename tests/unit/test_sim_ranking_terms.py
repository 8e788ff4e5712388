"""A ranking term beside the fusion score in the simulator (issue 22), and the pair histories it reads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.pair_state import PAIR_STATE_FEATURES, PairHistory, pair_states
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import run_days
from recsys_rl.sim.pair_table import PairTable
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.ranking_terms import ExpectedFollowTerm, FollowProbabilityTerm, PairValueTerm, TermRanking
from recsys_rl.sim.simulator import Simulator
from recsys_rl.state import DAY_MS

N_AUTHORS = 4
meetings = st.lists(
    st.tuples(
        st.integers(0, 2),  # user
        st.integers(0, N_AUTHORS - 1),  # author
        st.integers(0, 3),  # day
        st.integers(0, DAY_MS - 1),  # time in the day
        st.booleans(),  # click
        st.booleans(),  # follow
        st.sampled_from([0.0, 0.0, 1.0, 5.0]),  # gift
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(meetings, st.integers(4 * DAY_MS, 6 * DAY_MS))  # after every meeting, as a ranker asks
def test_the_table_gives_each_pair_the_state_its_history_gives_after_every_day(rows, at_ms):
    table = PairTable(3, N_AUTHORS)
    histories: dict[tuple[int, int], PairHistory] = {}
    for day in range(4):
        today = sorted((r for r in rows if r[2] == day), key=lambda r: r[3])
        for user, author, _, time, click, follow, gift in today:
            fact = {"event_time_ms": day * DAY_MS + time, "click": click, "follow": follow, "gift": gift}
            histories[user, author] = histories.get((user, author), PairHistory()).after(fact)
        if today:  # handed over latest first: the table must not take a pair's last meeting by order
            columns = [np.array(c) for c in zip(*reversed(today), strict=True)]
            user, author, days, time, click, follow, gift = columns
            table.add_day(user, author, days * DAY_MS + time, click, follow, gift)
        users, authors = np.meshgrid(np.arange(3), np.arange(N_AUTHORS), indexing="ij")
        got = table.states(users, authors, np.full(users.shape, at_ms))
        assert got.shape == (3, N_AUTHORS, len(PAIR_STATE_FEATURES))
        for user in range(3):
            for author in range(N_AUTHORS):
                expected = histories.get((user, author), PairHistory()).state(at_ms)
                np.testing.assert_allclose(got[user, author], expected, rtol=1e-12, atol=1e-12)
    assert len(table) == len(histories)


def test_a_pairs_last_meeting_is_its_latest_whatever_order_its_days_are_added_in():
    table = PairTable(2, 2)
    no = np.zeros(1)
    for day in (5, 1):  # the pair (1, 0) met once on each day; a later day's meeting was added first
        table.add_day(np.array([1]), np.array([0]), np.array([day * DAY_MS]), no, no, no)
    last = PAIR_STATE_FEATURES.index("log_days_since_last")
    assert table.states(np.array([1]), np.array([0]), np.array([7 * DAY_MS]))[0, last] == np.log1p(2.0)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 50),
    st.integers(0, 50),
    st.booleans(),
    st.floats(0, 100),
    st.one_of(st.none(), st.integers(0, 10 * DAY_MS)),
    st.integers(0, 10 * DAY_MS),
)
def test_many_pairs_states_are_each_pairs_state(views, clicks, followed, gifts, last, at_ms):
    history = PairHistory(views, clicks, followed, gifts, last)
    got = pair_states(
        np.array([views]), np.array([clicks]), np.array([followed]), np.array([gifts]),
        np.array([-1 if last is None else last]), np.array([at_ms]),
    )  # fmt: skip
    np.testing.assert_allclose(got[0], history.state(at_ms), rtol=1e-12)


CONFIG = SimConfig(n_users=300)


def _served_authors(logs, world) -> np.ndarray:
    served = np.concatenate([d.feed.served for d in logs])
    live_slot = np.concatenate([d.feed.live_slot for d in logs])
    videos = np.where(np.arange(served.shape[1]) == live_slot[:, None], -1, served)
    return np.where(videos >= 0, world.videos.author[np.maximum(videos, 0)], -1)


class _Recording:
    """A term that scores nothing but keeps what it was shown."""

    name = "recording"

    def __init__(self) -> None:
        self.contexts = []

    def __call__(self, context):
        self.contexts.append(context)
        return np.zeros(context.candidates.shape)


def test_a_zero_weight_term_ranks_as_its_base_policy_and_sees_the_pairs_of_finished_days():
    base = behaviour_feed_policy()
    recording = _Recording()
    plain = run_days(CONFIG, base, behaviour_allocation_policy(), seed=3, days=2)
    with_term = run_days(
        CONFIG, TermRanking(base, recording, 0.0), behaviour_allocation_policy(), seed=3, days=2
    )
    for a, b in zip(plain, with_term, strict=True):
        np.testing.assert_array_equal(a.feed.served, b.feed.served)
        np.testing.assert_array_equal(a.views.signals, b.views.signals)

    # the pair states shown on day 1 are the histories of day 0's views, nothing from day 1 itself
    sim = Simulator(CONFIG, 3, episode_seed=1)
    day0 = sim.run_day(base, behaviour_allocation_policy())
    start_day = recording.contexts[0].request.time_ms.min() // DAY_MS
    first_day = [c for c in recording.contexts if c.request.time_ms.max() // DAY_MS == start_day]
    later = [c for c in recording.contexts if c.request.time_ms.min() // DAY_MS > start_day]
    assert first_day and later
    assert all(np.all(c.pair_states[..., PAIR_STATE_FEATURES.index("first")] == 1) for c in first_day)
    context = later[0]
    authors = sim.world.videos.author[context.candidates]
    expected = sim.pairs.states(context.users[:, None], authors, context.request.time_ms[:, None])
    np.testing.assert_array_equal(context.pair_states, expected)
    met = context.pair_states[..., PAIR_STATE_FEATURES.index("first")] == 0
    assert met.any()  # some candidates' authors were met on day 0
    assert day0.views.user.size > 0


def test_a_term_reorders_the_page_by_its_scores():
    class FollowedFirst:
        name = "followed-first"

        def __call__(self, context):
            return 1e6 * context.pair_states[..., PAIR_STATE_FEATURES.index("followed")]

    base = behaviour_feed_policy()
    kw = {"seed": 5, "days": 3}
    plain = run_days(CONFIG, base, behaviour_allocation_policy(), **kw)
    pushed = run_days(CONFIG, TermRanking(base, FollowedFirst(), 1.0), behaviour_allocation_policy(), **kw)

    def followed_share(logs) -> float:
        world = Simulator(CONFIG, 5).world
        table = PairTable(CONFIG.n_users, CONFIG.n_authors)
        shares = []
        for day in logs:
            users = day.feed.user
            authors = _served_authors([day], world)
            states = table.states(users[:, None], np.maximum(authors, 0), day.feed.time_ms[:, None])
            shares.append(states[..., PAIR_STATE_FEATURES.index("followed")][authors >= 0].mean())
            live = day.views.is_live
            view_authors = np.where(live, 0, world.videos.author[np.where(live, 0, day.views.item)])
            view_authors[live] = world.lives.author[day.views.item[live]]
            table.add_day(day.views.user, view_authors, day.views.time_ms, *day.views.signals[:, [1, 3, 7]].T)
        return float(np.mean(shares[1:]))

    assert followed_share(pushed) > 2 * followed_share(plain) > 0


def test_the_follow_boost_serves_the_likeliest_follows_first():
    base = behaviour_feed_policy()
    logs = run_days(
        CONFIG, TermRanking(base, FollowProbabilityTerm(), 1e6), behaviour_allocation_policy(), seed=2
    )
    feed = logs[0].feed
    follow = feed.predictions[..., FEED_ACTION_NAMES.index("follow")]
    rows = np.arange(len(follow))
    top = feed.served[rows, np.where(feed.live_slot == 0, 1, 0)]  # the first video served
    np.testing.assert_array_equal(top, feed.candidates[rows, np.argmax(follow, axis=1)])


def test_only_an_oracle_term_is_shown_the_worlds_expected_responses():
    """The expected responses are what the world would do: a servable term never sees them, an oracle
    term (a reference line) sees exactly them: the predictions an upstream ranker without noise makes."""
    exact = dataclasses.replace(CONFIG, response=dataclasses.replace(CONFIG.response, prediction_noise=0.0))
    servable, oracle, noiseless = _Recording(), _Recording(), _Recording()
    oracle.reads_expected_responses = True
    for config, term in ((CONFIG, servable), (CONFIG, oracle), (exact, noiseless)):
        run_days(
            config, TermRanking(behaviour_feed_policy(), term, 0.0), behaviour_allocation_policy(), seed=4
        )
    assert servable.contexts and all(c.expected_responses is None for c in servable.contexts)
    # the day's first pages: the same users, candidates and sessions so far in every run
    first, truth = oracle.contexts[0], noiseless.contexts[0].predictions
    np.testing.assert_array_equal(first.candidates, noiseless.contexts[0].candidates)
    np.testing.assert_allclose(first.expected_responses, truth, rtol=1e-6)
    assert not np.allclose(first.predictions, truth, rtol=1e-2)  # what the servable terms see: noisy


def test_the_follow_oracle_prices_hate_in_typical_units_and_needs_the_expected_responses():
    states = np.zeros((1, 2, len(PAIR_STATE_FEATURES)))
    expected = np.zeros((1, 2, len(FEED_ACTION_NAMES)))
    expected[0, 0, FEED_ACTION_NAMES.index("follow")] = 1e-3  # two typical views' follows (scale 5e-4)
    expected[0, 1, FEED_ACTION_NAMES.index("hate")] = 7e-4  # two typical views' hates (scale 3.5e-4)
    context = dataclasses.replace(_context(states), expected_responses=expected)
    np.testing.assert_allclose(ExpectedFollowTerm(hate_price=0.5)(context), [[2.0, -1.0]])
    np.testing.assert_allclose(ExpectedFollowTerm()(context), [[2.0, 0.0]])
    with pytest.raises(ValueError, match="expected responses"):
        ExpectedFollowTerm()(_context(states))


def test_a_pair_value_term_combines_the_values_in_reward_std_units():
    states = np.zeros((2, 3, len(PAIR_STATE_FEATURES)))
    states[1, 2, 0] = 1.0

    def values(flat):
        return np.stack([flat[:, 0], 2 * flat[:, 0], np.zeros(len(flat)), 4 * flat[:, 0]], axis=1)

    term = PairValueTerm(values, reward_std=np.array([1.0, 4.0, 1.0, 0.5]), coefficients=(1.0, 1.0, 3.0, 0.5))
    context = dataclasses.replace(_context(states), pair_states=states)
    expected = np.zeros((2, 3))
    expected[1, 2] = 1.0 + 2.0 / 4.0 + 0.0 + 0.5 * 4.0 / 0.5
    np.testing.assert_allclose(term(context), expected)
    with pytest.raises(ValueError, match="one value per signal"):
        PairValueTerm(values, reward_std=np.ones(3))


def _context(states):
    from recsys_rl.sim.simulator import PageContext

    n, c = states.shape[:2]
    return PageContext(
        users=np.arange(n), requests=np.arange(n), sessions=np.arange(n), request=None,
        candidates=np.zeros((n, c), np.int64), predictions=np.zeros((n, c, 7)),
    )  # fmt: skip
