"""The sim-eval comparison: lifts, constraint directions from the signal registry, and where a policy is."""

import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.sim import sim_eval
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import Estimate, PolicyValues, monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.sim_eval import (
    AUXILIARY_SIGNALS,
    SimEvalConfig,
    broken_signals,
    compare_values,
    policy_directory,
)
from recsys_rl.training.agents.policy_io import POLICY_MANIFEST, PolicyLoadError

USERS = 400
# the users' own variation, which two runs on one world share: a paired difference cancels it
SHARED = np.random.default_rng(0).normal(0.0, 1.0, (USERS, len(signals.FEED_SIGNALS)))
SHARED -= SHARED.mean(axis=0)  # so that the users' mean is the level given


def _values(return_rate: float = 0.7, noise: float = 0.0, seed: int = 1, **means: float) -> PolicyValues:
    """Values whose users' totals are ``means`` (default 1) plus the shared variation, plus run noise."""
    feed = {name: Estimate(means.get(name, 1.0), 0.1, 500) for name in signals.FEED_SIGNALS}
    live = {name: Estimate(1.0, 0.1, 500) for name in signals.LIVE_SIGNALS}
    per_request = dict.fromkeys(signals.FEED_SIGNALS, 0.1)
    level = np.array([means.get(name, 1.0) for name in signals.FEED_SIGNALS])
    run = noise * np.random.default_rng(seed).normal(0.0, 1.0, SHARED.shape)
    return PolicyValues(feed, live, per_request, 500, return_rate, per_user=level + SHARED + run)


def test_a_policy_equal_to_the_behaviour_has_no_lift_and_meets_every_constraint():
    report = compare_values(_values(), _values())
    assert all(v["lift"] == 0.0 for v in report["signals"].values())
    assert report["constraints_satisfied"]
    # paired: the users' shared variation cancels, the interval is a point at zero
    assert report["constraints"]["click"]["margin_stderr"] == 0.0
    assert report["constraints"]["click"]["verdict"] == "held"


def test_noise_alone_is_inconclusive_not_a_violation():
    """Two runs that differ only by noise: the interval covers zero on every signal, so no verdict is
    drawn from a point estimate's sign."""
    report = compare_values(_values(noise=1.0, seed=1), _values(noise=1.0, seed=2))
    checks = report["constraints"]
    assert {c["verdict"] for c in checks.values()} == {"inconclusive"}
    assert any(c["margin"] < 0 for c in checks.values())  # a point estimate would have called these broken
    assert report["constraints_satisfied"]
    for check in checks.values():
        low, high = check["interval"]
        assert low < check["margin"] < high
        assert high - low == pytest.approx(2 * 1.96 * check["margin_stderr"], rel=1e-3)


def test_a_clear_shortfall_is_broken_and_a_clear_gain_held():
    behaviour = _values(noise=0.3, seed=1)
    policy = _values(noise=0.3, seed=2, like=0.5, click=1.5)
    checks = compare_values(behaviour, policy)["constraints"]
    assert checks["like"]["verdict"] == "broken" and not checks["like"]["satisfied"]
    assert checks["click"]["verdict"] == "held" and checks["click"]["satisfied"]


def test_values_of_different_users_cannot_be_paired():
    other = _values()
    other = PolicyValues(**{**other.__dict__, "per_user": other.per_user[:10]})
    with pytest.raises(
        ValueError, match=f"paired values should have the same users, but have {USERS} and 10$"
    ):
        compare_values(_values(), other)


def test_constraints_follow_each_signals_direction():
    behaviour = _values(click=2.0, like=2.0, hate=2.0)
    policy = _values(watch_time=0.5, click=2.5, like=1.5, hate=1.0)
    report = compare_values(behaviour, policy)
    checks = report["constraints"]
    assert checks["click"]["bound"] == "at least"
    assert checks["click"]["satisfied"] and checks["click"]["margin"] == pytest.approx(0.5)
    assert not checks["like"]["satisfied"] and checks["like"]["margin"] == pytest.approx(-0.5)
    assert checks["like"]["verdict"] == "broken"
    assert checks["hate"]["bound"] == "at most"
    assert checks["hate"]["satisfied"] and checks["hate"]["margin"] == pytest.approx(
        1.0
    )  # less hate is better
    assert "watch_time" not in checks  # the main signal is maximised, not constrained
    assert set(checks) == set(AUXILIARY_SIGNALS)
    assert not report["constraints_satisfied"]
    assert report["signals"]["watch_time"]["lift"] == pytest.approx(-0.5)
    assert report["signals"]["hate"]["lift"] == pytest.approx(-0.5)
    assert report["signals"]["hate"]["direction"] == "lower"


def test_more_hate_than_the_behaviour_violates_its_constraint():
    report = compare_values(_values(hate=1.0), _values(hate=1.2))
    assert not report["constraints"]["hate"]["satisfied"]
    assert report["constraints"]["hate"]["margin"] == pytest.approx(-0.2)


def test_figures_that_do_not_exist_are_null_so_the_report_is_strict_json():
    behaviour = _values(return_rate=float("nan"))
    behaviour.per_user[:, signals.FEED_SIGNALS.index("share")] = 0.0  # nobody shared
    report = compare_values(behaviour, _values(return_rate=float("nan")))
    assert report["return_rate"] == {"behaviour": None, "policy": None}
    assert report["signals"]["share"]["lift"] is None  # relative to a behaviour value of zero
    json.dumps(report, allow_nan=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param({"policy": ""}, "^policy is required$", id="no-policy"),
        pytest.param({"users": 0}, "users should be at least 1, but is 0", id="users"),
        pytest.param({"days": 0}, "days should be at least 1, but is 0", id="days"),
        pytest.param({"episode_seed": -1}, "episode_seed should be non-negative", id="episode-seed"),
    ],
)
def test_config_rejects_what_cannot_be_simulated(overrides, message):
    with pytest.raises(ValueError, match=message):
        SimEvalConfig(**{"policy": "run", **overrides})
    SimEvalConfig(policy="run", users=1, days=1, seed=0, episode_seed=0)  # the smallest run there is


def test_a_policy_is_found_in_its_own_directory_or_through_a_finished_run(tmp_path):
    policy = tmp_path / "run" / "exported"
    policy.mkdir(parents=True)
    (policy / "policy.json").write_text("{}")
    (tmp_path / "run" / "manifest.json").write_text(json.dumps({"policy": {"path": "exported"}}))
    assert policy_directory(policy) == policy
    assert policy_directory(tmp_path / "run") == policy


def test_an_unfinished_run_or_another_directory_is_refused_with_the_reason(tmp_path):
    (tmp_path / "config.yaml").write_text("algo: bc\n")
    with pytest.raises(PolicyLoadError, match="has not finished"):
        policy_directory(tmp_path)
    with pytest.raises(PolicyLoadError, match="neither a policy directory"):
        policy_directory(tmp_path / "missing")


def test_what_a_policy_broke_names_watch_time_first_then_each_constraint_on_its_wrong_side():
    """What stopped a term's weight: watch time when significantly lower, and each auxiliary signal
    whose interval lies on its wrong side (hate: above); a rise in watch time or an interaction breaks
    nothing."""
    worse = _values(noise=0.01, watch_time=0.9, hate=1.1, follow=1.1, like=0.9)
    assert broken_signals(compare_values(_values(), worse)) == ["watch_time", "like", "hate"]
    better = _values(noise=0.01, watch_time=1.1, hate=1.1, follow=1.1, like=1.1)
    assert broken_signals(compare_values(_values(), better)) == ["hate"]
    assert broken_signals(compare_values(_values(), _values())) == []


def test_the_report_names_each_side_and_pairs_the_users_differences():
    """Each signal's figures: both sides' per-user means with their standard errors, and the paired
    difference's standard error from the per-user differences (ddof 1), not from the two sides'."""
    differences = np.arange(USERS) % 4  # 0, 1, 2, 3, ...: mean 1.5
    behaviour = _values()
    policy = _values()
    policy.per_user[:, 0] += differences
    report = compare_values(behaviour, policy)
    watch = report["signals"]["watch_time"]
    assert watch["behaviour"] == {
        "mean": pytest.approx(1.0),
        "stderr": pytest.approx(SHARED[:, 0].std(ddof=1) / 20),
    }
    assert watch["policy"]["mean"] == pytest.approx(2.5)
    assert watch["difference"] == pytest.approx(1.5)
    assert watch["difference_stderr"] == pytest.approx(differences.std(ddof=1) / np.sqrt(USERS))
    assert report["kind"] == "sim_eval"
    assert report["episodes"] == {"behaviour": 500, "policy": 500}


def test_two_users_are_enough_for_an_interval():
    two = _values()
    two = PolicyValues(**{**two.__dict__, "per_user": two.per_user[:2]})
    assert None not in compare_values(two, two)["signals"]["like"]["interval"]


@pytest.mark.parametrize("users", [1, 0])
def test_too_few_users_for_an_interval_give_no_verdict_and_no_error(users):
    """One user has a difference but no standard error; none has neither: every verdict is inconclusive,
    and the figures that do not exist are null."""
    one = _values()
    one = PolicyValues(**{**one.__dict__, "per_user": one.per_user[:users]})
    report = compare_values(one, one)
    assert {c["verdict"] for c in report["constraints"].values()} == {"inconclusive"}
    assert report["signals"]["like"]["interval"] == [None, None]
    assert report["signals"]["like"]["difference"] == (0.0 if users else None)
    assert report["constraints"]["like"]["margin"] == (0.0 if users else None)


def test_an_evaluation_runs_both_policies_on_the_configured_world_and_says_what_it_ran(tmp_path, monkeypatch):
    """The verb's plumbing, with a stand-in for the exported policy (loading one needs TensorFlow): the
    configured world, users, days and episode draws reach both runs, and the report names them."""
    base = behaviour_feed_policy()
    candidate = SimpleNamespace(
        version="candidate-v1",
        directory=tmp_path,
        manifest={"algo": "tscac", "train_step": 7},
        act=lambda states, rng: base.act(states * 0.5, rng),  # another policy: the state read differently
    )
    loads = []
    monkeypatch.setattr(
        sim_eval, "load_feed_policy", lambda directory, **kw: loads.append((directory, kw)) or candidate
    )
    (tmp_path / POLICY_MANIFEST).write_text("{}")
    events = []
    config = SimEvalConfig(policy=str(tmp_path), users=30, days=2, seed=4, episode_seed=3, sample=True)
    started = time.perf_counter()
    report = sim_eval.evaluate_policy(config, lambda event, fields: events.append((event, fields)))
    took = time.perf_counter() - started

    assert loads == [(tmp_path, {"sample": True, "numpy": True})]
    world = {"seed": 4, "episode_seed": 3, "days": 2}
    allocation = behaviour_allocation_policy()
    direct = compare_values(
        monte_carlo_values(SimConfig(n_users=30), base, allocation, **world),
        monte_carlo_values(SimConfig(n_users=30), candidate, allocation, **world),
    )
    assert report["signals"] == direct["signals"] and report["signals"]["watch_time"]["difference"] != 0.0
    assert report["config"] == dataclasses.asdict(config)
    assert report["policy"] == {
        "directory": str(tmp_path.resolve()),
        "version": "candidate-v1",
        "algo": "tscac",
        "train_step": 7,
    }
    assert report["behaviour"] == {"feed_policy": base.version, "allocation_policy": allocation.version}
    assert [event for event, _ in events] == ["evaluating", "evaluated"] * 2
    assert events[0][1] == {"policy": base.version, "users": 30, "days": 2}
    assert events[3][1]["policy"] == "candidate-v1"
    assert events[3][1]["episodes"] == direct["episodes"]["policy"]
    seconds = events[3][1]["seconds"]  # the run's own time, to the hundredth
    assert isinstance(seconds, float) and 0 <= seconds <= took + 0.01 and seconds == round(seconds, 2)
    json.dumps(report, allow_nan=False)
