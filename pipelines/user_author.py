"""One user's view facts -> transitions of the user-author surface (issue 22, RLIV-UA's SCRI-MDP).

RLIV-UA (Kuaishou, arXiv 2507.16253) values each (user, author) pair over its whole life: a step is one
interaction of the pair (the user was shown one of the author's items and responded), and the next state
is the pair's *next* interaction, which may come days and hundreds of requests later (the paper's Sparse
Cross-Request Interaction MDP). Two consequences shape this module:

* **The discount applies once per interaction of the pair, not per request or per day.** Chained
  through the user's requests, a pair seen every third day would see its follow-up discounted by
  gamma to the power of every request in between, and its value targets would vanish; here the next
  interaction is the adjacent step however far away it is. How far it was is not lost: the elapsed
  days are part of the next state, so a critic can learn that a pair which lapses is worth less.
* **The last interaction before the cut-off has no observed successor** (the pair has not met again
  yet, which is not the end of the pair). Its next state is approximated by the pair's state at the
  cut-off: the same history, with the days elapsed until the cut-off, and the step is marked
  ``truncated`` (bootstrap from it, do not treat it as terminal). This is our reading of the paper's
  Adjacent State Approximation: only its abstract was reachable while this was written, so the rule
  above is our design, chosen because a pair's state here depends on nothing but its history and the
  time since its last interaction, which the cut-off state has exactly up to the unseen extra wait.

The state is the pair's history *before* the step (views, clicks, follow, gifts, days since the last
interaction): what a feature store can serve for the pair at request time. A run sees only its own
days, so each pair's history before the run comes in as ``prior`` (the Feast pair aggregates of the
earlier runs). The reward is the progressive funnel of DESIGN 3.3, ``PAIR_SIGNALS``: click, follow,
gift, and the pair's return (this interaction comes on a later day than the pair's previous one).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from recsys_rl.signals import PAIR_SIGNALS

DAY_MS = 86_400_000

#: The pair's state, in order: what the pair's history says just before a step.
PAIR_STATE_FEATURES: tuple[str, ...] = (
    "log_views",  # log(1 + earlier interactions)
    "log_clicks",  # log(1 + earlier clicks)
    "followed",  # 1 once the user has followed the author (follows persist)
    "log_gifts",  # log(1 + value of earlier gifts)
    "log_days_since_last",  # log(1 + days since the previous interaction); 0 before the first
    "first",  # 1 when the pair has never interacted before
)


@dataclass(frozen=True)
class PairHistory:
    """What is known of a pair before a step: the running totals its state is computed from."""

    views: int = 0
    clicks: int = 0
    followed: bool = False
    gifts: float = 0.0
    last_time_ms: int | None = None

    def state(self, at_ms: int) -> list[float]:
        """The pair's state at ``at_ms``, in ``PAIR_STATE_FEATURES`` order."""
        first = self.last_time_ms is None
        days = 0.0 if first else max(0, at_ms - self.last_time_ms) / DAY_MS
        return [
            math.log1p(self.views),
            math.log1p(self.clicks),
            float(self.followed),
            math.log1p(self.gifts),
            math.log1p(days),
            float(first),
        ]

    def after(self, fact: Mapping) -> PairHistory:
        """The history once ``fact`` (a view fact of this pair) has happened."""
        return replace(
            self,
            views=self.views + 1,
            clicks=self.clicks + int(fact["click"] > 0),
            followed=self.followed or fact["follow"] > 0,
            gifts=self.gifts + float(fact["gift"]),
            last_time_ms=int(fact["event_time_ms"]),
        )


def pair_transitions(
    user_id: str,
    view_facts: Iterable[Mapping],
    cut_off_ms: int,
    prior: Mapping[str, PairHistory] | None = None,
) -> tuple[list[dict], dict[str, PairHistory]]:
    """The user's pair transitions, ordered by author then time, and each pair's history at the cut-off.

    ``view_facts`` are the user's view facts (``pipelines.episodes``) of this run; ``cut_off_ms`` is the
    run's cut-off in event time, no earlier than any of them; ``prior`` holds the history of pairs seen
    in earlier runs. The returned histories are what the next run's ``prior`` should be.
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
    histories = dict(prior)
    for author_id in sorted(by_author):
        facts = sorted(by_author[author_id], key=lambda f: (f["event_time_ms"], f["item_id"]))
        history = prior.get(author_id, PairHistory())
        for step, fact in enumerate(facts):
            time_ms = int(fact["event_time_ms"])
            following = facts[step + 1] if step + 1 < len(facts) else None
            state, reward = history.state(time_ms), _rewards(fact, history)
            history = history.after(fact)
            next_time_ms = cut_off_ms if following is None else int(following["event_time_ms"])
            rows.append(
                {
                    "user_id": user_id,
                    "author_id": author_id,
                    "item_id": fact["item_id"],
                    "item_type": fact["item_type"],
                    "pair_step": history.views - 1,
                    "event_time_ms": time_ms,
                    "next_event_time_ms": -1 if following is None else next_time_ms,
                    "gap_days": (next_time_ms - time_ms) / DAY_MS,
                    "state": state,
                    "next_state": history.state(next_time_ms),
                    "reward": reward,
                    "truncated": following is None,
                }
            )
        histories[author_id] = history
    return rows, histories


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
    values = {
        "click": float(fact["click"] > 0),
        "follow": float(fact["follow"] > 0),
        "gift": float(fact["gift"]),
        "author_return": float(returned),
    }
    return [values[name] for name in PAIR_SIGNALS]
