"""A complete OPE report built the way ``recsys-rl evaluate`` builds one, on a small simulated day.

The report tests (the page's sections, and the page loaded in a browser) need every section filled with
real figures, without the Kafka-built dataset and trained policy of the integration test of the command:
the logs come straight from the simulator, the candidate is the behaviour policy with shifted fusion
logits, and the simulated world is known, so the ground truth is real too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from recsys_rl.ope import simulated_truth
from recsys_rl.ope.estimators import log_importance_ratio
from recsys_rl.ope.evaluate import action_distributions, gate_verdict, weight_histogram
from recsys_rl.ope.gate import GateConfig
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.ope.offline_evaluation import OPESettings, evaluate_lift
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

USERS, WORLD = 150, 4
FEED, LIVE = behaviour_feed_policy(), behaviour_allocation_policy()
TARGET = dataclasses.replace(
    FEED, base_logits=FEED.base_logits + np.array([0.1, -0.1, 0, 0, 0, 0, 0.05]), version="shifted-v1"
)
SHA = "ab" * 32


def simulated_logs() -> LoggedSteps:
    return LoggedSteps.from_day_logs([Simulator(SimConfig(n_users=USERS), WORLD).run_day(FEED, LIVE)])


def build_report(logged: LoggedSteps, gate: GateConfig | None = None, truth: bool = True) -> dict[str, Any]:
    """``recsys_rl.ope.evaluate``'s report.json of TARGET against the behaviour policy on ``logged``."""
    gate = gate or GateConfig(resamples=40, interval="percentile", min_ess=100.0)
    lift = evaluate_lift(
        logged,
        TARGET,
        interval=gate.interval,
        resamples=gate.resamples,
        alpha=gate.alpha,
        seed=0,
        settings=OPESettings(fqe_iterations=5, folds=3, thresholds=gate.diagnostic_thresholds()),
    )
    ground_truth = None
    if truth:
        world = simulated_truth.SimulatorWorld(users=USERS, seed=WORLD, repeats=2)
        behaviour = simulated_truth.simulate_truth(world, "feed", FEED, LIVE)
        candidate = simulated_truth.simulate_truth(world, "feed", TARGET, LIVE)
        check = simulated_truth.world_check(logged, behaviour)
        ground_truth = simulated_truth.ground_truth(world, logged.signals, candidate, behaviour, check)
    log_ratio = log_importance_ratio(
        TARGET.log_prob(logged.states, logged.actions), logged.behaviour_log_prob
    )
    return {
        "schema_version": 1,
        "kind": "ope_report",
        "created_at": "2026-01-02T03:04:05Z",
        "inputs": {
            "candidate": {"version": TARGET.version, "policy_sha256": SHA, "path": "/runs/shifted/policy"},
            "baseline": "behaviour",
            "incumbent": None,
            "dataset": {"path": "/data/simulated", "version": "transitions-simulated", "sha256": SHA},
        },
        "gate": dataclasses.asdict(gate),
        "verdict": gate_verdict(gate, lift).to_dict(),
        "lift": lift,
        "importance_weights": weight_histogram(log_ratio),
        "actions": action_distributions(logged, {"candidate": TARGET}, "feed", seed=0),
        "ground_truth": ground_truth,
    }
