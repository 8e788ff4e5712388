"""Issue 19: the OPE result says what the reader left out of the logs, and why, beside what it used."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
from transition_shards import feed_table

from recsys_rl import signals
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import OPESettings, evaluate_lift, evaluate_policy_offline
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

FEED = behaviour_feed_policy()
TARGET = dataclasses.replace(FEED, base_logits=FEED.base_logits + 0.05)
FAST = {"estimators": ("ips", "pdis"), "resamples": 20, "settings": OPESettings(folds=2)}


@pytest.fixture(scope="module")
def day_steps() -> LoggedSteps:
    day = Simulator(SimConfig(n_users=80), seed=2).run_day(FEED, behaviour_allocation_policy())
    return LoggedSteps.from_day_logs([day])


def _shard(logged: LoggedSteps, deterministic: np.ndarray, path) -> None:
    """``logged`` as one transition shard, ``deterministic`` marking the rows served as the mode."""
    pq.write_table(feed_table(logged, deterministic=deterministic.astype(np.int64)), path)


def test_both_results_report_the_sessions_left_out_by_reason(day_steps, tmp_path):
    marked = np.zeros(day_steps.rows, dtype=bool)
    marked[day_steps.session_starts[::3]] = True  # the first decision of every third session
    _shard(day_steps, marked, tmp_path / "shard.parquet")
    logged = LoggedSteps.from_parquet([tmp_path / "shard.parquet"], signals.FEED_SIGNALS)
    gone = np.isin(day_steps.session, day_steps.session[marked])
    expected = {"deterministic": {"decisions": int(gone.sum()), "sessions": int(marked.sum())}}
    for result in (
        evaluate_policy_offline(logged, TARGET, seed=1, **FAST),
        evaluate_lift(logged, TARGET, seed=1, **FAST),
    ):
        assert result["excluded"] == expected
        assert (result["rows"], result["sessions"]) == (day_steps.rows - gone.sum(), logged.sessions)


def test_logs_that_left_nothing_out_say_so(day_steps):
    assert evaluate_policy_offline(day_steps, TARGET, seed=1, **FAST)["excluded"] == {}
