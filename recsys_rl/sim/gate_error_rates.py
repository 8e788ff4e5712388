"""The rollout gate's error rates on simulated logs, where the truth is known.

A gate is only as good as how often it blesses a candidate it should not (false promotion) and how often
it blesses one it should (power). Both are measured here, not assumed: candidates are the behaviour
policy with its watch-time fusion logit moved (the same exploration noise, so the logs support them), the
simulator's expected responses on a large world say what each candidate really does per feed request,
and the gate runs on many independent small logs of the behaviour policy. The integration test holds the
false-promotion rate to at most 5%; ``bench/ope.py`` reports both rates with more logs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from recsys_rl import signals
from recsys_rl.ope.evaluate import gate_verdict
from recsys_rl.ope.gate import GateConfig
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import evaluate_lift
from recsys_rl.sim.behaviour import (
    FeedPolicy,
    GaussianFeedPolicy,
    behaviour_allocation_policy,
    behaviour_feed_policy,
)
from recsys_rl.sim.ground_truth import monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

#: Users of the world whose expected responses are the truth (standard error of a lift ~0.1%).
TRUTH_USERS = 40_000
#: The gate whose rates are measured: production rules, with tolerances that signals seen a few dozen
#: times per log can meet (follow, share and hate cannot be held to a few percent on one day of 1,500 users).
REFERENCE_GATE = GateConfig(
    estimator="snips",
    interval="percentile",
    resamples=100,
    min_main_lift=0.0,
    default_tolerance=0.10,
    tolerances={"follow": 0.3, "share": 0.3, "hate": 0.5},
    min_ess=100,
    max_weight_share=0.05,
)
#: Watch-logit shifts: truly worse on watch time; truly breaking the auxiliary constraints; truly better.
WORSE_SHIFT, CONSTRAINT_BREAKING_SHIFT, BETTER_SHIFT = -0.5, 2.0, 0.4


def shifted_candidate(watch_shift: float) -> GaussianFeedPolicy:
    """The behaviour policy with its watch-time fusion logit moved by ``watch_shift``."""
    behaviour = behaviour_feed_policy()
    watch = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)
    shift = watch_shift * np.eye(len(signals.FEED_SIGNALS))[watch]
    return dataclasses.replace(
        behaviour, base_logits=behaviour.base_logits + shift, version=f"watch{watch_shift:+}"
    )


def true_relative_lift(candidate: FeedPolicy, users: int = TRUTH_USERS) -> dict[str, float]:
    """Per-request expected responses of ``candidate`` relative to the behaviour policy's, per signal."""
    config = SimConfig(n_users=users)

    def per_request(policy: FeedPolicy) -> dict[str, float]:
        return monte_carlo_values(config, policy, behaviour_allocation_policy(), seed=0, days=1).per_request

    base, new = per_request(behaviour_feed_policy()), per_request(candidate)
    return {s: (new[s] - base[s]) / abs(base[s]) for s in signals.FEED_SIGNALS}


def truly_acceptable(gate: GateConfig, lift: dict[str, float]) -> bool:
    """Whether a candidate with this true lift meets the gate's rules with no sampling error at all."""
    constraints_hold = all(
        -signals.get(s).direction.sign * lift[s] <= gate.tolerance(s) for s in gate.constraint_signals
    )
    return lift[signals.FEED_MAIN_SIGNAL] > gate.min_main_lift and constraints_hold


def log_lift(gate: GateConfig, candidate: FeedPolicy, users: int, index: int) -> dict[str, Any]:
    """The lift ``gate`` judges ``candidate`` on, from log ``index``: a one-day behaviour log of ``users``
    users, episode seed 100 + index of world 0, with ``index`` also the bootstrap's seed."""
    day = Simulator(SimConfig(n_users=users), seed=0, episode_seed=100 + index).run_day(
        behaviour_feed_policy(), behaviour_allocation_policy()
    )
    return evaluate_lift(
        LoggedSteps.from_day_logs([day]),
        candidate,
        estimators=(gate.estimator,),
        interval=gate.interval,
        resamples=gate.resamples,
        alpha=gate.alpha,
        seed=index,
        groups=False,
    )


def bless_rate(gate: GateConfig, candidate: FeedPolicy, logs: int, users: int, first_log: int = 0) -> float:
    """Share of ``logs`` independent logs (`log_lift`'s first_log, first_log + 1, ...) of ``users`` users
    on which ``gate`` blesses ``candidate``."""
    passed = 0
    for index in range(first_log, first_log + logs):
        passed += gate_verdict(gate, log_lift(gate, candidate, users, index)).passed
    return passed / logs


@dataclass(frozen=True)
class ErrorRates:
    """What ``measure`` found; ``false_promotion_rate`` is the worse of the two bad candidates'."""

    false_promotion_rate: float
    power: float
    bless_rates: dict[str, float]  # per scenario
    true_lifts: dict[str, dict[str, float]]  # per scenario, per signal
    logs: int
    log_users: int
    power_logs: int
    power_log_users: int


def measure(
    gate: GateConfig,
    *,
    logs: int,
    log_users: int,
    power_logs: int,
    power_log_users: int,
    truth_users: int = TRUTH_USERS,
) -> ErrorRates:
    """Bless rates of the worse, the constraint-breaking and the better candidate under ``gate``.

    Raises ValueError when the scenarios are not what they claim under this gate's own rules (a "bad"
    candidate that is truly acceptable, or a "better" one that is not): a rate would then mean nothing.
    """
    scenarios = {
        "worse": WORSE_SHIFT,
        "breaks_constraints": CONSTRAINT_BREAKING_SHIFT,
        "better": BETTER_SHIFT,
    }
    truths = {
        name: true_relative_lift(shifted_candidate(shift), truth_users) for name, shift in scenarios.items()
    }
    for name, lift in truths.items():
        if truly_acceptable(gate, lift) != (name == "better"):
            raise ValueError(f"scenario {name!r} is not what it claims under this gate: true lifts {lift}")
    rates = {
        name: (
            bless_rate(gate, shifted_candidate(shift), power_logs, power_log_users)
            if name == "better"
            else bless_rate(gate, shifted_candidate(shift), logs, log_users)
        )
        for name, shift in scenarios.items()
    }
    return ErrorRates(
        false_promotion_rate=max(rates["worse"], rates["breaks_constraints"]),
        power=rates["better"],
        bless_rates=rates,
        true_lifts=truths,
        logs=logs,
        log_users=log_users,
        power_logs=power_logs,
        power_log_users=power_log_users,
    )
