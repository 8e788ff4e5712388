"""One user's view facts -> transitions of the user-author surface (issue 22, RLIV-UA's SCRI-MDP).

RLIV-UA (Kuaishou, arXiv 2507.16253) values each (user, author) pair over its whole life: a step is one
interaction of the pair (the user was shown one of the author's items and responded), and the next state
is the pair's *next* interaction, which may come days and hundreds of requests later (the paper's Sparse
Cross-Request Interaction MDP). Two consequences shape this module:

* **The discount applies once per interaction of the pair, not per request.** Chained through the
  user's requests, a pair seen every third day would see its follow-up discounted by gamma to the power
  of every request in between, and its value targets would vanish; here the next interaction is the
  adjacent step however far away it is. How far it was is not lost: each row carries ``gap_days``, and
  the elapsed days are part of the next state, so a critic can discount by time too, and learn that a
  pair which lapses is worth less (``training.pair_value`` does both, with a gentle per-day discount).
* **The last interaction before the cut-off has no observed successor** (the pair has not met again
  yet, which is not the end of the pair). Its next state is the pair's state at the cut-off: the same
  history, with the days elapsed until the cut-off, and the step is marked ``truncated`` (bootstrap from
  it, do not treat it as terminal). This is our reading of the paper's Adjacent State Approximation:
  only its abstract was reachable while this was written, so the rule above is our design, chosen
  because a pair's state here depends on nothing but its history and the time since its last
  interaction. It is a *waiting* pair's state, not a meeting's: the critic values it as a pair that has
  waited that long (``training.pair_value``), since valuing it as a meeting at the cut-off assumed that
  every pair meets again, which most do not for weeks.

The state is the pair's history through its last *finished* UTC day before the step (views, clicks,
follow, gifts, and the days since the last interaction before that day): what a feature store
materialised once a day can serve for the pair at request time, as the user part of the feed state is
the user's last finished day (``recsys_rl.state``). Two meetings on one day therefore see the same
history; a state built from the running totals instead would hold, in training, what serving cannot know
yet. The exception is the stand-in at the cut-off, built from the running totals: the pair's next
meeting is most likely on a later day, by which time they will have settled. A run sees only its own
days, so each pair's record from the earlier runs comes in as ``prior``; the run hands back its own for
the next. The reward is the progressive funnel of DESIGN 3.3, ``PAIR_SIGNALS``: click, follow, gift, and
the pair's return (this interaction comes on a later day than the pair's previous one).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.pair_state import PairHistory
from recsys_rl.state import DAY_MS
from recsys_rl.storage import Location

#: The histories of every pair met so far, as of a run's cut-off: what the group's next run starts from.
HISTORIES_FILE = "pair-histories.jsonl"
#: The kind of a user's pair histories where the per-user builder receives them beside its events
#: (``pipelines.episodes`` numbers decisions 0 and feedback 1).
PAIR_HISTORIES = 2


class PairRecord(NamedTuple):
    """A pair's history twice: ``settled``, through the day before its last interaction's (what a state on
    that day is built from), and ``running``, through its last interaction."""

    settled: PairHistory = PairHistory()
    running: PairHistory = PairHistory()

    def on_day_of(self, time_ms: int) -> PairRecord:
        """The record as a meeting at ``time_ms`` sees it: on a later day, the running totals have settled."""
        last = self.running.last_time_ms
        if last is not None and time_ms // DAY_MS > last // DAY_MS:
            return PairRecord(self.running, self.running)
        return self

    def after(self, fact: Mapping) -> PairRecord:
        return PairRecord(self.settled, self.running.after(fact))


def pair_transitions(
    user_id: str,
    view_facts: Iterable[Mapping],
    cut_off_ms: int,
    prior: Mapping[str, PairRecord] | None = None,
) -> tuple[list[dict], dict[str, PairRecord]]:
    """The user's pair transitions, ordered by author then time, and each pair's record at the cut-off.

    ``view_facts`` are the user's view facts (``pipelines.episodes``) of this run; ``cut_off_ms`` is the
    run's cut-off in event time, no earlier than any of them; ``prior`` holds the records of pairs seen
    in earlier runs. The returned records are what the next run's ``prior`` should be.
    """
    prior = prior or {}
    by_author: dict[str, list[Mapping]] = defaultdict(list)
    for fact in view_facts:
        if fact["event_time_ms"] > cut_off_ms:
            raise ValueError(
                f"view fact of user {user_id!r} at {fact['event_time_ms']} ms is after the cut-off "
                f"{cut_off_ms} ms; the cut-off must be the run's latest event time or later"
            )
        by_author[fact["author_id"]].append(fact)
    rows: list[dict] = []
    records = dict(prior)
    for author_id in sorted(by_author):
        facts = sorted(by_author[author_id], key=lambda f: (f["event_time_ms"], f["item_id"]))
        record = prior.get(author_id, PairRecord())
        for step, fact in enumerate(facts):
            time_ms = int(fact["event_time_ms"])
            record = record.on_day_of(time_ms)
            state, reward = record.settled.state(time_ms), _rewards(fact, record.running)
            record = record.after(fact)
            if following := facts[step + 1] if step + 1 < len(facts) else None:
                next_time_ms = int(following["event_time_ms"])
                next_state = record.on_day_of(next_time_ms).settled.state(next_time_ms)
            else:  # the adjacent-state stand-in: the running totals at the cut-off
                next_time_ms = cut_off_ms
                next_state = record.running.state(cut_off_ms)
            rows.append(
                {
                    "surface": USER_AUTHOR,
                    "user_id": user_id,
                    "author_id": author_id,
                    "request_id": fact["request_id"],
                    "item_id": fact["item_id"],
                    "item_type": fact["item_type"],
                    "pair_step": record.running.views - 1,
                    "event_time_ms": time_ms,
                    "next_event_time_ms": -1 if following is None else next_time_ms,
                    "gap_days": (next_time_ms - time_ms) / DAY_MS,
                    "state": state,
                    "next_state": next_state,
                    "reward": reward,
                    "truncated": following is None,
                }
            )
        records[author_id] = record
    return rows, records


def _rewards(fact: Mapping, before: PairHistory) -> list[float]:
    """The step's reward vector in ``PAIR_SIGNALS`` order, ``before`` being the pair's history before it.

    The pair's return is credited to the interaction that *is* the return (a later day than the pair's
    previous one), not to the one before it: every reward is then known when its step happens, and the
    step before still gets its discounted share through the bootstrap, since the next state says how
    many days passed.
    """
    returned = before.last_time_ms is not None and (
        fact["event_time_ms"] // DAY_MS > before.last_time_ms // DAY_MS
    )
    return [float(fact["click"] > 0), float(fact["follow"] > 0), float(fact["gift"]), float(returned)]


def with_pair_rewards(request_rows: Iterable[dict], pair_rows: Iterable[Mapping]) -> None:
    """Fill each request row's ``pair_reward`` with the sum of the pair rewards of its views.

    A Rank's user-author term is one decision per request, so the OPE gate judges it on request rows;
    what it is meant to move, the pairs' return above all, is only in the pair rows, which know the
    pairs' histories across runs. The sums bring it to the request that showed the views. A request
    without views keeps its zeros.
    """
    totals: dict[str, list[float]] = {}
    for row in pair_rows:
        total = totals.setdefault(row["request_id"], [0.0] * len(row["reward"]))
        for signal, value in enumerate(row["reward"]):
            total[signal] += value
    for row in request_rows:
        if (total := totals.get(row["request_id"])) is not None:
            row["pair_reward"] = total


def feature_rows(user_id: str, met: Iterable[str], records: Mapping[str, PairRecord]) -> list[dict]:
    """The feature store's rows (``feature_tables.USER_AUTHOR_HISTORY``) of the pairs with the authors
    ``met`` in this run: each pair's totals through its last interaction. Pairs carried in without a new
    interaction are not written again: their last row still holds."""
    rows = []
    for author_id in sorted(met):
        history = records[author_id].running
        rows.append(
            {
                "user_id": user_id,
                "author_id": author_id,
                "views": history.views,
                "clicks": history.clicks,
                "followed": int(history.followed),
                "gifts": history.gifts,
                "last_interaction_ms": history.last_time_ms,
            }
        )
    return rows


def history_line(user_id: str, records: Mapping[str, PairRecord]) -> dict:
    """One user's pair records as a line of ``HISTORIES_FILE``, authors sorted, so reruns write the same
    bytes: each pair as [author id, settled, running], each history as [views, clicks, followed, gifts,
    last interaction ms]."""
    pairs = [
        [author, list(records[author].settled), list(records[author].running)] for author in sorted(records)
    ]
    return {"user_id": user_id, "pairs": pairs}


def histories_of(entries: Iterable[list]) -> dict[str, PairRecord]:
    """Pairs as ``history_line`` writes them -> {author id: record}."""
    return {
        author: PairRecord(PairHistory(*settled), PairHistory(*running))
        for author, settled, running in entries
    }


def read_histories(path: Location) -> Iterator[tuple[str, tuple[int, list[list]]]]:
    """The pair histories a run left, as the per-user builder receives them: (user id, (kind, pairs))."""
    if not path.is_file():
        return
    for line in path.read_bytes().splitlines():
        entry = json.loads(line)
        yield entry["user_id"], (PAIR_HISTORIES, entry["pairs"])
