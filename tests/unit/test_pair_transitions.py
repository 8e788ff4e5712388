"""The user-author surface's transitions (issue 22): one step per interaction of a pair, adjacent-state
approximation at the cut-off, and histories that carry a pair across runs."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys_rl.pair_state import PairHistory
from recsys_rl.pipelines.user_author import (
    HISTORIES_FILE,
    PAIR_HISTORIES,
    PairRecord,
    feature_rows,
    histories_of,
    history_line,
    pair_transitions,
    read_histories,
    with_pair_rewards,
)
from recsys_rl.signals import PAIR_SIGNALS
from recsys_rl.state import DAY_MS
from recsys_rl.storage import location

HOUR_MS = DAY_MS // 24
BASE = 10 * DAY_MS  # the run starts on day 10


def _fact(
    author: str, item: str, time_ms: int, click=0, follow=0, gift=0.0, item_type="video", request=None
) -> dict:
    return {
        "user_id": "u",
        "request_id": request or f"r-{item}",
        "item_id": item,
        "author_id": author,
        "item_type": item_type,
        "event_time_ms": time_ms,
        "watch_time_s": 3.0,
        "click": click,
        "like": 0,
        "follow": follow,
        "comment": 0,
        "share": 0,
        "hate": 0,
        "live_watch_s": 0.0,
        "gift": gift,
    }


def _state(views, clicks, followed, gifts, days, first=0.0) -> list[float]:
    return [math.log1p(views), math.log1p(clicks), followed, math.log1p(gifts), math.log1p(days), first]


def test_a_hand_computed_week_of_two_pairs():
    """Author a: two clicks an hour apart (the second with a follow), then a gift three days later.
    Author b: met twice before this run, once more on day 11. The run's cut-off is day 15."""
    facts = [
        _fact("a", "a1", BASE + HOUR_MS, click=1),
        _fact("a", "a3", BASE + 3 * DAY_MS + HOUR_MS, gift=5.0, item_type="live"),
        _fact("b", "b1", BASE + DAY_MS),
        _fact("a", "a2", BASE + 2 * HOUR_MS, click=1, follow=1),
    ]
    b_before = PairHistory(views=2, clicks=1, last_time_ms=BASE - 2 * DAY_MS)
    prior = {
        "b": PairRecord(b_before, b_before),
        "c": PairRecord(running=PairHistory(views=1, last_time_ms=BASE)),
    }
    cut_off = BASE + 5 * DAY_MS
    rows, histories = pair_transitions("u", facts, cut_off, prior)

    assert [(r["author_id"], r["item_id"], r["pair_step"]) for r in rows] == [
        ("a", "a1", 0), ("a", "a2", 1), ("a", "a3", 2), ("b", "b1", 2),
    ]  # fmt: skip
    a1, a2, a3, b1 = rows
    assert {(r["surface"], r["user_id"]) for r in rows} == {("user_author", "u")}
    assert [(r["item_type"], r["event_time_ms"]) for r in (a1, a3)] == [
        ("video", BASE + HOUR_MS), ("live", BASE + 3 * DAY_MS + HOUR_MS)
    ]  # fmt: skip
    # the first meeting: no history, no return
    assert a1["state"] == _state(0, 0, 0, 0, 0, first=1.0)
    assert a1["reward"] == [1.0, 0.0, 0.0, 0.0]
    # an hour later, the same day: its state is the same, since the day is not over (what serving knows)
    assert a1["next_state"] == _state(0, 0, 0, 0, 0, first=1.0) == a2["state"]
    assert a1["gap_days"] == pytest.approx(1 / 24) and not a1["truncated"]
    # a follow, but not a return
    assert a2["reward"] == [1.0, 1.0, 0.0, 0.0]
    # three days on, day 10 has settled: both meetings and the follow are in the state
    assert a2["next_state"] == _state(2, 2, 1, 0, 3 - 1 / 24) == a3["state"]
    assert a2["next_event_time_ms"] == BASE + 3 * DAY_MS + HOUR_MS
    # three days later: the gift and a return; no later meeting, so the state at the cut-off stands in
    assert a3["reward"] == [0.0, 0.0, 5.0, 1.0]
    assert a3["truncated"] and a3["next_event_time_ms"] == -1
    assert a3["next_state"] == _state(3, 2, 1, 5, 2 - 1 / 24)
    assert a3["gap_days"] == pytest.approx(2 - 1 / 24)
    # b's history before the run counts, and its meeting on day 11 is a return after two days away
    assert b1["state"] == _state(2, 1, 0, 0, 3) and b1["reward"] == [0.0, 0.0, 0.0, 1.0]
    assert b1["next_state"] == _state(3, 1, 0, 0, 4) and b1["truncated"]
    a_day_10 = PairHistory(views=2, clicks=2, followed=True, last_time_ms=BASE + 2 * HOUR_MS)
    a_last = BASE + 3 * DAY_MS + HOUR_MS
    assert histories == {
        "a": PairRecord(
            a_day_10, PairHistory(views=3, clicks=2, followed=True, gifts=5.0, last_time_ms=a_last)
        ),
        "b": PairRecord(b_before, PairHistory(views=3, clicks=1, last_time_ms=BASE + DAY_MS)),
        "c": prior["c"],  # not met in this run: carried unchanged
    }
    assert PAIR_SIGNALS == ("click", "follow", "gift", "author_return")  # the order rewards are written in
    # the records go to the next run through a JSON line and come back whole
    line = json.loads(json.dumps(history_line("u", histories)))
    assert line["user_id"] == "u" and histories_of(line["pairs"]) == histories


def test_each_request_row_holds_the_pair_rewards_of_its_views():
    """The week above, paged: a1 and a2 on one page (r1), a3 (the gift and a return) on r2, b1 (a return)
    on r3; r4 had no view."""
    facts = [
        _fact("a", "a1", BASE + HOUR_MS, click=1, request="r1"),
        _fact("a", "a2", BASE + HOUR_MS + 1, click=1, follow=1, request="r1"),
        _fact("a", "a3", BASE + 3 * DAY_MS + HOUR_MS, gift=5.0, item_type="live", request="r2"),
        _fact("b", "b1", BASE + DAY_MS, request="r3"),
    ]
    b_before = PairHistory(views=2, clicks=1, last_time_ms=BASE - 2 * DAY_MS)
    pair_rows, _ = pair_transitions("u", facts, BASE + 5 * DAY_MS, {"b": PairRecord(b_before, b_before)})
    assert [row["request_id"] for row in pair_rows] == ["r1", "r1", "r2", "r3"]
    requests = [{"request_id": r, "pair_reward": [0.0] * 4} for r in ("r1", "r2", "r3", "r4")]
    with_pair_rewards(requests, pair_rows)
    assert [row["pair_reward"] for row in requests] == [
        [2.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 5.0, 1.0],
        [0.0, 0.0, 0.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],
    ]


def test_a_fact_after_the_cut_off_is_refused_naming_the_user():
    with pytest.raises(ValueError, match=r"user 'u'.*after the cut-off"):
        pair_transitions("u", [_fact("a", "a1", BASE + DAY_MS)], BASE)
    [row], _ = pair_transitions("u", [_fact("a", "a1", BASE)], BASE)  # one at the cut-off is this run's
    assert row["truncated"] and row["gap_days"] == 0.0


def test_the_feature_stores_rows_are_the_met_pairs_running_totals(tmp_path):
    """Only the pairs met in the run are written, each with its totals through its last interaction; and
    the histories file is read back as the per-user builder receives it."""
    a = PairRecord(running=PairHistory(views=3, clicks=2, followed=True, gifts=5.0, last_time_ms=BASE + 7))
    c = PairRecord(running=PairHistory(views=1, last_time_ms=BASE))
    assert feature_rows("u", {"a"}, {"a": a, "c": c}) == [
        {
            "user_id": "u",
            "author_id": "a",
            "views": 3,
            "clicks": 2,
            "followed": 1,
            "gifts": 5.0,
            "last_interaction_ms": BASE + 7,
        }
    ]
    path = tmp_path / HISTORIES_FILE
    assert list(read_histories(location(str(path)))) == []  # a group's first run: nothing carried in
    path.write_text("\n".join(json.dumps(history_line(u, {"a": a})) for u in ("u", "v")) + "\n")
    carried = list(read_histories(location(str(path))))
    assert [user for user, _ in carried] == ["u", "v"]
    assert all(kind == PAIR_HISTORIES and histories_of(pairs) == {"a": a} for _, (kind, pairs) in carried)


_facts = st.lists(
    st.tuples(
        st.sampled_from("abc"),
        st.integers(0, 6 * DAY_MS),
        st.integers(0, 1),
        st.integers(0, 1),
        st.sampled_from([0.0, 2.0]),
    ),
    max_size=25,
    unique_by=lambda t: (t[0], t[1]),
).map(lambda ts: [_fact(a, f"{a}{t}", BASE + t, click=c, follow=f, gift=g) for a, t, c, f, g in ts])


@settings(max_examples=60, deadline=None)
@given(facts=_facts, split=st.integers(0, 6 * DAY_MS))
def test_two_runs_chained_by_their_histories_are_one_run(facts, split):
    """Cutting the facts into two runs at ``split`` (the second run starting from the first's records)
    gives the whole run's rows, except that the first run's last step per pair is truncated there; a
    split in the middle of a day included."""
    cut_off = BASE + 7 * DAY_MS
    whole, whole_histories = pair_transitions("u", facts, cut_off)
    early = [f for f in facts if f["event_time_ms"] < BASE + split]
    late = [f for f in facts if f["event_time_ms"] >= BASE + split]
    first, carried = pair_transitions("u", early, BASE + split)
    second, histories = pair_transitions("u", late, cut_off, carried)

    assert histories == whole_histories
    authors = {f["author_id"] for f in facts}
    assert len(whole) == len(facts) and sum(r["truncated"] for r in whole) == len(authors)
    key = {(r["author_id"], r["pair_step"]): r for r in whole}
    for row in second:
        assert row == key[row["author_id"], row["pair_step"]]
    for row in first:
        expected = key[row["author_id"], row["pair_step"]]
        assert row["state"] == expected["state"] and row["reward"] == expected["reward"]
        if not row["truncated"]:
            assert row["next_state"] == expected["next_state"]
    # within a pair, each step's next state is the following step's state (the chain is unbroken)
    for row in whole:
        following = key.get((row["author_id"], row["pair_step"] + 1))
        assert row["truncated"] == (following is None)
        if following is not None:
            assert row["next_state"] == following["state"]
