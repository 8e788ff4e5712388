"""Benchmark: how much multi-day watch time looking ahead is worth to a fusion weighting in the simulated
world (issue 16).

Issue 16 asks TSCAC with its discounts to beat its myopic control (every discount 0) on the multi-day
objective. The myopic control values an action by the page it serves; TSCAC also by what the page does to
the rest of the session and to the days after (the patience budget, fatigue, the return model, follows,
interest drift: docs/simulator.md). What that is worth is a property of the world, measured here on ground
truth for global fusion weightings, the policies the reference lines search over:

- the reference search's candidates (its first round, the same draws, then local rounds around each
  objective's pick) run on the selection world, each valued two ways: **per request** (the mean expected
  response of a served page, what a myopic critic estimates) and **per user over the days** (the multi-day
  objective, in which a user kept away a day counts as nothing that day);
- under each objective, the candidate with the most watch time holding every auxiliary signal at the
  behaviour's level (point values, as the reference search chooses), and the one with the most watch time
  with the constraints ignored;
- under each objective, the best **mixture** of the candidates under the constraints (each user served
  one candidate throughout, drawn with the mixture's probabilities), a linear program: a few candidates
  hold exactly, so the best single one says little about where the constrained optimum lies, while the
  mixtures fill in the frontier between them. Per request, a mixture's value is a ratio (its pages' total
  over its requests), made linear by the Charnes-Cooper change of variables;
- those picks run on an evaluation world with the behaviour policy's episode draws, paired per user (a
  mixture valued by its expectation over which candidate serves each user, bench/mixtures.py): what the
  far-sighted pick gains over the myopic one in multi-day watch time (95% interval), and what each broke
  against the behaviour.

When both objectives pick the same weighting, looking ahead is worth nothing to a weighting in this world;
the gap between the picks bounds what TSCAC's discounts can add over its myopic control through the
weighting it sets (a state-dependent policy could add more only by personalising, which the reference
lines find worth nothing here).

    python bench/lookahead_ceiling.py --full
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any

import numpy as np

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
from common import bench_parser, git_commit, write_result
from feed_ceiling import lifts
from follow_ceiling import run
from mixtures import Mixture, best_mixture, combined, components, mixture_watch_lift
from trained import evaluation_worlds
from workers import worker_pool

from recsys_rl import signals
from recsys_rl.sim.behaviour import FeedPolicy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import PolicyValues
from recsys_rl.sim.reference_lines import (
    SearchConfig,
    SegmentedFeedPolicy,
    first_round_candidates,
    holds,
    local_candidates,
    most_watch_holding,
)
from recsys_rl.sim.sim_eval import broken_signals, compare_values, paired_per_user

MODES: dict[str, dict[str, Any]] = {
    # CI smoke run: the whole path, too small for any verdict to mean anything
    "quick": {
        "users": 1_500,
        "days": 2,
        "search": {"random_candidates": 3, "local_candidates": 2, "local_scales": (0.35,)},
    },
    # the reference search's grid (SearchConfig) on twice its users, over the quality benchmark's 3 days
    "full": {"users": 20_000, "days": 3, "search": {}},
}
OBJECTIVES = ("multi_day", "per_request")
_WATCH = signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)


def objective_values(values: PolicyValues) -> dict[str, np.ndarray]:
    """A run's value of each feed signal (K,) under each objective: the mean per user over the days, and
    the mean per served request."""
    return {
        "multi_day": values.per_user.mean(axis=0),
        "per_request": np.array([values.per_request[name] for name in signals.FEED_SIGNALS]),
    }


def picks(values: list[dict[str, np.ndarray]], behaviour: dict[str, np.ndarray]) -> dict[str, int]:
    """Per objective, the candidate with the most watch time holding every constraint against the
    behaviour (``<objective>``; the first candidate when none holds) and the one with the most watch time
    (``<objective>-unconstrained``), by index into ``values`` (objective_values per candidate)."""
    out = {}
    for objective in OBJECTIVES:
        table = np.stack([v[objective] for v in values])
        out[objective] = most_watch_holding(table, behaviour[objective])
        out[f"{objective}-unconstrained"] = int(np.argmax(table[:, _WATCH]))
    return out


def objective_totals(values: list[PolicyValues]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per objective, the candidates' totals per user (C, K) and the units their value is per (C,)."""
    totals = np.stack([v.per_user.mean(axis=0) for v in values])
    per_request = np.stack([objective_values(v)["per_request"] for v in values])
    return {
        "multi_day": (totals, np.ones(len(values))),
        "per_request": (totals, totals[:, _WATCH] / per_request[:, _WATCH]),
    }


def lookahead_value(reference: PolicyValues, myopic: PolicyValues, far_sighted: PolicyValues) -> dict:
    """The far-sighted pick's multi-day watch time over the myopic pick's, paired per user, in points of
    the reference's (the behaviour's) per-user mean, with its 95% interval."""
    before, after = myopic.per_user[:, _WATCH], far_sighted.per_user[:, _WATCH]
    paired = paired_per_user(signals.FEED_MAIN_SIGNAL, before, after)
    scale = float(reference.per_user[:, _WATCH].mean())
    return {
        "points": paired["difference"] / scale,
        "low": paired["interval"][0] / scale,
        "high": paired["interval"][1] / scale,
    }


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of two samples without ties (continuous values)."""
    return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(y)))[0, 1])


def candidate_table(values: list[dict[str, np.ndarray]], behaviour: dict[str, np.ndarray]) -> list[dict]:
    """Per candidate on the selection world: its watch-time lift under each objective, what that makes of
    its requests per user, and whether it holds every constraint under each."""

    def lift(value: dict[str, np.ndarray], objective: str) -> float:
        return float(value[objective][_WATCH] / behaviour[objective][_WATCH] - 1.0)

    return [
        {
            "watch_lift": {objective: lift(v, objective) for objective in OBJECTIVES},
            # multi-day watch = requests x watch per request, so the requests' share of the lift
            "requests_per_user_lift": (1.0 + lift(v, "multi_day")) / (1.0 + lift(v, "per_request")) - 1.0,
            "holds": {objective: bool(holds(v[objective], behaviour[objective])) for objective in OBJECTIVES},
        }
        for v in values
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "lookahead_ceiling")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    commit = git_commit()
    search = dataclasses.replace(
        SearchConfig(users=settings["users"], days=settings["days"]), **settings["search"]
    )
    scoring_world = evaluation_worlds(args.seed, 1)[0]
    behaviour = behaviour_feed_policy()
    # the reference search's own stream: its first round is the search's
    rng = np.random.default_rng(np.random.SeedSequence(search.seed, spawn_key=(7,)))

    def weighting(logits: np.ndarray) -> SegmentedFeedPolicy:
        return SegmentedFeedPolicy.global_weighting(logits, behaviour.state_coef)

    with worker_pool() as workers:

        def run_on(world: int, policies: list[FeedPolicy]) -> list[PolicyValues]:
            job = functools.partial(run, users=search.users, days=search.days, world=world)
            return list(workers.map(job, policies))

        candidates = first_round_candidates(search, behaviour.base_logits, rng)
        reference, *runs = run_on(search.seed, [behaviour, *map(weighting, candidates)])
        selection_behaviour = objective_values(reference)
        for scale in search.local_scales:
            chosen = picks([objective_values(r) for r in runs], selection_behaviour)
            centres = sorted({chosen[objective] for objective in OBJECTIVES})
            local = np.vstack([local_candidates(search, candidates[c], scale, rng) for c in centres])
            print(f"local round at {scale:g} around candidates {centres}", file=sys.stderr)
            candidates = np.vstack([candidates, local])
            runs += run_on(search.seed, list(map(weighting, local)))
        selection_values = [objective_values(r) for r in runs]
        chosen = picks(selection_values, selection_behaviour)
        by_objective = objective_totals(runs)
        mixtures = {o: best_mixture(*by_objective[o], selection_behaviour[o]) for o in OBJECTIVES}
        policies: dict[str, FeedPolicy | Mixture] = {
            name: weighting(candidates[index]) for name, index in chosen.items()
        } | {
            f"{objective}-mixture": Mixture.of_candidates(weights, candidates, behaviour.state_coef)
            for objective, weights in mixtures.items()
            if weights is not None
        }
        parts = [(name, part) for name, policy in policies.items() for part in components(policy)]
        scored_behaviour, *scored_parts = run_on(scoring_world, [behaviour, *(part for _, part in parts)])
    scored = {
        name: combined(
            policy, [v for (owner, _), v in zip(parts, scored_parts, strict=True) if owner == name]
        )
        for name, policy in policies.items()
    }

    scoring = {}
    for name, policy_values in scored.items():
        report = compare_values(scored_behaviour, policy_values)
        if name in chosen:
            what = {"candidate": chosen[name], "logits": candidates[chosen[name]].round(4).tolist()}
        else:
            weights = mixtures[name.removesuffix("-mixture")]
            what = {
                "weights": {int(c): round(float(weights[c]), 4) for c in np.flatnonzero(weights > 1e-6)},
                # the watch-time lift it promised on the selection world, by each objective
                "promised_watch_lift": {
                    o: mixture_watch_lift(weights, *by_objective[o], selection_behaviour[o])
                    for o in OBJECTIVES
                },
            }
        scoring[name] = {
            **what,
            "lifts": lifts(report),
            "broken": broken_signals(report),
            "return_rate": report["return_rate"],
        }
        watch = scoring[name]["lifts"][signals.FEED_MAIN_SIGNAL]["lift"]
        print(
            f"{name}: multi-day watch {100 * watch:+.2f}%, broke {scoring[name]['broken']}", file=sys.stderr
        )

    def same(far: str, myopic: str) -> bool:
        if far in chosen:
            return chosen[far] == chosen[myopic]
        return bool(
            np.allclose(mixtures[far.removesuffix("-mixture")], mixtures[myopic.removesuffix("-mixture")])
        )

    value = {
        kind: {
            "same_weighting": same(f"multi_day{suffix}", f"per_request{suffix}"),
            **lookahead_value(scored_behaviour, scored[f"per_request{suffix}"], scored[f"multi_day{suffix}"]),
        }
        for kind, suffix in (
            ("constrained", ""),
            ("constrained_mixture", "-mixture"),
            ("unconstrained", "-unconstrained"),
        )
        if f"multi_day{suffix}" in scored and f"per_request{suffix}" in scored
    }
    table = candidate_table(selection_values, selection_behaviour)
    result = {
        "benchmark": "lookahead_ceiling",
        "commit": commit,
        "mode": args.mode,
        "seed": args.seed,
        "config": {**settings, "selection_world": search.seed, "scoring_world": scoring_world},
        "candidates": table,
        # across the candidates on the selection world: whether the myopic objective orders the weightings
        # as the multi-day one does
        "watch_rank_correlation": rank_correlation(
            np.array([c["watch_lift"]["per_request"] for c in table]),
            np.array([c["watch_lift"]["multi_day"] for c in table]),
        ),
        # each pick and mixture on the scoring world, paired against the behaviour policy
        "picks": scoring,
        # the far-sighted pick's multi-day watch time over the myopic pick's on the scoring world
        "lookahead_value": value,
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    said = {
        kind: f"{100 * v['points']:+.2f} points [{100 * v['low']:+.2f}, {100 * v['high']:+.2f}]"
        + (" (the same weighting)" if v["same_weighting"] else "")
        for kind, v in value.items()
    }
    print(f"looking ahead is worth {said}; {result['wall_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
