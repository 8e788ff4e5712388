"""OPE validated against simulator ground truth: DR converges and its intervals cover the true value.

Logs are days of the behaviour policy on one fixed simulated world (fixed ``seed``), each day with its own
episode seed; the target is the behaviour policy with shifted fusion logits, so its density is known.
The truth is the target's mean reward per feed request on the same world, from ``monte_carlo_values``
averaged over many fresh episode seeds (independent of the logs). Single-decision estimates are taken
over the behaviour's state distribution while the truth runs under the target's, so a small bias is
expected; the shift is kept mild so that it stays well inside the intervals at these sizes.
"""

import dataclasses

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import OPESettings, estimator_terms, evaluate_policy_offline
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

pytestmark = pytest.mark.integration

CONFIG = SimConfig(n_users=200)
WORLD = 3
FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()
TARGET = dataclasses.replace(
    FEED, base_logits=FEED.base_logits + np.array([0.15, -0.1, 0.0, 0.05, 0.0, 0.0, 0.1]), version="shifted"
)
TRUTH_DAYS = 150
LOG_DAYS = 200
#: Signals with enough events per day (about 1,100 requests) for a normal-theory interval; follows,
#: shares and hates come a handful per day, where no bootstrap interval is reliable.
FREQUENT = ("watch_time", "click", "like")
#: Signals whose truth (standard error about 0.1% of the value) is far more precise than DR at 25 days;
#: like's truth is known to about 0.8% only, and its error levels off there.
PRECISE = ("watch_time", "click")


@pytest.fixture(scope="module")
def truth() -> np.ndarray:
    """The target's mean reward per request (S,), over TRUTH_DAYS fresh days of the same world."""
    days = [
        monte_carlo_values(CONFIG, TARGET, LIVE, seed=WORLD, episode_seed=10_000 + e)
        for e in range(TRUTH_DAYS)
    ]
    return np.array([[d.per_request[s] for s in signals.FEED_SIGNALS] for d in days]).mean(axis=0)


@pytest.fixture(scope="module")
def days() -> list[LoggedSteps]:
    return [
        LoggedSteps.from_day_logs([Simulator(CONFIG, WORLD, episode_seed=e).run_day(FEED, LIVE)])
        for e in range(LOG_DAYS)
    ]


def test_dr_relative_error_shrinks_as_the_logs_grow(days, truth):
    """DR's error has two parts: its own spread, which must shrink at about the square-root rate, and the
    small bias of single-decision estimates (behaviour's state distribution, target's truth), which does
    not shrink and must stay small. The spread is measured around DR's value on all the logs (a chunk is
    at most 1/8 of them, which understates its spread by at most 7%)."""
    precise = [signals.FEED_SIGNALS.index(s) for s in PRECISE]

    def dr(logged: LoggedSteps, seed: int) -> np.ndarray:
        return estimator_terms(logged, TARGET, ("dr",), OPESettings(), seed=seed).terms["dr"].value()[precise]

    limit = dr(LoggedSteps.concatenate(days), seed=0)
    spread = {}
    for size, count in ((1, 40), (5, 20), (25, 8)):
        chunks = [dr(LoggedSteps.concatenate(days[i * size : (i + 1) * size]), seed=i) for i in range(count)]
        spread[size] = float(np.mean([np.mean(np.abs(c - limit) / limit) for c in chunks]))
    bias = float(np.mean(np.abs(limit - truth[precise]) / truth[precise]))
    message = (
        ", ".join(f"{size} day(s): {error:.2%}" for size, error in spread.items()) + f"; bias {bias:.2%}"
    )
    # at the square-root rate each 5x more logs divides the spread by 2.2 (x 0.45); ask for x 0.7
    assert spread[5] < 0.7 * spread[1], f"relative spread of DR by log size: {message}"
    assert spread[25] < 0.7 * spread[5], f"relative spread of DR by log size: {message}"
    assert bias < 0.01, f"DR on all {len(days)} days is off the truth: {message}"


def test_dr_percentile_intervals_cover_the_true_value(days, truth):
    covered = []
    for rep, logged in enumerate(days):
        result = evaluate_policy_offline(
            logged, TARGET, estimators=("dr",), interval="percentile", resamples=200, seed=rep, groups=False
        )
        overall = result["estimators"]["dr"]["overall"]
        covered.append(
            [
                overall[s]["interval"][0] <= t <= overall[s]["interval"][1]
                for s, t in zip(signals.FEED_SIGNALS, truth, strict=True)
            ]
        )
    coverage = dict(zip(signals.FEED_SIGNALS, np.mean(covered, axis=0), strict=True))
    report = ", ".join(f"{s} {c:.0%}" for s, c in coverage.items())
    for name in FREQUENT:
        assert coverage[name] >= 0.9, f"95% DR intervals over {len(days)} repetitions covered: {report}"
