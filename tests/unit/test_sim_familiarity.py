"""The users' memory of authors (familiarity): views counted per pair across days, up to the saturation;
and what the simulator's dense per-pair tables cost."""

from __future__ import annotations

import tracemalloc
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys_rl.sim.familiarity import Familiarity
from recsys_rl.sim.pair_table import PairTable

USERS, AUTHORS, SATURATION = 3, 4, 5
days_of_views = st.lists(
    st.lists(st.tuples(st.integers(0, USERS - 1), st.integers(0, AUTHORS - 1)), max_size=30), max_size=4
)


@settings(max_examples=80, deadline=None)
@given(days_of_views)
def test_each_pair_remembers_its_views_of_every_finished_day_up_to_the_saturation(days):
    memory = Familiarity(USERS, AUTHORS, SATURATION)
    seen: Counter[tuple[int, int]] = Counter()
    users, authors = np.meshgrid(np.arange(USERS), np.arange(AUTHORS), indexing="ij")
    for day in days:
        if day:
            memory.add_day(*(np.array(column) for column in zip(*day, strict=True)))
        seen.update(day)
        expected = [[min(seen[u, a], SATURATION) for a in range(AUTHORS)] for u in range(USERS)]
        np.testing.assert_array_equal(memory.views(users, authors), expected)


def test_a_user_who_keeps_watching_an_author_stays_at_the_saturation():
    """Past the saturation nothing grows: 300 views a day for days (more than a byte) read as the cap."""
    memory = Familiarity(2, 3, 255)
    for _ in range(3):
        memory.add_day(np.zeros(300, np.int64), np.full(300, 2))
    assert memory.views(np.array([0, 0, 1]), np.array([2, 1, 2])).tolist() == [255, 0, 0]


def test_the_dense_tables_cost_what_their_docstrings_say_a_pair():
    """Both tables are dense over users x authors, so their width is their memory: a byte a pair for
    familiarity, 4 bytes of row index a pair for the pair table (numpy reports to tracemalloc)."""
    pairs = 1_000 * 2_000
    for make, budget in ((lambda: Familiarity(1_000, 2_000, 10), 1), (lambda: PairTable(1_000, 2_000), 4)):
        tracemalloc.start()
        try:
            table = make()
            allocated = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert budget * pairs <= allocated < budget * pairs + 64_000, type(table).__name__
