"""The simulator's threads: a page's rows run in chunks side by side, and nothing a day leaves (its logs,
tomorrow's stores) depends on how many threads or chunks there were."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from recsys_rl.sim import simulator
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import THREADS_VARIABLE, Simulator

FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()
CONFIG = SimConfig(n_users=400)


def _after_days(threads: int, days: int = 3) -> tuple[Simulator, list]:
    sim = Simulator(CONFIG, 9, threads=threads)
    return sim, [sim.run_day(FEED, LIVE) for _ in range(days)]


def _assert_same_days(logs, others) -> None:
    for day, other in zip(logs, others, strict=True):
        for part in ("feed", "live", "views"):
            for name, column in vars(getattr(day, part)).items():
                got = vars(getattr(other, part))[name]
                np.testing.assert_array_equal(got, column, err_msg=f"day {day.day} {part}.{name}")


def _assert_same_stores(sim: Simulator, other: Simulator) -> None:
    """What the nightly jobs left for tomorrow, read as a policy or the world reads it."""
    users = np.arange(CONFIG.n_users)
    pairs = users[:, None], np.arange(CONFIG.n_authors)[None, :]
    for name, column in vars(sim.store.lookup(users)).items():
        np.testing.assert_array_equal(vars(other.store.lookup(users))[name], column, err_msg=name)
    at_ms = np.full(pairs[0].shape, CONFIG.start_time_ms + 10 * 86_400_000)
    np.testing.assert_array_equal(other.pairs.states(*pairs, at_ms), sim.pairs.states(*pairs, at_ms))
    np.testing.assert_array_equal(other.familiarity.views(*pairs), sim.familiarity.views(*pairs))
    np.testing.assert_array_equal(other.follows.follows(*pairs), sim.follows.follows(*pairs))


@pytest.mark.parametrize("threads", [2, 3])
def test_days_run_in_chunks_on_threads_are_the_days_of_one_thread(monkeypatch, threads):
    one, days = _after_days(1)
    monkeypatch.setattr(simulator, "_CHUNK_ROWS", 16)  # every larger page in chunks of uneven sizes
    offered_on: set[str] = set()
    candidates = Simulator._candidates

    def recording(self, *args):
        offered_on.add(threading.current_thread().name)
        return candidates(self, *args)

    monkeypatch.setattr(Simulator, "_candidates", recording)
    several, chunked = _after_days(threads)
    assert len(offered_on) == threads  # the test is only worth something if the chunks ran side by side
    _assert_same_days(days, chunked)
    _assert_same_stores(one, several)
    assert sum(map(len, (several.pairs, several.follows))) > 0  # the stores compared hold something


@pytest.mark.parametrize(
    ("rows", "threads", "bounds"),
    [
        (0, 2, [0, 0]),
        (2047, 4, [0, 2047]),  # two chunks would be under 1,024 rows each
        (2048, 4, [0, 1024, 2048]),
        (5000, 3, [0, 1666, 3333, 5000]),
        (100_000, 2, [0, 50_000, 100_000]),
    ],
)
def test_a_page_is_chunked_a_thread_a_chunk_of_at_least_1024_rows(rows, threads, bounds):
    chunks = Simulator(SimConfig(n_users=10), 0, threads=threads)._chunks(rows)
    assert [(chunk.start, chunk.stop) for chunk in chunks] == list(itertools.pairwise(bounds))


def test_threads_come_from_the_caller_else_the_environment_else_the_cores(monkeypatch):
    config = SimConfig(n_users=10)
    for setting in ("1", "3"):
        monkeypatch.setenv(THREADS_VARIABLE, setting)
        assert Simulator(config, 0).threads == int(setting)
    assert Simulator(config, 0, threads=1).threads == 1
    monkeypatch.delenv(THREADS_VARIABLE)
    for cores, threads in ((1, 1), (2, 2), (64, 4), (None, 1)):
        monkeypatch.setattr(simulator.os, "cpu_count", lambda cores=cores: cores)
        assert Simulator(config, 0).threads == threads


@pytest.mark.parametrize("setting", ["0", "-2", "two", "1.5"])
def test_a_thread_count_below_one_is_refused_by_name(monkeypatch, setting):
    monkeypatch.setenv(THREADS_VARIABLE, setting)
    with pytest.raises(ValueError, match=f"{THREADS_VARIABLE} should be a number of threads, at least 1"):
        Simulator(SimConfig(n_users=10), 0)
    monkeypatch.setenv(THREADS_VARIABLE, " ")  # blank is unset
    assert Simulator(SimConfig(n_users=10), 0).threads >= 1
    with pytest.raises(ValueError, match="Simulator threads should be at least 1, but is 0"):
        Simulator(SimConfig(n_users=10), 0, threads=0)


def test_a_forked_process_starts_threads_of_its_own(monkeypatch):
    """A child forked from a process whose simulator started its threads inherits the pool but none of its
    threads: work handed to it would never come back."""
    monkeypatch.setattr(simulator, "_CHUNK_ROWS", 16)
    sim = Simulator(CONFIG, 9, threads=2)
    sim.run_day(FEED, LIVE)
    parents = sim._pool
    sim.run_day(FEED, LIVE)
    assert parents is not None and sim._pool is parents  # one process, one pool
    monkeypatch.setattr(simulator.os, "getpid", lambda: -1)  # as the child sees it
    sim.run_day(FEED, LIVE)
    assert sim._pool is not parents
