"""Benchmark: how many follows a ranking term can buy in the simulated world with nothing broken (issue 22).

Issue 22 asks the user-author term to lift follows per user over 7 days by +5% over TSCAC alone, with watch
time and every other constraint held by paired intervals. How far any term added to the fusion score can go
is a property of the world, measured here with terms that know more than a ranker does:

- ``follow-boost``: the upstream ranker's predicted follow probability (the user-author benchmark's
  supervised baseline, ``FollowProbabilityTerm``);
- ``follow-oracle``: the world's own expected follow of each candidate (``ExpectedFollowTerm``), which no
  ranker has;
- ``follow-oracle-net-<price>``: the same less a price on the candidate's expected hate. Any term added to
  the score dilutes the fusion's own weight on hate, so a designer who must hold hate prices it back in
  (a Lagrangian term); the prices are a grid, like the weights.

Each term at each weight of a grid is added to the global fusion weighting (the behaviour policy's mean
weights, deterministic: the reference search's global line, which TSCAC's weighting is close to) and run on
one evaluation world with that weighting's episode draws (common random numbers, docs/simulator.md), paired
per user against the weighting alone: per user, each signal's total over the days from expected responses,
with 95% intervals. A weight holds when it broke nothing (``broken_signals``: watch time not significantly
lower, no auxiliary signal's interval on its wrong side); each term's ceiling is its most follows among the
weights that held. The terms are myopic: a follow's later worth (the followed feed, familiarity) is not in
them, which is what a user-author value adds.

    python bench/follow_ceiling.py --full
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
from common import bench_parser, git_commit, write_result
from feed_ceiling import lifts
from trained import evaluation_worlds
from workers import worker_pool

from recsys_rl.sim.behaviour import FeedPolicy, behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import PolicyValues, monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.ranking_terms import ExpectedFollowTerm, FollowProbabilityTerm, TermRanking
from recsys_rl.sim.reference_lines import SegmentedFeedPolicy
from recsys_rl.sim.sim_eval import broken_signals, compare_values

MODES: dict[str, dict[str, Any]] = {
    # CI smoke run: the whole path, too small for any verdict to mean anything
    "quick": {"users": 1_500, "days": 2, "weights": (0.03, 0.3), "hate_prices": (0.5,)},
    "full": {
        "users": 20_000,
        "days": 7,
        # in a typical view's follow probability (fusion's units), the user-author benchmark's boost grid
        # filled in where the terms break
        "weights": (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3),
        "hate_prices": (0.5, 1.0),
    },
}


def terms(hate_prices: tuple[float, ...]) -> dict[str, FollowProbabilityTerm | ExpectedFollowTerm]:
    """The terms the run tries, by name."""
    net = {f"follow-oracle-net-{p:g}": ExpectedFollowTerm(p, f"follow-oracle-net-{p:g}") for p in hate_prices}
    return {"follow-boost": FollowProbabilityTerm(), "follow-oracle": ExpectedFollowTerm(), **net}


def run(policy: FeedPolicy, *, users: int, days: int, world: int) -> PolicyValues:
    """A worker's job: ``policy``'s values per user on ``world``."""
    config = SimConfig(n_users=users)
    return monte_carlo_values(config, policy, behaviour_allocation_policy(), seed=world, days=days)


def ceiling(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row with the most follows among ``rows`` (one term's weights) that broke nothing; None if none
    held."""
    held = [r for r in rows if not r["broken"]]
    return max(held, key=lambda r: r["lifts"]["follow"]["lift"]) if held else None


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "follow_ceiling")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    commit = git_commit()
    world = evaluation_worlds(args.seed, 1)[0]
    behaviour = behaviour_feed_policy()
    base = SegmentedFeedPolicy.global_weighting(behaviour.base_logits, behaviour.state_coef, "global")
    tried = terms(settings["hate_prices"])
    policies = {("none", 0.0): base} | {
        (name, weight): TermRanking(base, term, weight)
        for name, term in tried.items()
        for weight in settings["weights"]
    }
    job = functools.partial(run, users=settings["users"], days=settings["days"], world=world)
    with worker_pool() as workers:
        values = dict(zip(policies, workers.map(job, policies.values()), strict=True))

    reference = values.pop(("none", 0.0))
    rows = []
    for (name, weight), policy_values in values.items():
        report = compare_values(reference, policy_values)
        rows.append(
            {"term": name, "weight": weight, "lifts": lifts(report), "broken": broken_signals(report)}
        )
        follow = rows[-1]["lifts"]["follow"]["lift"]
        verdict = "held" if not rows[-1]["broken"] else "broke " + ", ".join(rows[-1]["broken"])
        print(f"{name} at {weight:g}: follows {100 * follow:+.2f}%, {verdict}", file=sys.stderr)

    ceilings = {name: ceiling([r for r in rows if r["term"] == name]) for name in tried}
    result = {
        "benchmark": "follow_ceiling",
        "commit": commit,
        "mode": args.mode,
        "seed": args.seed,
        "config": {**settings, "world": world, "base": base.version},
        "rows": rows,
        # per term, the most follows any weight brought with nothing broken (None: every weight broke)
        "follow_ceiling": {
            name: None if row is None else {"weight": row["weight"], "lift": row["lifts"]["follow"]["lift"]}
            for name, row in ceilings.items()
        },
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    best = {n: f"{100 * c['lift']:+.2f}%" if c else "none held" for n, c in result["follow_ceiling"].items()}
    print(f"follow ceiling with nothing broken: {best}; {result['wall_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
