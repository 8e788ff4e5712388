"""Interval coverage on simulated multi-day logs: resampling users covers the truth, sessions do not.

The population is one simulated world of 5,000 users over five days of the behaviour policy; each
repetition evaluates the logs of 200 users drawn from it without replacement, so the truth is the
population's own mean per decision (the 4% sampling fraction only makes the intervals conservative).
The target is the behaviour policy itself, so SNIPS is the plain mean and the only question is whether
the interval reflects how much users differ. They differ a lot: a user's sessions share the user's tastes
and history, so the session bootstrap, which treats them as independent, is too narrow on the dense
signals (watch time, clicks, likes).
"""

import dataclasses

import numpy as np
import pytest

from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import evaluate_policy_offline
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

REPETITIONS = 200
USERS_PER_LOG = 200
DENSE = ("watch_time", "click", "like")


@pytest.fixture(scope="module")
def population() -> LoggedSteps:
    sim = Simulator(SimConfig(n_users=5_000), seed=11)
    feed, live = behaviour_feed_policy(), behaviour_allocation_policy()
    return LoggedSteps.from_day_logs([sim.run_day(feed, live) for _ in range(5)])


def _users_logs(population: LoggedSteps, users: np.ndarray) -> LoggedSteps:
    keep = np.isin(population.user, users)
    columns = {
        f.name: getattr(population, f.name)[keep]
        for f in dataclasses.fields(LoggedSteps)
        if f.name not in ("signals", "session")
    }
    session = np.unique(population.session[keep], return_inverse=True)[1]
    return LoggedSteps(**columns, session=session, signals=population.signals)


def _coverage(population: LoggedSteps, unit: str) -> dict[str, float]:
    truth = dict(zip(population.signals, population.rewards.mean(axis=0), strict=True))
    rng = np.random.default_rng(0)
    pool = np.unique(population.user)
    covered = {signal: 0 for signal in DENSE}
    for repetition in range(REPETITIONS):
        logs = _users_logs(population, rng.choice(pool, USERS_PER_LOG, replace=False))
        evaluation = evaluate_policy_offline(
            logs, behaviour_feed_policy(), estimators=("snips",), seed=repetition, groups=False, unit=unit
        )
        assert evaluation["interval"]["unit"] == unit
        for signal in DENSE:
            low, high = evaluation["estimators"]["snips"]["overall"][signal]["interval"]
            covered[signal] += low <= truth[signal] <= high
    return {signal: count / REPETITIONS for signal, count in covered.items()}


def test_the_logs_hold_several_sessions_per_user(population):
    sessions_per_user = population.sessions / np.unique(population.user).size
    assert sessions_per_user > 4


def test_user_clustered_intervals_cover_the_truth_where_session_intervals_fall_short(population):
    users, sessions = _coverage(population, "user"), _coverage(population, "session")
    assert all(rate >= 0.90 for rate in users.values()), users
    assert all(rate < 0.85 for rate in sessions.values()), sessions
