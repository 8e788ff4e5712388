"""Benchmark: how much watch time the fusion weighting can buy in the simulated world at all (issue 16).

Issue 16 asks the personalised oracle to beat the best global weighting by +3% of multi-day watch time
with every constraint held. Whether any weighting can is a property of the world, measured here with
the constraints ignored: the behaviour policy's fusion with its watch-time logit raised step by step,
ranking on

- the upstream ranker's predictions, as every policy in this project does; and on
- the expected responses themselves (prediction noise 0): a ranker no production system has, which says
  how much of the limit is the upstream model's error rather than the weighting.

Every row runs on one evaluation world with the behaviour policy's episode draws (common random numbers,
docs/simulator.md), so its lifts are paired per user against the behaviour policy run in the same
process; per user, each signal's total over the days from expected responses (a user kept away a day
adds nothing that day), with 95% intervals.

    python bench/feed_ceiling.py --full
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
from common import bench_parser, git_commit, write_result
from trained import evaluation_worlds

from recsys_rl import signals
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.reference_lines import SegmentedFeedPolicy
from recsys_rl.sim.sim_eval import compare_values

#: The watch-time logit's rise over the behaviour's mean, per row (0: the behaviour's weighting, made
#: deterministic).
MODES: dict[str, dict[str, Any]] = {
    "quick": {"users": 1_500, "days": 2, "watch_steps": (0.0, 1.0)},
    "full": {"users": 20_000, "days": 3, "watch_steps": (0.0, 0.5, 1.0, 2.0, 4.0)},
}
PREDICTIONS = ("upstream", "exact")
_WATCH = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)


def lifts(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each signal's lift over the behaviour policy and its 95% interval, relative to the behaviour's
    per-user mean."""
    out = {}
    for name, s in report["signals"].items():
        base = s["behaviour"]["mean"]
        out[name] = {
            "lift": s["difference"] / base,
            "low": s["interval"][0] / base,
            "high": s["interval"][1] / base,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "feed_ceiling")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    commit = git_commit()
    world = evaluation_worlds(args.seed, 1)[0]
    upstream = SimConfig(n_users=settings["users"])
    exact = dataclasses.replace(
        upstream, response=dataclasses.replace(upstream.response, prediction_noise=0.0)
    )
    behaviour = behaviour_feed_policy()

    def run(config: SimConfig, policy):
        return monte_carlo_values(
            config, policy, behaviour_allocation_policy(), seed=world, days=settings["days"]
        )

    reference = run(upstream, behaviour)
    rows = []
    for predictions, config in zip(PREDICTIONS, (upstream, exact), strict=True):
        for step in settings["watch_steps"]:
            logits = behaviour.base_logits.copy()
            logits[_WATCH] += step
            policy = SegmentedFeedPolicy.global_weighting(logits, behaviour.state_coef, f"watch+{step:g}")
            report = compare_values(reference, run(config, policy))
            rows.append(
                {
                    "predictions": predictions,
                    "watch_logit_step": step,
                    "lifts": lifts(report),
                    "return_rate": report["return_rate"],
                }
            )
            watch = rows[-1]["lifts"][signals.FEED_MAIN_SIGNAL]["lift"]
            print(
                f"{predictions} predictions, watch logit +{step:g}: watch {100 * watch:+.2f}%",
                file=sys.stderr,
            )

    def most_watch(predictions: str) -> dict[str, Any]:
        mine = [r for r in rows if r["predictions"] == predictions]
        return max(mine, key=lambda r: r["lifts"][signals.FEED_MAIN_SIGNAL]["lift"])

    result = {
        "benchmark": "feed_ceiling",
        "commit": commit,
        "mode": args.mode,
        "seed": args.seed,
        "config": {**settings, "world": world},
        "rows": rows,
        # the most watch time any row reached, constraints ignored, on each kind of prediction
        "watch_ceiling": {
            p: {
                "lift": most_watch(p)["lifts"][signals.FEED_MAIN_SIGNAL]["lift"],
                "watch_logit_step": most_watch(p)["watch_logit_step"],
            }
            for p in PREDICTIONS
        },
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    ceiling = result["watch_ceiling"]
    print(
        f"feed ceiling: most watch time {100 * ceiling['upstream']['lift']:+.2f}% on upstream predictions, "
        f"{100 * ceiling['exact']['lift']:+.2f}% on exact ones; {result['wall_s']:.0f} s; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
