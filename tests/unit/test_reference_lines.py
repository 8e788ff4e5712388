"""Reference lines: segments from observable state, groups from hidden traits, constraint checks, and the
selections."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.sim import reference_lines as rl
from recsys_rl.sim.behaviour import behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator
from recsys_rl.sim.world import FACTOR_SIGNALS, Users
from recsys_rl.state import ACTIVITY_GROUPS, FEED_STATE_FEATURES, PRIOR_INTERACTION_RATE

K = len(signals.FEED_SIGNALS)


def _state(group: int, interaction_rate: float) -> np.ndarray:
    state = np.zeros(len(FEED_STATE_FEATURES))
    state[FEED_STATE_FEATURES.index(f"group_{ACTIVITY_GROUPS[group]}")] = 1.0
    state[FEED_STATE_FEATURES.index("hist_interaction_rate")] = interaction_rate * 10.0
    return state


def test_segments_are_the_activity_group_and_whether_the_logged_interaction_rate_beats_the_prior():
    states = np.stack(
        [
            _state(0, PRIOR_INTERACTION_RATE * 2),
            _state(0, PRIOR_INTERACTION_RATE / 2),
            _state(3, PRIOR_INTERACTION_RATE * 2),
            _state(2, PRIOR_INTERACTION_RATE),  # at the prior: no evidence of more, so not the social half
        ]
    )
    assert rl.segment_of(states).tolist() == [1, 0, 7, 4]


def test_a_segmented_policy_serves_its_segments_logits_plus_the_state_dependence():
    coef = behaviour_feed_policy().state_coef
    logits = np.arange(rl.N_SEGMENTS * K, dtype=float).reshape(rl.N_SEGMENTS, K)
    policy = rl.SegmentedFeedPolicy(logits, coef)
    states = np.stack([_state(2, 0.0), _state(1, 1.0)])
    actions, log_prob = policy.act(states, np.random.default_rng(0))
    np.testing.assert_allclose(actions, logits[[4, 3]] + states @ coef)
    assert log_prob.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"SegmentedFeedPolicy.logits should have shape \(8, 7\)"):
        rl.SegmentedFeedPolicy(logits[:3], coef)


def test_holds_asks_every_auxiliary_signal_to_keep_its_level_in_its_direction():
    reference = np.ones(K)
    better = reference.copy()
    better[0] = 0.5  # watch time is the objective, not a constraint
    better[signals.FEED_SIGNALS.index("hate")] = 0.9  # less hate is fine
    assert rl.holds(better, reference)
    worse = reference.copy()
    worse[signals.FEED_SIGNALS.index("hate")] = 1.1
    assert not rl.holds(worse, reference)
    for signal in signals.FEED_SIGNALS[1:-1]:  # each one alone, the first after watch time too
        fewer = reference.copy()
        fewer[signals.FEED_SIGNALS.index(signal)] = 0.99
        assert not rl.holds(fewer, reference), signal


def _totals(by_segment: np.ndarray) -> rl.SegmentTotals:
    return rl.SegmentTotals(by_segment, np.zeros((0, K)), by_segment.sum(axis=0))


def _assignments(values: list[rl.SegmentTotals], behaviour: rl.SegmentTotals) -> list[np.ndarray]:
    """The shortlist from the behaviour's own weighting (candidate 0 in every segment)."""
    by_segment = np.stack([v.by_segment for v in values])
    start = np.zeros(rl.N_SEGMENTS, dtype=np.int64)
    return rl._segment_assignments(by_segment, behaviour.total, start, rng=np.random.default_rng(0))


def _watch_by_sums(values: list[rl.SegmentTotals], assignment: np.ndarray) -> float:
    return float(sum(values[c].by_segment[s, 0] for s, c in enumerate(assignment)))


def test_the_oracle_trades_between_segments_under_the_global_constraints():
    """Two segments, two candidates: each candidate wins watch time in one segment by giving up likes
    there and adding them in the other. Neither holds the constraint everywhere alone; the mix does."""
    like = signals.FEED_SIGNALS.index("like")
    behaviour = np.ones((rl.N_SEGMENTS, K))
    first, second = behaviour.copy(), behaviour.copy()
    first[0, [0, like]] = [1.5, 0.6]  # segment 0: +0.5 watch, -0.4 likes
    first[1, like] = 0.7  # segment 1: -0.3 likes
    second[1, [0, like]] = [1.1, 1.8]  # segment 1: +0.1 watch, +0.8 likes
    second[0, like] = 0.0  # segment 0: -1 like
    greedy = behaviour.copy()
    greedy[1, [0, like]] = [1.3, 0.0]  # segment 1's most watch time, but it gives up all its likes
    # candidate 0: the behaviour itself
    values = [_totals(behaviour), _totals(first), _totals(second), _totals(greedy)]
    assert rl._most_watch_holding(values, _totals(behaviour)) == 0  # alone, neither new candidate holds
    by_segment = np.stack([v.by_segment for v in values])
    relaxed = rl._lagrangian_assignments(by_segment, behaviour.sum(axis=0), np.random.default_rng(0))
    assert [1, 2] + [0] * (rl.N_SEGMENTS - 2) in [a.tolist() for a in relaxed]  # the relaxation finds it
    assert all(
        rl.holds(by_segment[a, np.arange(rl.N_SEGMENTS)].sum(axis=0), behaviour.sum(axis=0)) for a in relaxed
    )
    shortlist = _assignments(values, _totals(behaviour))
    sums = [sum(values[c].by_segment[s] for s, c in enumerate(a)) for a in shortlist]
    assert all(rl.holds(total, behaviour.sum(axis=0)) for total in sums)  # every one holds by its sums
    assert [t[0] for t in sums] == sorted((t[0] for t in sums), reverse=True)  # most watch first
    chosen = shortlist[0]
    # first where it gains, second where it pays the likes back (not greedy, which would break them)
    assert chosen[:2].tolist() == [1, 2]
    total = sum(values[c].by_segment[s] for s, c in enumerate(chosen))
    assert rl.holds(total, behaviour.sum(axis=0)) and total[0] > behaviour[:, 0].sum()


def test_the_shortlist_is_ordered_by_watch_time_not_by_the_assignments_or_another_signal():
    """Two weightings that hold everywhere: the first gives more watch time, the second more clicks and
    likes; uniform segments make each assignment all one or all the other."""
    click, like = signals.FEED_SIGNALS.index("click"), signals.FEED_SIGNALS.index("like")
    behaviour = np.ones((rl.N_SEGMENTS, K))
    watchful, engaging = behaviour.copy(), behaviour.copy()
    watchful[:, 0] = 1.2
    engaging[:, [0, click, like]] = [1.13, 1.1, 1.2]
    values = [_totals(behaviour), _totals(watchful), _totals(engaging)]
    shortlist = [a.tolist() for a in _assignments(values, _totals(behaviour))]
    assert shortlist[0] == [1] * rl.N_SEGMENTS
    assert [2] * rl.N_SEGMENTS in shortlist
    watch = [_watch_by_sums(values, a) for a in shortlist]
    assert watch == sorted(watch, reverse=True)
    assert [0] * rl.N_SEGMENTS not in shortlist  # the start is the global weighting's, run apart
    by_segment = np.stack([v.by_segment for v in values])
    from_watchful = rl._segment_assignments(
        by_segment, behaviour.sum(axis=0), np.ones(rl.N_SEGMENTS, dtype=np.int64), np.random.default_rng(0)
    )
    assert [1] * rl.N_SEGMENTS not in [a.tolist() for a in from_watchful]  # found by a multiplier too


def test_the_trades_move_two_segments_at_once_where_no_single_move_gains_and_holds():
    """From the behaviour everywhere: moving segment 0 to the first candidate gains watch time but spends
    likes; the second candidate pays them back in segment 1 at no watch time, so neither move alone is a
    gain that holds, and the pair is. The third, the most watch time in segment 1, gives up all its
    likes."""
    like = signals.FEED_SIGNALS.index("like")
    behaviour = np.ones((rl.N_SEGMENTS, K))
    first, second, greedy = behaviour.copy(), behaviour.copy(), behaviour.copy()
    first[0, [0, like]] = [1.5, 0.6]
    second[1, like] = 1.8
    greedy[1, [0, like]] = [1.3, 0.0]
    values = np.stack([behaviour, first, second, greedy])
    start = np.zeros(rl.N_SEGMENTS, dtype=np.int64)
    path = rl._trades_from(values, behaviour.sum(axis=0), start)
    assert [a.tolist() for a in path] == [[1, 2] + [0] * (rl.N_SEGMENTS - 2)]
    assert start.tolist() == [0] * rl.N_SEGMENTS  # the start is not moved in place
    # from an assignment no pair improves, the search stays
    assert rl._trades_from(values, behaviour.sum(axis=0), path[0]) == []
    # a gain within rounding of the total is not one: the search would otherwise cycle on rounding error
    tiny = behaviour.copy()
    tiny[:, 0] = 125.0  # watch time 1,000 in all; the other signals 8
    nudged = tiny.copy()
    nudged[2, 0] += 1e-10
    assert rl._trades_from(np.stack([tiny, nudged]), tiny.sum(axis=0), start) == []
    nudged[2, 0] += 1e-8
    assert len(rl._trades_from(np.stack([tiny, nudged]), tiny.sum(axis=0), start)) == 1
    # where every move gains and holds, two segments a step, each step its own assignment
    better = 1.1 * behaviour
    better[:, signals.FEED_SIGNALS.index("hate")] = 0.9
    steps = rl._trades_from(np.stack([behaviour, better]), behaviour.sum(axis=0), start)
    assert [a.sum() for a in steps] == list(range(2, rl.N_SEGMENTS + 1, 2))


def test_the_shortlist_holds_a_trade_that_no_multiplier_supports():
    """Segment 0's middle candidate (more watch time, fewer likes) is never the best for any multiplier
    on likes: below 0.8 the behaviour's weighting beats it, above 1.2 the watch-only one does. With the
    likes paid back in segment 1 it is the best assignment that holds, so only the trades find it."""
    like = signals.FEED_SIGNALS.index("like")
    behaviour = np.ones((rl.N_SEGMENTS, K))
    middle, watch_only, payback = behaviour.copy(), behaviour.copy(), behaviour.copy()
    middle[0, [0, like]] = [1.4, 0.5]
    watch_only[0, [0, like]] = [2.0, 0.0]
    payback[1, like] = 1.6
    values = [_totals(v) for v in (behaviour, middle, watch_only, payback)]
    assert _assignments(values, _totals(behaviour))[0].tolist() == [1, 3] + [0] * (rl.N_SEGMENTS - 2)


def test_the_oracle_is_the_assignment_whose_own_run_has_the_most_watch_time_within_the_constraints():
    """Runs of the global weighting (first) and of three shortlisted assignments: the one with the most
    watch time breaks a constraint as run, so the next holding one wins; none holding leaves the global."""
    like = signals.FEED_SIGNALS.index("like")
    behaviour = _totals(np.ones((rl.N_SEGMENTS, K)))
    runs = []
    for watch, likes in ((1.01, 1.0), (1.5, 0.99), (1.2, 1.0), (1.1, 1.05)):
        run = np.ones((rl.N_SEGMENTS, K))
        run[:, [0, like]] = watch, likes
        runs.append(_totals(run))
    assert rl._most_watch_holding(runs, behaviour) == 2
    assert rl._most_watch_holding([runs[0], runs[1]], behaviour) == 0
    # none holds, not even the first: the first all the same (the default), not the most watch time
    nothing_holds = [runs[1], runs[1], _totals(np.full((rl.N_SEGMENTS, K), 0.5))]
    assert rl._most_watch_holding(nothing_holds, behaviour) == 0


def test_the_summary_names_the_candidates_and_the_chosen_logits_rounded():
    coef = behaviour_feed_policy().state_coef
    candidates = np.array([[0.123456] * K, [1.987654] * K, [2.0] * K])
    ones = _totals(np.ones((rl.N_SEGMENTS, K)))
    oracle = np.array([1, 2] * (rl.N_SEGMENTS // 2))
    by_user = np.array([[4.0] * K, [2.0] * K, [2.0] * K])  # three users, the segments' total of 8
    ones = rl.SegmentTotals(ones.by_segment, by_user, ones.total)
    twos = rl.SegmentTotals(np.full((rl.N_SEGMENTS, K), 2.0), 2 * by_user, 2 * ones.total)
    lines = rl.ReferenceLines(
        global_policy=rl.SegmentedFeedPolicy.global_weighting(candidates[1], coef),
        oracle_policy=rl.SegmentedFeedPolicy(candidates[oracle], coef),
        candidates=candidates,
        behaviour=ones,
        values=[ones, twos, ones],
        global_index=1,
        oracle_indices=oracle,
        oracle_composite=ones,
        selection_groups=np.array([0, 1, 1]),
        hidden_oracle_indices=np.array([2, 1] + [0] * (rl.N_HIDDEN_GROUPS - 2)),
        hidden_oracle_composite=_totals(np.full((rl.N_SEGMENTS, K), 3.0)),
        oracle_shortlist=[rl.Shortlisted(oracle, ones.total, ones.total)],
        hidden_oracle_shortlist=[
            rl.Shortlisted(np.zeros(rl.N_HIDDEN_GROUPS, dtype=np.int64), twos.total, ones.total),
            rl.Shortlisted(np.full(rl.N_HIDDEN_GROUPS, 2), ones.total, twos.total),
        ],
    )
    summary = lines.summary()
    assert summary["candidates"] == 3
    assert summary["global_logits"] == [1.9877] * K
    assert summary["oracle_logits"] == [[1.9877] * K, [2.0] * K] * (rl.N_SEGMENTS // 2)
    assert summary["selection_lift"]["global"] == dict.fromkeys(signals.FEED_SIGNALS, 1.0)
    assert summary["oracle_composite_lift"] == dict.fromkeys(signals.FEED_SIGNALS, 0.0)
    assert summary["hidden_oracle_logits"][:2] == [[2.0] * K, [1.9877] * K]
    # group 0 (the first user) under candidate 2 (ones), group 1 (the other two) under candidate 1, which
    # doubles them: 4 + 2 * 4 = 12 against the behaviour's 8 in every signal
    hidden = summary["selection_lift"]["hidden_oracle"]
    assert list(hidden.values()) == pytest.approx([0.5] * K)
    assert summary["hidden_oracle_composite_lift"] == dict.fromkeys(signals.FEED_SIGNALS, 2.0)
    zero, one = dict.fromkeys(signals.FEED_SIGNALS, 0.0), dict.fromkeys(signals.FEED_SIGNALS, 1.0)
    assert summary["shortlists"] == {
        "oracle": [{"assignment": oracle.tolist(), "by_sums": zero, "as_run": zero, "holds_as_run": True}],
        # doubling every signal doubles hate too, which breaks its constraint
        "hidden_oracle": [
            {"assignment": [0] * rl.N_HIDDEN_GROUPS, "by_sums": one, "as_run": zero, "holds_as_run": True},
            {"assignment": [2] * rl.N_HIDDEN_GROUPS, "by_sums": zero, "as_run": one, "holds_as_run": False},
        ],
    }


def test_a_small_search_chooses_feasible_lines_with_the_oracle_at_least_the_global():
    search = rl.SearchConfig(users=300, days=1, random_candidates=2, local_candidates=1, local_scales=(0.2,))
    lines = rl.search_reference_lines(search, SimConfig())
    assert lines.candidates.shape == (1 + 2 * K + 2 + 1, K)
    base = behaviour_feed_policy().base_logits
    np.testing.assert_array_equal(lines.candidates[0], base)
    # then each signal's logit moved alone, up and then down, by the axis step
    np.testing.assert_allclose(lines.candidates[1 : 1 + K] - base, search.axis_step * np.eye(K))
    np.testing.assert_allclose(lines.candidates[1 + K : 1 + 2 * K] - base, -search.axis_step * np.eye(K))
    assert (lines.global_policy.version, lines.oracle_policy.version) == (
        "reference-global",
        "reference-oracle",
    )
    global_total = lines.values[lines.global_index].total
    if lines.global_index:  # a candidate other than the behaviour's own logits must hold
        assert rl.holds(global_total, lines.behaviour.total)
    # chosen by its own run: never below the global weighting's, and holding when it is not that
    assert lines.oracle_composite.total[0] >= global_total[0]
    if not np.array_equal(lines.oracle_indices, np.full(rl.N_SEGMENTS, lines.global_index)):
        assert rl.holds(lines.oracle_composite.total, lines.behaviour.total)
    summary = lines.summary()
    # the composite is the oracle policy itself, run on the selection world with the same draws
    rerun = rl.segment_totals(
        SimConfig(n_users=search.users), lines.oracle_policy, seed=search.seed, days=search.days
    )
    np.testing.assert_array_equal(lines.oracle_composite.by_segment, rerun.by_segment)
    composite_lift = (rerun.total - lines.behaviour.total) / np.abs(lines.behaviour.total)
    assert list(summary["oracle_composite_lift"].values()) == pytest.approx(composite_lift.tolist())
    # the hidden-trait oracle: the selection world's own users' groups, and its composite is its own run
    config = SimConfig(n_users=search.users)
    world_users = Simulator(config, search.seed).world.users
    np.testing.assert_array_equal(lines.selection_groups, rl.hidden_trait_groups(world_users))
    hidden = lines.hidden_oracle_policy(config, search.seed)
    np.testing.assert_array_equal(hidden.groups, lines.selection_groups)
    hidden_rerun = rl.segment_totals(config, hidden, seed=search.seed, days=search.days)
    np.testing.assert_array_equal(lines.hidden_oracle_composite.by_user, hidden_rerun.by_user)
    assert lines.hidden_oracle_composite.total[0] >= global_total[0]
    # each oracle's shortlist: the global weighting first (its sums are its run), the chosen run among them
    for shortlist, composite in (
        (lines.oracle_shortlist, lines.oracle_composite),
        (lines.hidden_oracle_shortlist, lines.hidden_oracle_composite),
    ):
        assert 1 <= len(shortlist) <= 1 + search.oracle_shortlist
        np.testing.assert_allclose(shortlist[0].by_sums, global_total)
        np.testing.assert_array_equal(shortlist[0].as_run, global_total)
        assert any(np.array_equal(entry.as_run, composite.total) for entry in shortlist)
        for entry in shortlist[1:]:  # shortlisted for holding every constraint by their sums
            assert rl.holds(entry.by_sums, lines.behaviour.total)
    # a shortlisted assignment's run is its policy's on the selection world and draws
    entry = lines.hidden_oracle_shortlist[-1]
    policy = rl.UserGroupedFeedPolicy(
        lines.candidates[entry.assignment], behaviour_feed_policy().state_coef, hidden.groups
    )
    rerun = rl.segment_totals(config, policy, seed=search.seed, days=search.days)
    np.testing.assert_array_equal(entry.as_run, rerun.total)
    # another world, other users: the policy takes that world's groups
    other = lines.hidden_oracle_policy(config, search.seed + 1)
    assert not np.array_equal(other.groups, hidden.groups)
    assert set(summary["selection_lift"]) == {"global", "oracle", "hidden_oracle"}


def _users(social: np.ndarray, interaction_log_factor: np.ndarray) -> Users:
    n = social.size
    propensity = np.zeros((n, len(FACTOR_SIGNALS)))
    propensity[:, FACTOR_SIGNALS.index("comment")] = interaction_log_factor
    propensity[:, FACTOR_SIGNALS.index("hate")] = -10.0 * interaction_log_factor  # not an interaction
    return Users(np.zeros(n, int), np.ones((n, 1)), np.zeros(n), np.zeros(n), propensity, social)


def test_hidden_trait_groups_are_social_quartile_major_and_interaction_quartile_minor():
    """Sixteen users: social rises with the row of a 4 x 4 grid, interactions with its column, shuffled;
    each user's group is its grid cell. Hate's factor (reversed) must not count as an interaction."""
    rows, cols = np.divmod(np.arange(16), 4)
    order = np.random.default_rng(0).permutation(16)
    groups = rl.hidden_trait_groups(_users(0.1 + 0.2 * rows[order], cols[order] - 1.5))
    assert groups.tolist() == (4 * rows + cols)[order].tolist()
    assert rl.N_HIDDEN_GROUPS == 16


def test_a_user_grouped_policy_serves_each_rows_users_group_plus_the_state_dependence():
    coef = behaviour_feed_policy().state_coef
    logits = np.arange(3 * K, dtype=float).reshape(3, K)
    policy = rl.UserGroupedFeedPolicy(logits, coef, groups=np.array([2, 0, 1, 2]))
    states = np.stack([_state(2, 0.0), _state(1, 1.0), _state(0, 0.5)])
    context = SimpleNamespace(users=np.array([1, 3, 2]))
    actions, log_prob = policy.act_in_context(states, np.random.default_rng(0), context)
    np.testing.assert_allclose(actions, logits[[0, 2, 1]] + states @ coef)
    assert log_prob.tolist() == [0.0, 0.0, 0.0]


def test_totals_by_group_sum_each_groups_users():
    by_user = np.arange(4 * K, dtype=float).reshape(4, K)
    totals = rl.SegmentTotals(np.zeros((rl.N_SEGMENTS, K)), by_user, by_user.sum(axis=0))
    grouped = totals.by_group(np.array([1, 0, 1, 2]), 4)
    np.testing.assert_array_equal(grouped, [by_user[1], by_user[0] + by_user[2], by_user[3], np.zeros(K)])


def test_the_search_chooses_the_same_lines_when_its_runs_go_to_worker_processes():
    """The benchmark hands each round's runs to a process pool: the policies and the run must pickle, and
    no run may depend on the ones before it (the users' draws and the exploration are keyed)."""
    search = rl.SearchConfig(
        users=200, days=1, random_candidates=1, local_candidates=1, local_scales=(0.2,), oracle_shortlist=2
    )
    in_order = rl.search_reference_lines(search, SimConfig())
    messages: list[str] = []
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        pooled = rl.search_reference_lines(search, SimConfig(), messages.append, pool.map)
    np.testing.assert_array_equal(pooled.candidates, in_order.candidates)
    for ours, theirs in zip(pooled.values, in_order.values, strict=True):
        np.testing.assert_array_equal(ours.by_user, theirs.by_user)
    assert (pooled.global_index, pooled.oracle_indices.tolist(), pooled.hidden_oracle_indices.tolist()) == (
        in_order.global_index,
        in_order.oracle_indices.tolist(),
        in_order.hidden_oracle_indices.tolist(),
    )
    np.testing.assert_array_equal(
        pooled.hidden_oracle_composite.by_user, in_order.hidden_oracle_composite.by_user
    )
    # one progress line a run, counted as the first round's come back
    first_round = 1 + 2 * K + search.random_candidates
    assert messages[:first_round] == [f"candidate {i}/{first_round}" for i in range(1, first_round + 1)]
