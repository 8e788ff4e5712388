"""Benchmark: every feed algorithm trained on the same simulated logs, judged by the simulator itself.

Logs of the behaviour policy go the production way (simulator -> embedded Kafka -> the Beam pipeline)
into one dataset; each algorithm trains on it with every seed, and each trained policy (its mean) and
the behaviour policy then run on one larger world of the same simulator with the same episode draws,
which gives each signal's ground-truth value with a small standard error. The baseline is the
behaviour policy, measured in the same run.

Targets (issue 4): TSCAC at least +5% watch time over the behaviour policy with every auxiliary
signal at least at the behaviour's level (hate at most); TSCAC ahead of RCPO on the auxiliaries and
ahead of the watch-time-only actor-critic on constraint satisfaction.

    python bench/policy_quality.py --full --docs docs/policy_quality.md
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
from common import bench_parser, git_commit, write_result

from recsys_rl import signals
from recsys_rl.kafka import open_broker
from recsys_rl.pipelines.simulated import simulated_dataset
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.sim_eval import AUXILIARY_SIGNALS, compare_values
from recsys_rl.training.agents.algorithms import ALGORITHMS
from recsys_rl.training.agents.policy_io import load_feed_policy
from recsys_rl.training.train import TrainConfig, train

TARGET_WATCH_LIFT = 0.05
MODES = {
    "quick": {"users": 400, "days": 1, "steps": 100, "seeds": (0,), "eval_users": 3_000},
    "full": {"users": 5_000, "days": 2, "steps": 3_000, "seeds": (0, 1, 2), "eval_users": 60_000},
}


def evaluate(policy_dirs: dict[str, list[Path]], eval_users: int, world_seed: int) -> dict[str, Any]:
    """Per algorithm and seed, the simulator's comparison with the behaviour policy (one behaviour run)."""

    def values(feed_policy):
        return monte_carlo_values(
            SimConfig(n_users=eval_users), feed_policy, behaviour_allocation_policy(), seed=world_seed, days=1
        )

    behaviour = values(behaviour_feed_policy())
    return {
        algo: [compare_values(behaviour, values(load_feed_policy(d))) for d in dirs]
        for algo, dirs in policy_dirs.items()
    }


def summarise(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread over seeds of each signal's value and lift, and the share of constraints met."""

    def spread(values: list[float]) -> dict[str, float]:
        return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}

    per_signal = {
        name: {
            "value": spread([r["signals"][name]["policy"]["mean"] for r in reports]),
            "behaviour": reports[0]["signals"][name]["behaviour"]["mean"],
            "lift": spread([r["signals"][name]["lift"] for r in reports]),
        }
        for name in signals.FEED_SIGNALS
    }
    met = [c["satisfied"] for r in reports for c in r["constraints"].values()]
    return {"signals": per_signal, "constraints_met_share": sum(met) / len(met), "seeds": len(reports)}


def verdicts(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tscac = table["tscac"]
    watch_lift = tscac["signals"][signals.FEED_MAIN_SIGNAL]["lift"]["mean"]

    def aux_margin(algo: str, name: str) -> float:
        """TSCAC's mean lift on ``name`` minus ``algo``'s, signed so that positive is better."""
        sign = signals.get(name).direction.sign
        return sign * (tscac["signals"][name]["lift"]["mean"] - table[algo]["signals"][name]["lift"]["mean"])

    return {
        "tscac_watch_lift": watch_lift,
        "tscac_watch_lift_met": watch_lift >= TARGET_WATCH_LIFT,
        "tscac_constraints_met_share": tscac["constraints_met_share"],
        "tscac_all_constraints_met": tscac["constraints_met_share"] == 1.0,
        "tscac_ahead_of_rcpo_on": [n for n in AUXILIARY_SIGNALS if aux_margin("rcpo", n) > 0],
        "tscac_ahead_of_rcpo_on_auxiliaries": sum(aux_margin("rcpo", n) > 0 for n in AUXILIARY_SIGNALS)
        > len(AUXILIARY_SIGNALS) / 2,
        "tscac_ahead_of_ac_main_on_constraints": tscac["constraints_met_share"]
        > table["ac-main"]["constraints_met_share"],
    }


def markdown(table: dict[str, dict[str, Any]], result: dict[str, Any]) -> str:
    """The docs' table: lift over the behaviour policy per signal, mean ± std over seeds."""
    config = result["config"]
    lines = [
        "# Policy quality in the simulator",
        "",
        f"Written by `python bench/policy_quality.py --{result['mode']}` at commit `{result['commit']}`.",
        f"Logs: {config['users']} users x {config['days']} day(s) of the behaviour policy "
        f"({config['transitions']} feed transitions); {config['steps']} training steps per run; seeds "
        f"{list(config['seeds'])}; each policy's mean action and the behaviour policy evaluated on a "
        f"{config['eval_users']}-user world of the same simulator with the same episode draws.",
        "",
        "Relative lift over the behaviour policy, mean ± std over seeds (hate: lower is better). "
        "'constraints met' is the share of (auxiliary signal, seed) pairs whose paired 95% interval does "
        "not put the policy below the behaviour's level (recsys_rl.sim.sim_eval: held or inconclusive).",
        "",
        "| algorithm | " + " | ".join(signals.FEED_SIGNALS) + " | constraints met |",
        "|---|" + "---|" * (len(signals.FEED_SIGNALS) + 1),
    ]
    for algo, row in table.items():
        cells = [
            f"{100 * row['signals'][s]['lift']['mean']:+.1f}% ± {100 * row['signals'][s]['lift']['std']:.1f}"
            for s in signals.FEED_SIGNALS
        ]
        lines.append(f"| {algo} | " + " | ".join(cells) + f" | {100 * row['constraints_met_share']:.0f}% |")
    behaviour = next(iter(table.values()))["signals"]
    lines += [
        "",
        "Behaviour policy values per session: "
        + ", ".join(f"{s} {behaviour[s]['behaviour']:.4g}" for s in signals.FEED_SIGNALS)
        + ".",
        "",
        "Verdicts: " + ", ".join(f"`{k}`: {v}" for k, v in result["verdicts"].items()) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "policy_quality")
    parser.add_argument("--docs", help="also write the table as Markdown to this file")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    commit = git_commit()  # the code this run imported, not whatever is checked out when it ends
    with tempfile.TemporaryDirectory() as work, open_broker(None, "embedded") as broker:
        built = simulated_dataset(
            broker.bootstrap_servers,
            f"{work}/data",
            users=settings["users"],
            days=settings["days"],
            seed=args.seed,
        )
        policy_dirs: dict[str, list[Path]] = {algo: [] for algo in ALGORITHMS}
        train_seconds: dict[str, list[float]] = {algo: [] for algo in ALGORITHMS}
        for seed in settings["seeds"]:
            for algo in ALGORITHMS:
                run = Path(work) / f"{algo}-s{seed}"
                t0 = time.perf_counter()
                train(
                    TrainConfig(
                        algo=algo,
                        data=str(built.dataset_dir),
                        out=str(run),
                        steps=settings["steps"],
                        seed=seed,
                    )
                )
                train_seconds[algo].append(time.perf_counter() - t0)
                policy_dirs[algo].append(run / "policy")
                print(f"trained {algo} seed {seed} in {train_seconds[algo][-1]:.0f} s", file=sys.stderr)
        reports = evaluate(policy_dirs, settings["eval_users"], args.seed)
    table = {algo: summarise(reports[algo]) for algo in ALGORITHMS}
    result = {
        "benchmark": "policy_quality",
        "commit": commit,
        "mode": args.mode,
        "seed": args.seed,
        "config": {
            **{k: v for k, v in settings.items() if k != "seeds"},
            "seeds": list(settings["seeds"]),
            "transitions": built.manifest["surfaces"]["feed"]["rows"],
            "dataset_version": built.manifest["version"],
        },
        "table": table,
        "runs": reports,
        "train_seconds": train_seconds,
        "wall_s": time.perf_counter() - started,
    }
    result["verdicts"] = verdicts(table)
    result["meets_targets"] = all(
        result["verdicts"][k]
        for k in (
            "tscac_watch_lift_met",
            "tscac_all_constraints_met",
            "tscac_ahead_of_rcpo_on_auxiliaries",
            "tscac_ahead_of_ac_main_on_constraints",
        )
    )
    write_result(args.out, result)
    if args.docs:
        Path(args.docs).parent.mkdir(parents=True, exist_ok=True)
        Path(args.docs).write_text(markdown(table, result))
    watch = table["tscac"]["signals"][signals.FEED_MAIN_SIGNAL]["lift"]
    met_share = table["tscac"]["constraints_met_share"]
    print(
        f"policy quality: tscac watch time {100 * watch['mean']:+.1f}% ± {100 * watch['std']:.1f} over "
        f"{len(settings['seeds'])} seed(s); constraints met {100 * met_share:.0f}%; "
        f"targets {'met' if result['meets_targets'] else 'NOT met'}; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
