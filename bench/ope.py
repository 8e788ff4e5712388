"""Benchmark: offline policy evaluation of one million logged feed decisions (target: at most 30 s), and
the rollout gate's error rates.

The logs are the simulator's: days of the behaviour policy on one world (full: 30,000 users, about
seven days) until a million feed decisions, cut at a session boundary. The target is the behaviour
policy with shifted fusion logits. One timed run is what the rollout gate asks for: the cross-fitted
reward model, all eight single-decision estimators for all seven signals, overall and per user group,
the behaviour's own value, 200 user-bootstrap resamples with BCa intervals, concentration bounds and
the weight diagnostics (``evaluate_policy_offline``). ``seconds_1m_steps`` scales the median run to
exactly 1,000,000 decisions (the work is linear in rows).

Also timed: the reward model alone, reading the same rows back from Parquet (``LoggedSteps.from_parquet``,
the pipeline's schema), and two baselines in the same process so that ratios survive noisy machines: a
plain numpy mean of the reward matrix repeated once per resample, and a single IPS estimate without
intervals.

Gate error rates (``recsys_rl.sim.gate_error_rates``, the reference gate of its integration test): the
share of independent one-day logs on which the gate blesses a truly worse candidate or one that truly
breaks the constraints (``false_promotion_rate``, the worse of the two; target at most 5%), and on which
it blesses a truly better one (``power``), each with a 95% Wilson interval.

    python bench/ope.py --quick --out bench/results/ope.json
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from common import bench_parser, repeat_rate, write_result

from recsys_rl.ope import estimators as single
from recsys_rl.ope.logged import LoggedSteps, target_log_prob
from recsys_rl.ope.offline_evaluation import SINGLE_DECISION, OPESettings, evaluate_policy_offline
from recsys_rl.ope.reward_model import fit_reward_model
from recsys_rl.pipelines.transition_io import feed_steps_table
from recsys_rl.sim import gate_error_rates
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import Simulator

TARGET_SECONDS_1M = 30.0
TARGET_FALSE_PROMOTION = 0.05
RESAMPLES = 200
MODES = {
    "quick": {"users": 2_000, "rows": 20_000, "repeats": 2},
    "full": {"users": 30_000, "rows": 1_000_000, "repeats": 3},
}
#: Logs per bad candidate and their users; logs and users for the power on the better one; truth's world.
ERROR_RATE_SIZES = {
    "quick": {
        "logs": 4,
        "log_users": 1_500,
        "power_logs": 2,
        "power_log_users": 8_000,
        "truth_users": 40_000,
    },
    "full": {
        "logs": 100,
        "log_users": 1_500,
        "power_logs": 20,
        "power_log_users": 8_000,
        "truth_users": 40_000,
    },
}


def simulated_logs(users: int, rows: int, seed: int) -> tuple[LoggedSteps, int]:
    """Whole simulated days until ``rows`` decisions, then the sessions that fit within ``rows``."""
    feed, live = behaviour_feed_policy(), behaviour_allocation_policy()
    sim = Simulator(SimConfig(n_users=users), seed)
    days: list[LoggedSteps] = []
    while sum(d.rows for d in days) < rows:
        days.append(LoggedSteps.from_day_logs([sim.run_day(feed, live)]))
    logged = LoggedSteps.concatenate(days)
    ends = np.r_[logged.session_starts[1:], logged.rows]
    keep = int(ends[ends <= rows][-1])
    prefix = {
        f.name: getattr(logged, f.name)[:keep] for f in dataclasses.fields(LoggedSteps) if f.name != "signals"
    }
    return LoggedSteps(**prefix, signals=logged.signals), len(days)


def wilson_interval(rate: float, trials: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a binomial rate: honest at 0 of n, where a normal interval collapses."""
    centre = (rate + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * np.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return [float(max(0.0, centre - half)), float(min(1.0, centre + half))]


def write_parquet(logged: LoggedSteps, path: Path) -> None:
    """The rows as one shard in the pipeline's Parquet schema."""
    pq.write_table(feed_steps_table(logged, request_id=[""] * logged.rows), path)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "ope")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    logged, days = simulated_logs(settings["users"], settings["rows"], args.seed)
    generated_s = time.perf_counter() - started
    behaviour = behaviour_feed_policy()
    shift = np.array([0.1, -0.1, 0.0, 0.05, 0.0, 0.0, 0.1])
    target = dataclasses.replace(behaviour, base_logits=behaviour.base_logits + shift, version="shifted")
    ope = OPESettings()
    n, repeats = logged.rows, settings["repeats"]
    last: dict = {}

    def evaluate() -> int:
        last["result"] = evaluate_policy_offline(
            logged, target, estimators=SINGLE_DECISION, interval="bca", resamples=RESAMPLES, seed=args.seed
        )
        return n

    def reward_model() -> int:
        fit_reward_model(
            logged, target, folds=ope.folds, ridge=ope.ridge, samples=ope.samples, seed=args.seed
        )
        return n

    def single_ips() -> int:
        log_ratio = single.log_importance_ratio(
            target_log_prob(target, logged.states, logged.actions), logged.behaviour_log_prob
        )
        single.ips(logged.rewards, single.importance_weights(log_ratio)).value()
        return n

    def mean_per_resample() -> int:
        for _ in range(RESAMPLES):
            logged.rewards.mean(axis=0)
        return n

    evaluated = repeat_rate(evaluate, repeats)
    fitted = repeat_rate(reward_model, repeats)
    ips_rate = repeat_rate(single_ips, repeats)
    mean_rate = repeat_rate(mean_per_resample, repeats)
    with tempfile.TemporaryDirectory() as out:
        shard = Path(out) / "transitions-feed-00000-of-00001.parquet"
        write_parquet(logged, shard)
        read = repeat_rate(lambda: LoggedSteps.from_parquet([shard], logged.signals).rows, repeats)

    def seconds_1m(rate: dict) -> float:
        return 1_000_000 / rate["value"]

    seconds = seconds_1m(evaluated)
    diagnostics = last["result"]["diagnostics"]["decision"]
    gate_started = time.perf_counter()
    rates = gate_error_rates.measure(gate_error_rates.REFERENCE_GATE, **ERROR_RATE_SIZES[args.mode])
    gate_s = time.perf_counter() - gate_started
    result = {
        "benchmark": "ope",
        "mode": args.mode,
        "seed": args.seed,
        "config": {
            "data": "simulator: behaviour-policy days on one world, cut at a session boundary",
            "users": settings["users"],
            "days": days,
            "rows": n,
            "sessions": logged.sessions,
            "signals": list(logged.signals),
            "estimators": list(SINGLE_DECISION),
            "interval": "bca",
            "resamples": RESAMPLES,
            "repeats": repeats,
            "ope_settings": ope.to_dict(),
            "target_logit_shift": shift.tolist(),
            "target_ess_fraction": diagnostics["ess_fraction"],
            "generate_s": generated_s,
        },
        "seconds_1m_steps": seconds,  # the headline figure: median evaluation, scaled to 1M decisions
        "metrics": {
            "evaluate_steps_per_s": evaluated,
            "reward_model_steps_per_s": fitted,
            "read_parquet_steps_per_s": read,
            "baseline_single_ips_steps_per_s": ips_rate,
            "baseline_mean_x_resamples_steps_per_s": mean_rate,
            "reward_model_seconds_1m_steps": seconds_1m(fitted),
            "read_parquet_seconds_1m_steps": seconds_1m(read),
            "ratio_to_single_ips": ips_rate["value"] / evaluated["value"],
            "ratio_to_mean_x_resamples": mean_rate["value"] / evaluated["value"],
        },
        "false_promotion_rate": rates.false_promotion_rate,
        "power": rates.power,
        "gate_error_rates": {
            "gate": dataclasses.asdict(gate_error_rates.REFERENCE_GATE),
            "bless_rates": {
                name: {
                    "rate": rate,
                    "interval_95": wilson_interval(
                        rate, rates.power_logs if name == "better" else rates.logs
                    ),
                }
                for name, rate in rates.bless_rates.items()
            },
            "true_relative_lifts": rates.true_lifts,
            "logs": rates.logs,
            "log_users": rates.log_users,
            "power_logs": rates.power_logs,
            "power_log_users": rates.power_log_users,
            "seconds": gate_s,
        },
        # one shared 2-core machine: only the upper bound on time is a goal
        "targets": {
            "seconds_1m_steps": {"min": None, "max": TARGET_SECONDS_1M},
            "false_promotion_rate": {"min": None, "max": TARGET_FALSE_PROMOTION},
        },
        "meets_targets": seconds <= TARGET_SECONDS_1M
        and rates.false_promotion_rate <= TARGET_FALSE_PROMOTION,
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    verdict = "met" if result["meets_targets"] else "NOT met"
    metrics = result["metrics"]
    print(
        f"ope: {seconds:.1f} s per 1M logged steps ({n:,} rows, {RESAMPLES} BCa resamples, "
        f"{len(SINGLE_DECISION)} estimators x {len(logged.signals)} signals; reward model "
        f"{metrics['reward_model_seconds_1m_steps']:.1f} s, "
        f"Parquet read {metrics['read_parquet_seconds_1m_steps']:.1f} s); "
        f"{metrics['ratio_to_mean_x_resamples']:.1f}x a numpy mean per resample, "
        f"{metrics['ratio_to_single_ips']:.1f}x one IPS; gate: false promotion "
        f"{rates.false_promotion_rate:.1%} over {rates.logs} logs per bad candidate, power {rates.power:.0%} "
        f"over {rates.power_logs}; targets <= {TARGET_SECONDS_1M:.0f} s and <= {TARGET_FALSE_PROMOTION:.0%} "
        f"-> {verdict}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
