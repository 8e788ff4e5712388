"""OPE on a dataset built the production way (simulator -> Kafka -> Beam pipeline -> Parquet shards).

The estimators assume what ``LoggedSteps`` checks: sessions in order, steps numbered without gaps, a
logged log-propensity per row. This reads the pipeline's real output and evaluates the behaviour policy
on its own logs, where importance sampling must give back the logged mean exactly (weights of 1, up to
the float32 rounding of the stored actions).
"""

from pathlib import Path

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import evaluate_policy_offline
from recsys_rl.sim.behaviour import behaviour_feed_policy
from recsys_rl.training.agents.data import open_dataset

pytestmark = pytest.mark.integration


def test_the_pipelines_dataset_reads_into_logged_steps(feed_dataset: Path):
    dataset = open_dataset(feed_dataset)
    logged = LoggedSteps.from_dataset(dataset)
    assert logged.rows == dataset.rows and logged.signals == signals.FEED_SIGNALS
    assert logged.done[np.r_[logged.session_starts[1:], logged.rows] - 1].all()
    assert not logged.done[
        np.setdiff1d(np.arange(logged.rows), np.r_[logged.session_starts[1:], logged.rows] - 1)
    ].any()


def test_the_behaviour_policy_on_its_own_dataset_gets_the_logged_mean(feed_dataset: Path):
    logged = LoggedSteps.from_dataset(open_dataset(feed_dataset))
    result = evaluate_policy_offline(
        logged,
        behaviour_feed_policy(),
        estimators=("ips", "snips", "pdis"),
        interval="percentile",
        resamples=50,
    )
    logged_mean = logged.rewards.mean(axis=0)
    for i, name in enumerate(signals.FEED_SIGNALS):
        for estimator in ("ips", "snips"):
            value = result["estimators"][estimator]["overall"][name]["value"]
            assert value == pytest.approx(logged_mean[i], rel=1e-4, abs=1e-9), (estimator, name)
        per_session = result["behaviour"]["per_session_discounted"]["overall"][name]["value"]
        assert result["estimators"]["pdis"]["overall"][name]["value"] == pytest.approx(per_session, rel=1e-3)
    assert result["diagnostics"]["decision"]["ess_fraction"] == pytest.approx(1.0, abs=1e-6)
