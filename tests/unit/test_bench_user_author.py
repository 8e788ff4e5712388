"""The user-author benchmark's own accounting: the pairs' returns it reports beside the follows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from bench_scripts import load_bench_script

from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS


def _day(day: int, views: list[tuple[int, int, bool]]) -> SimpleNamespace:
    """A day log holding only its views, each (user, item, is_live), as ``pair_meetings`` reads them."""
    user, item, is_live = (np.array(column) for column in zip(*views, strict=True))
    return SimpleNamespace(
        day=day,
        views=SimpleNamespace(
            user=user,
            item=item,
            is_live=is_live.astype(bool),
            time_ms=np.zeros(user.size, np.int64),
            signals=np.zeros((user.size, len(VIEW_SIGNAL_COLUMNS))),
        ),
    )


def test_a_pair_that_meets_on_k_days_returns_k_minus_one_times():
    """Videos 0 and 1 are author 7's, video 2 author 8's; live stream 0 is author 7's too. User 0 meets
    author 7 twice on day 0 and once (live) on day 2: one return; author 8 once: none. User 1 meets
    author 7 on each of three days: two. User 2 never comes."""
    world = SimpleNamespace(
        videos=SimpleNamespace(author=np.array([7, 7, 8])), lives=SimpleNamespace(author=np.array([7]))
    )
    logs = [
        _day(0, [(0, 0, False), (0, 1, False), (0, 2, False), (1, 0, False)]),
        _day(1, [(1, 1, False)]),
        _day(2, [(0, 0, True), (1, 0, False)]),
    ]
    returns = load_bench_script("user_author").pair_returns(logs, world, users=3)
    assert returns.tolist() == [1.0, 2.0, 0.0]
