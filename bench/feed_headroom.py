"""How much watch time simple reweightings of the behaviour policy's fusion buy, and what they cost.

The ceiling against which the trained policies of ``bench/policy_quality.py`` should be read: the
behaviour policy's mean with its watch-time fusion logit raised (the one lever that raises watch time
in this simulator), evaluated on the same world and episode draws as the behaviour policy itself.

    python bench/feed_headroom.py --full --out bench/results/feed_headroom.json
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
from common import bench_parser, write_result

from recsys_rl import signals
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.sim_eval import compare_values

MODES = {"quick": {"users": 3_000}, "full": {"users": 60_000}}
WATCH_SHIFTS = (0.0, 0.5, 1.0, 2.0)  # added to the watch-time logit of the behaviour policy's mean


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__, "feed_headroom").parse_args(argv)
    users = MODES[args.mode]["users"]
    started = time.perf_counter()
    behaviour = behaviour_feed_policy()

    def values(policy):
        config = SimConfig(n_users=users)
        return monte_carlo_values(config, policy, behaviour_allocation_policy(), seed=args.seed, days=1)

    baseline = values(behaviour)
    watch = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)
    rows = {}
    for shift in WATCH_SHIFTS:
        logits = behaviour.base_logits + shift * np.eye(len(signals.FEED_SIGNALS))[watch]
        # a tiny sigma: the mean policy, drawing the same noise as the behaviour policy (paired runs)
        mean_policy = dataclasses.replace(
            behaviour, base_logits=logits, sigma=np.full_like(behaviour.sigma, 1e-6)
        )
        report = compare_values(baseline, values(mean_policy))
        rows[f"{shift:+.1f}"] = {name: s["lift"] for name, s in report["signals"].items()}
        print(
            f"watch logit {shift:+.1f}: "
            + ", ".join(f"{k} {100 * v:+.1f}%" for k, v in rows[f"{shift:+.1f}"].items())
        )
    write_result(
        args.out,
        {
            "benchmark": "feed_headroom",
            "mode": args.mode,
            "seed": args.seed,
            "config": {"users": users, "watch_shifts": list(WATCH_SHIFTS)},
            "lift_by_watch_shift": rows,
            "wall_s": time.perf_counter() - started,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
