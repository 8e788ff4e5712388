"""The gate's error rates on simulator logs, where the truth is known: how often it blesses a bad candidate.

Candidates are the behaviour policy with its watch-time fusion logit moved (same exploration noise, so
the logs support them). The simulator's ground truth says what each candidate really does per feed
request; the gate, run on many independent small logs, must bless a truly worse candidate, or one that
truly breaks a constraint, in at most 5% of them. Its power on a truly better candidate is measured and
reported.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.ope.evaluate import gate_verdict
from recsys_rl.ope.gate import GateConfig
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import evaluate_lift
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

pytestmark = pytest.mark.integration

REPETITIONS = 40  # independent logs per bad candidate
LOG_USERS = 1500  # about 9,000 feed decisions per log
POWER_REPETITIONS, POWER_LOG_USERS = 10, 8000  # about 48,000 decisions: power needs data
GATE = GateConfig(
    estimator="snips",
    interval="percentile",
    resamples=100,
    min_main_lift=0.0,
    default_tolerance=0.10,
    # signals seen a few dozen times per log cannot be held to a few percent: wider tolerances
    tolerances={"follow": 0.3, "share": 0.3, "hate": 0.5},
    min_ess=100,
    max_weight_share=0.05,
)
BEHAVIOUR = behaviour_feed_policy()
WATCH = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)


def _candidate(watch_shift: float):
    shift = watch_shift * np.eye(len(signals.FEED_SIGNALS))[WATCH]
    return dataclasses.replace(
        BEHAVIOUR, base_logits=BEHAVIOUR.base_logits + shift, version=f"watch{watch_shift:+}"
    )


def _true_relative_lift(candidate) -> dict[str, float]:
    """Per-request ground truth on a large world, relative to the behaviour policy."""
    config = SimConfig(n_users=40_000)

    def per_request(policy) -> dict[str, float]:
        return monte_carlo_values(config, policy, behaviour_allocation_policy(), seed=0, days=1).per_request

    base, new = per_request(BEHAVIOUR), per_request(candidate)
    return {s: (new[s] - base[s]) / abs(base[s]) for s in signals.FEED_SIGNALS}


def _truly_acceptable(lift: dict[str, float]) -> bool:
    constraints_hold = all(
        -signals.get(s).direction.sign * lift[s] <= GATE.tolerance(s) for s in GATE.constraint_signals
    )
    return lift[signals.FEED_MAIN_SIGNAL] > GATE.min_main_lift and constraints_hold


def _bless_rate(
    candidate, repetitions: int = REPETITIONS, users: int = LOG_USERS, gate: GateConfig = GATE
) -> float:
    passed = 0
    for repetition in range(repetitions):
        day = Simulator(SimConfig(n_users=users), seed=0, episode_seed=100 + repetition).run_day(
            BEHAVIOUR, behaviour_allocation_policy()
        )
        logged = LoggedSteps.from_day_logs([day])
        lift = evaluate_lift(
            logged,
            candidate,
            estimators=(GATE.estimator,),
            interval=GATE.interval,
            resamples=GATE.resamples,
            alpha=GATE.alpha,
            seed=repetition,
            groups=False,
        )
        passed += gate_verdict(gate, lift).passed
    return passed / repetitions


@pytest.mark.parametrize(
    ("watch_shift", "why_bad"),
    [(-0.5, "truly worse on watch time"), (2.0, "truly breaks the auxiliary constraints")],
)
def test_the_gate_rarely_blesses_a_truly_bad_candidate(watch_shift: float, why_bad: str):
    candidate = _candidate(watch_shift)
    truth = _true_relative_lift(candidate)
    assert not _truly_acceptable(truth), f"scenario is not {why_bad}: {truth}"
    rate = _bless_rate(candidate)
    assert rate <= 0.05, f"false promotion rate {rate:.1%} over {REPETITIONS} logs for a candidate {why_bad}"


def test_the_gates_power_on_a_truly_better_candidate(record_property: pytest.RecordProperty):
    """Measured, not assumed: every constraint bound must clear its tolerance at once, and the sparse
    signals' intervals are wide on logs of this size, so the full gate's power is low. The same logs
    give a gate that only asks for a main-signal lift high power: the evidence on watch time is there."""
    candidate = _candidate(0.4)
    truth = _true_relative_lift(candidate)
    assert _truly_acceptable(truth), f"scenario is not truly better within tolerances: {truth}"
    main_only = dataclasses.replace(GATE, default_tolerance=10.0, tolerances={})
    power = _bless_rate(candidate, POWER_REPETITIONS, POWER_LOG_USERS)
    main_only_power = _bless_rate(candidate, POWER_REPETITIONS, POWER_LOG_USERS, main_only)
    record_property("gate_power", power)
    record_property("main_signal_only_power", main_only_power)
    print(
        f"gate power on a truly better candidate ({truth['watch_time']:+.1%} watch time, "
        f"{POWER_REPETITIONS} logs of {POWER_LOG_USERS} users): {power:.0%}; main-signal rule alone: "
        f"{main_only_power:.0%}"
    )
    assert main_only_power >= 0.8, f"the main-signal rule alone blessed only {main_only_power:.0%}"
