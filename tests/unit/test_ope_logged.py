"""LoggedSteps from simulator days and from a transition dataset's Parquet shards: the same rows both ways."""

import dataclasses
import hashlib

import numpy as np
import pyarrow as pa
import pytest
from transition_shards import feed_table, write_feed_dataset

from recsys_rl import signals
from recsys_rl.dataset_contract import DATASET_SCHEMA_VERSION
from recsys_rl.ope.logged import LoggedSteps, _list_matrix, group_label, target_log_prob, user_identities
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator
from recsys_rl.state import ACTIVITY_GROUPS
from recsys_rl.training.agents.data import open_dataset

FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()


@pytest.fixture(scope="module")
def simulated():
    sim = Simulator(SimConfig(n_users=150), seed=4)
    return sim, sim.run_day(FEED, LIVE)


def test_day_logs_become_sorted_sessions_with_next_states(simulated):
    sim, day = simulated
    logged = LoggedSteps.from_day_logs([day])
    feed = day.feed
    assert logged.rows == feed.request.size and logged.sessions == np.unique(feed.session).size
    assert logged.signals == signals.FEED_SIGNALS
    # every simulated request appears once, with its own state, action, reward and propensity
    order = np.lexsort((feed.page, feed.session))
    np.testing.assert_array_equal(logged.states, feed.state[order])
    np.testing.assert_array_equal(logged.rewards, feed.reward[order])
    np.testing.assert_array_equal(logged.behaviour_log_prob, feed.log_propensity[order])
    np.testing.assert_array_equal(logged.step, feed.page[order])
    np.testing.assert_array_equal(logged.groups, sim.world.users.group[feed.user[order]])
    # the next state is the session's next page, zeros after its last
    live = np.flatnonzero(~logged.done)
    np.testing.assert_array_equal(logged.next_states[live], logged.states[live + 1])
    assert not logged.next_states[logged.done].any()
    assert logged.done[np.r_[logged.session_starts[1:], logged.rows] - 1].all()
    np.testing.assert_array_equal(logged.session_groups, logged.groups[logged.session_starts])


def test_days_of_separate_runs_keep_their_sessions_apart(simulated):
    _, day = simulated
    other = Simulator(SimConfig(n_users=150), seed=5).run_day(FEED, LIVE)
    assert np.intersect1d(day.feed.session, other.feed.session).size > 0  # both runs count from 0
    pooled = LoggedSteps.from_day_logs([day, other])
    single = [LoggedSteps.from_day_logs([d]) for d in (day, other)]
    assert pooled.sessions == sum(s.sessions for s in single)
    assert pooled.rows == sum(s.rows for s in single)
    # pooling LoggedSteps gives the same log as pooling the days
    concatenated = LoggedSteps.concatenate(single)
    for field in dataclasses.fields(LoggedSteps):
        if field.name != "signals":
            np.testing.assert_array_equal(getattr(concatenated, field.name), getattr(pooled, field.name))
    with pytest.raises(ValueError, match="cannot concatenate"):
        LoggedSteps.concatenate([single[0], dataclasses.replace(single[1], signals=("a",) * 7)])


def _write_dataset(directory, day, deterministic=None, schema_version=DATASET_SCHEMA_VERSION) -> None:
    """The day as the pipeline writes it: two Parquet shards of rows in no particular order.

    ``deterministic``: the rows (in ``LoggedSteps.from_day_logs`` order) served as the policy's mode;
    ``schema_version`` writes the shards as they were then (1: before that column existed, below 4: before
    the user-author term's columns).
    """
    feed = day.feed
    order = np.lexsort((feed.page, feed.session))
    logged = LoggedSteps.from_day_logs([day])
    n = logged.rows

    table = feed_table(
        logged,
        schema_version=schema_version,
        request_id=[f"r{r}" for r in feed.request[order]],
        user_id=[f"u{u}" for u in feed.user[order]],
        session_id=[f"s{s:06d}" for s in feed.session[order]],
        policy_version=[FEED.version] * n,
        event_time_ms=feed.time_ms[order],
        **({} if deterministic is None else {"deterministic": deterministic.astype(np.int64)}),
    )
    write_feed_dataset(directory, table, schema_version=schema_version)


def test_a_dataset_reads_back_as_the_same_steps(simulated, tmp_path):
    _, day = simulated
    _write_dataset(tmp_path, day)
    from_dataset = LoggedSteps.from_dataset(open_dataset(tmp_path))
    expected = LoggedSteps.from_day_logs([day])
    for field in dataclasses.fields(LoggedSteps):
        got, want = getattr(from_dataset, field.name), getattr(expected, field.name)
        if field.name == "signals":
            assert got == want
        elif field.name == "user":  # ids are the simulator's ints in one, digests of "u<id>" in the other
            assert _same_partition(got, want) and got.dtype == want.dtype
        else:
            np.testing.assert_array_equal(got, want, err_msg=field.name)
            assert got.dtype == want.dtype, field.name


def _marked(logged: LoggedSteps, sessions: np.ndarray, step: int = 1) -> np.ndarray:
    """Rows flagged deterministic: decision ``step`` (or the last one, if shorter) of each of ``sessions``."""
    ends = np.r_[logged.session_starts[1:], logged.rows] - 1
    marked = np.zeros(logged.rows, dtype=bool)
    marked[np.minimum(logged.session_starts[sessions] + step, ends[sessions])] = True
    return marked


def test_sessions_holding_a_deterministic_decision_are_left_out_and_counted(simulated, tmp_path):
    """Issue 19: a decision served as the policy's mode logs a density at a point mass, not a
    propensity; the whole session goes (sequential estimators need whole sessions), counted by reason."""
    _, day = simulated
    everything = LoggedSteps.from_day_logs([day])
    dropped = np.arange(0, everything.sessions, 4)  # every fourth session has one such decision
    marked = _marked(everything, dropped)
    _write_dataset(tmp_path, day, deterministic=marked)
    logged = LoggedSteps.from_dataset(open_dataset(tmp_path))
    gone = np.isin(everything.session, dropped)
    assert logged.excluded == {"deterministic": {"decisions": int(gone.sum()), "sessions": dropped.size}}
    assert int(gone.sum()) > dropped.size == int(marked.sum())  # the sessions' sampled decisions go too
    assert (logged.rows, logged.sessions) == (
        everything.rows - gone.sum(),
        everything.sessions - dropped.size,
    )
    # what is left is exactly the other sessions, whole and renumbered
    np.testing.assert_array_equal(logged.states, everything.states[~gone])
    np.testing.assert_array_equal(logged.behaviour_log_prob, everything.behaviour_log_prob[~gone])
    np.testing.assert_array_equal(logged.step, everything.step[~gone])
    assert logged.session[-1] == logged.sessions - 1
    # pooled logs add up what each part left out
    both = LoggedSteps.concatenate([logged, logged])
    assert both.excluded == {
        "deterministic": {"decisions": 2 * int(gone.sum()), "sessions": 2 * dropped.size}
    }


def test_a_version_1_dataset_without_the_column_is_read_whole_as_sampled(simulated, tmp_path):
    _, day = simulated
    _write_dataset(tmp_path, day, schema_version=1)
    logged = LoggedSteps.from_dataset(open_dataset(tmp_path))
    assert logged.rows == LoggedSteps.from_day_logs([day]).rows
    assert logged.excluded == {}


def test_logs_with_nothing_but_deterministic_sessions_are_refused_naming_why(simulated, tmp_path):
    _, day = simulated
    everything = LoggedSteps.from_day_logs([day])
    _write_dataset(tmp_path, day, deterministic=_marked(everything, np.arange(everything.sessions), step=0))
    with pytest.raises(ValueError, match=r"every session .* was left out") as info:
        LoggedSteps.from_dataset(open_dataset(tmp_path))
    message = str(info.value)
    assert f"{everything.sessions} sessions ({everything.rows} decisions)" in message
    assert (
        "served as the policy's mode (serve --no-explore)" in message
        and "not a behaviour propensity" in message
    )


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` group the rows the same way, whatever the labels."""
    pairs = np.unique(np.column_stack([a, b]), axis=0).shape[0]
    return pairs == np.unique(a).size == np.unique(b).size


def test_steps_must_be_numbered_without_gaps(simulated):
    _, day = simulated
    logged = LoggedSteps.from_day_logs([day])
    step = logged.step.copy()
    step[logged.step == 1] = 2  # every second decision claims to be the third
    first = int(np.flatnonzero(logged.step == 1)[0])
    with pytest.raises(
        ValueError,
        match=rf"^LoggedSteps row {first}: step 2, but it is decision 1 of its session; sessions must be "
        r"sorted by step and numbered 0, 1, \.\.\. without gaps$",
    ):
        dataclasses.replace(logged, step=step)
    order = r"^LoggedSteps.session should be codes 0, 1, \.\.\. in non-decreasing order$"
    with pytest.raises(ValueError, match=order):
        dataclasses.replace(logged, session=logged.session[::-1].copy())
    with pytest.raises(ValueError, match=order):  # no gap, but not from 0
        dataclasses.replace(logged, session=logged.session + 1)
    with pytest.raises(ValueError, match=order):  # from 0, but a code skipped between sessions
        dataclasses.replace(logged, session=2 * logged.session)
    with pytest.raises(ValueError, match=r"^rewards have 7 columns for signals \('watch_time'"):
        dataclasses.replace(logged, signals=logged.signals[:-1])


def test_malformed_steps_are_refused_naming_what_disagrees(simulated):
    _, day = simulated
    logged = LoggedSteps.from_day_logs([day])
    n = logged.rows
    with pytest.raises(ValueError, match=rf"^states \({n}, \d+\) and next_states \({n}, \d+\) disagree$"):
        dataclasses.replace(logged, next_states=logged.next_states[:, :-1])
    with pytest.raises(
        ValueError, match=rf"^LoggedSteps.groups should have {n} rows and 1 dims, has \({n}, 1\)$"
    ):
        dataclasses.replace(logged, groups=logged.groups[:, None])  # the rows right, the dims not
    rows = {f.name: getattr(logged, f.name) for f in dataclasses.fields(logged) if f.name != "signals"}
    with pytest.raises(ValueError, match=r"^LoggedSteps needs at least one row$"):
        LoggedSteps(**{k: v[:0] for k, v in rows.items()}, signals=logged.signals)
    one = LoggedSteps(**{k: v[:1] for k, v in rows.items()}, signals=logged.signals)  # one row is a log
    assert one.rows == 1 and one.sessions == 1


def test_without_user_ids_each_session_is_its_own_user(simulated):
    _, day = simulated
    logged = dataclasses.replace(LoggedSteps.from_day_logs([day]), user=None)
    np.testing.assert_array_equal(logged.user, logged.session)
    assert logged.user.dtype == np.int64
    logged.user[:] = -1  # a copy: the sessions are not the users' to change
    assert logged.session[0] == 0


def test_three_logs_concatenate_with_their_sessions_apart(simulated):
    _, day = simulated
    logged = LoggedSteps.from_day_logs([day])
    both = LoggedSteps.concatenate([logged, logged, logged])
    assert both.sessions == 3 * logged.sessions
    assert LoggedSteps.concatenate([logged]).sessions == logged.sessions  # one log is itself
    np.testing.assert_array_equal(both.session[-logged.rows :], logged.session + 2 * logged.sessions)


def test_user_identities_are_the_first_eight_bytes_of_each_ids_blake2b_digest():
    """The identity must not depend on the read (logs read apart are concatenated), so it is pinned."""
    ids = pa.chunked_array([["u1", "u2"], ["u1"]])
    expected = [
        int.from_bytes(hashlib.blake2b(u.encode(), digest_size=8).digest(), "little", signed=True)
        for u in ("u1", "u2", "u1")
    ]
    assert user_identities(ids).tolist() == expected


def test_a_ragged_list_column_is_refused_naming_its_lengths():
    table = pa.table({"state": pa.array([[0.0] * k for k in (1, 2, 3, 4, 5, 6, 7)], pa.list_(pa.float32()))})
    with pytest.raises(ValueError, match=r"^column 'state' holds lists of lengths \[1, 2, 3, 4, 5\]$"):
        _list_matrix(table, "state")
    one = pa.table({"state": pa.array([[1.0, 2.0]], pa.list_(pa.float32()))})
    np.testing.assert_array_equal(_list_matrix(one, "state"), [[1.0, 2.0]])


def test_target_log_prob_in_chunks_equals_one_call(simulated):
    _, day = simulated
    logged = LoggedSteps.from_day_logs([day])
    shifted = dataclasses.replace(FEED, base_logits=FEED.base_logits + 0.2)
    calls = []

    class Recording:
        def log_prob(self, states, actions):
            calls.append(states.shape[0])
            return shifted.log_prob(states, actions)

    chunked = target_log_prob(Recording(), logged.states, logged.actions, chunk_rows=37)
    np.testing.assert_allclose(chunked, shifted.log_prob(logged.states, logged.actions))
    assert max(calls) == 37 and sum(calls) == logged.rows  # the chunks bound a call's memory
    # the behaviour policy's own density reproduces the logged propensities (up to float32 actions)
    np.testing.assert_allclose(
        target_log_prob(FEED, logged.states, logged.actions), logged.behaviour_log_prob, atol=1e-4
    )


def test_group_labels_name_activity_groups():
    assert group_label(0) == "high_active" and group_label(3) == "low_active_or_unknown"
    assert group_label(9) == "9" and group_label(len(ACTIVITY_GROUPS)) == str(len(ACTIVITY_GROUPS))
