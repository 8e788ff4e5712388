"""Benchmark: the user-author value as a ranking term, against TSCAC alone and a follow boost (issue 22).

Logs of the behaviour policy go the production way (simulator -> embedded Kafka -> the Beam pipeline, with
the user-author surface) into one dataset. On it, per training seed: TSCAC (the feed policy), and the pair
critic (``train --algo ua-mtcl``). Two questions:

1. **Does MTCL learn the sparse heads better than independent heads?** Both critics train in process on
   the pairs of the dataset but a held-out fifth; each head's prediction error is measured against the
   held-out rows' Monte-Carlo returns along their pairs' chains. The returns come from the logged run
   replayed in the simulator (the same seed gives the same views; the replay checks that its rewards are
   the dataset's) and carried on for ``EXTENSION_DAYS`` more days, so that a row near the log's end still
   sees its pair's later meetings. The returns discount as the registry's critic does (``CRITIC``: per
   meeting, and per day between meetings, which is what lets a finite replay measure them). Every held-out
   row is scored. An earlier version scored only rows with five later meetings in the log, which selected by
   the future: a follow brings the author's videos back (the following feed), so pairs that followed
   meet more, and on those rows drawn follows were 0.0058 a meeting against 0.0006 expected.
   A follow is a coin that lands once in two thousand views, so much of a return's spread is the luck of
   the draws, which no value can predict. Each view's expected click, follow and gift in the replay
   give the share of each head's error that is that luck (``noise_share``, so the most any value could
   cut the mean's error, ``best_reduction_over_mean``), and each critic's error against the *expected*
   returns, where the luck is gone and what is left is what a value can learn.
2. **Does the pair value, as one more term in the ranking score, bring follows without costing the
   rest?** Two user-author terms: every head's value in reward-std units, and the follow head's alone.
   On a tuning world, each term's weight is chosen from a grid (the most follows with no signal broken
   against TSCAC alone, at that weight and the next larger one); the headline user-author term is the
   one of the two with more follows there.
   Then on one evaluation world per seed, for ``eval_days`` days: TSCAC alone, TSCAC + each term, TSCAC
   + the follow-probability boost, and TSCAC + the follow oracle (the world's own expected follow, which no
   ranker has: how far a follow term that knew everything gets), on the same episode draws.
   Every figure is per user over the days from expected responses (the multi-day objective, return
   included), paired against TSCAC alone, pooled over the seeds' worlds. The author side: authors who
   gained followers, the Gini coefficient of video impressions over all authors, and the pairs' returns
   per user (from the views as drawn: a pair's meeting has no expectation to count instead).

The critics' error measurements and every simulated run are jobs of a worker pool (``bench/workers.py``),
one process a core: a loaded critic or policy does not pickle, so each job loads its own (``Term``,
``ranked_run``).

    python bench/user_author.py --full --docs docs/user_author.md
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from common import bench_parser, git_commit, rounded, write_result
from trained import evaluation_worlds, logged_dataset, train_runs
from workers import worker_pool

from recsys_rl import signals
from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.sim.behaviour import FeedPolicy, behaviour_allocation_policy
from recsys_rl.sim.ground_truth import PolicyValues, evaluate_logs, run_days
from recsys_rl.sim.parameters import ResponseModel, SimConfig
from recsys_rl.sim.ranking_terms import ExpectedFollowTerm, FollowProbabilityTerm, PairValueTerm, TermRanking
from recsys_rl.sim.sim_eval import broken_signals, compare_values, paired_per_user
from recsys_rl.sim.simulate import SimulateConfig, simulated_days
from recsys_rl.sim.simulator import VIEW_SIGNAL_COLUMNS, DayLog, pair_meetings
from recsys_rl.sim.world import World
from recsys_rl.state import DAY_MS
from recsys_rl.training.agents.data import TransitionDataset, open_dataset
from recsys_rl.training.agents.policy_io import load_feed_policy, load_pair_value_policy
from recsys_rl.training.pair_value import (
    PairTransitions,
    PairValueConfig,
    monte_carlo_returns,
    train_pair_value,
)

SPARSE_HEADS = ("follow", "gift", "author_return")
#: The critic settings both critics train with, and the returns they are scored on discount by: the
#: registry's (``train --algo ua-mtcl``), so that the benchmark scores the critic that would serve.
CRITIC = PairValueConfig()
#: Days the replay goes on past the log, so that a held-out row's return sees the pair's later meetings:
#: what comes after is discounted by at least CRITIC.daily_discount ** 14 (4% at 0.8).
EXTENSION_DAYS = 14
HELD_OUT_SHARE = 0.2
#: The same network as the critics', fitted to the held-out rows' kind of truth instead of learning it by TD:
#: each training row's expected return along the replayed run, which comes from the run's future and no
#: critic has (discounts 0 make the TD target the row's reward; the waiting value, taught only zeros and
#: itself, stays near 0). How much of a row's value its pair state can tell at all.
REGRESSION = dataclasses.replace(CRITIC, discounts=(0.0,) * len(signals.PAIR_SIGNALS))
#: Bins of days from a row's meeting to the log's cut-off, for the critics' calibration by them: the
#: world starts with no pair history, so its pairs are not yet in a steady state over the log's days.
CUT_OFF_DAYS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, math.inf)
#: The weight grids the tuning world chooses from: the user-author term is in the critic's reward-std
#: units per meeting, the boost in a typical view's follow probability (fusion's units). The grids reach
#: down to weights small enough to break nothing: at 0.1, the smallest of the first grids, the boost
#: (+3% follows) and the all-heads term broke a constraint on every world, so neither had a weight to
#: choose, and the most follows the direct lever brings with nothing broken went unmeasured.
WEIGHTS = {
    "user-author": (0.01, 0.03, 0.1, 0.3, 1.0),
    # a follow head's value differs by hundredths of a reward std between pairs: larger weights
    "user-author-follow": (1.0, 3.0, 10.0, 30.0),
    "follow-boost": (0.01, 0.03, 0.1, 0.3, 1.0),
    "follow-oracle": (0.01, 0.03, 0.1, 0.3, 1.0),
}
#: The terms that need no critic: the supervised boost, and the oracle reference line.
CRITIC_FREE_TERMS = {"follow-boost": FollowProbabilityTerm(), "follow-oracle": ExpectedFollowTerm()}
#: Each user-author term's coefficients on the heads (PAIR_SIGNALS order), in reward-std units.
HEADS = {"user-author": (1.0, 1.0, 1.0, 1.0), "user-author-follow": (0.0, 1.0, 0.0, 0.0)}
#: The tuning world: TUNE_WORLD + --seed, neither the training world nor an evaluation world.
TUNE_WORLD = 1_500
MODES: dict[str, dict[str, Any]] = {
    # CI smoke run: the whole path, too small for any verdict to mean anything
    "quick": {
        "users": 300,
        "days": 2,
        "steps": 60,
        "critic_steps": 100,
        # shares of the training pairs the critics also train on, beside all of them
        "fewer_pairs": (0.5,),
        "seeds": (0,),
        "eval_users": 400,
        "eval_days": 2,
    },
    "full": {
        "users": 3_000,
        "days": 7,
        "steps": 1_500,
        "critic_steps": 3_000,
        "fewer_pairs": (0.03, 0.1),
        "seeds": (0, 1, 2, 3, 4),
        "eval_users": 20_000,
        "eval_days": 7,
    },
}


# -- 1. MTCL against independent heads ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReplayedReturns:
    """Per pair row of the dataset, in PAIR_SIGNALS order, its returns along the pair's meetings in the
    replayed run: of the drawn rewards, of their expectations, and the luck (the draws' variance) between
    the two. The pair's return is no draw of a view (whether the meeting came on a later day than the
    last): its own value in both, variance 0."""

    drawn: np.ndarray  # (N, S)
    expected: np.ndarray  # (N, S)
    luck: np.ndarray  # (N, S): sum over the meetings of discount^2k times each reward's variance


#: The pair signals that are draws of the view (each the view signal of the same name), in the order
#: ``pair_meetings`` gives them.
_DRAWN = ("click", "follow", "gift")


def replayed_returns(
    dataset: TransitionDataset, data: PairTransitions, *, users: int, days: int, seed: int
) -> ReplayedReturns:
    """The logged run replayed in the simulator and carried on for EXTENSION_DAYS more days (the same
    world, users and behaviour policy), each dataset row matched to its view by user, item and time.

    Click and follow are Bernoulli draws, variance p(1 - p); a gift is a Bernoulli times an exponential
    value of mean m, so its variance is 2 m E - E^2 for its expectation E.
    """
    sim, next_day = simulated_days(SimulateConfig(users=users, days=days + EXTENSION_DAYS, seed=seed))
    frames = []
    for _ in range(days + EXTENSION_DAYS):
        views = next_day().views
        user, author, time_ms, *drawn_columns = pair_meetings(views, sim.world)
        frame = pd.DataFrame(
            {
                "user_id": "u" + user.astype(str),
                "item_id": np.where(views.is_live, "l", "v") + views.item.astype(str),
                "event_time_ms": time_ms,
                "pair": user.astype(np.int64) * sim.config.n_authors + author,
            }
        )
        for name, values in zip(_DRAWN, drawn_columns, strict=True):
            frame[name] = values
            frame[f"expected_{name}"] = views.expected[:, VIEW_SIGNAL_COLUMNS.index(name)]
        frames.append(frame)
    # each pair's meetings in order, as the pipeline chains them (pipelines.user_author)
    met = pd.concat(frames, ignore_index=True).sort_values(["pair", "event_time_ms", "item_id"])
    day = met["event_time_ms"].to_numpy() // DAY_MS
    pair = met["pair"].to_numpy()
    first = np.r_[True, pair[1:] != pair[:-1]]
    returned = ~first & (day > np.r_[0, day[:-1]])
    drawn = np.column_stack([met["click"] > 0, met["follow"] > 0, met["gift"], returned]).astype(np.float64)
    expected, variances = drawn.copy(), np.zeros_like(drawn)
    gift_mean = ResponseModel().live_gift_mean
    for name in _DRAWN:
        e = met[f"expected_{name}"].to_numpy(np.float64)
        expected[:, signals.PAIR_SIGNALS.index(name)] = e
        variances[:, signals.PAIR_SIGNALS.index(name)] = (
            2 * gift_mean * e - e**2 if name == "gift" else e * (1 - e)
        )
    steps = np.arange(pair.size) - np.flatnonzero(first)[np.cumsum(first) - 1]
    time_ms = met["event_time_ms"].to_numpy()
    last = np.r_[first[1:], True]
    gap_days = np.where(last, 0, np.r_[np.diff(time_ms), 0]) / DAY_MS
    empty = np.zeros((pair.size, 0))
    chain = PairTransitions(empty, empty, drawn, pair, steps, gap_days, last)
    discounts, daily = CRITIC.discounts, CRITIC.daily_discount
    returns = [
        monte_carlo_returns(dataclasses.replace(chain, rewards=rewards), gammas, per_day)[0]
        for rewards, gammas, per_day in (
            (drawn, discounts, daily),
            (expected, discounts, daily),
            (variances, tuple(g * g for g in discounts), daily**2),
        )
    ]
    keys = pd.concat(
        [
            pq.read_table(path, columns=["user_id", "item_id", "event_time_ms"]).to_pandas()
            for path in dataset.shard_paths("parquet")
        ],
        ignore_index=True,
    )
    met["row"] = np.arange(len(met))
    rows = keys.merge(met[["user_id", "item_id", "event_time_ms", "row"]], how="left", validate="one_to_one")
    if rows["row"].isna().any():
        raise RuntimeError("the replayed run lacks pair meetings the logged run has")
    index = rows["row"].to_numpy(np.int64)
    if not np.array_equal(drawn[index].astype(np.float32), data.rewards):  # the dataset's rewards are float32
        raise RuntimeError("the replayed run's pair rewards differ from the logged run's")
    return ReplayedReturns(*(r[index] for r in returns))


def days_to_cut_off(data: PairTransitions) -> np.ndarray:
    """Each row's days from its meeting to the log's cut-off: its pair's gaps from the row on, the last
    of which runs to the cut-off."""
    order = np.lexsort((data.steps, data.pairs))
    gaps, pairs = data.gap_days[order].astype(np.float64), data.pairs[order]
    from_here = np.cumsum(gaps[::-1])[::-1]  # the gaps from each row to the end of all the chains
    last = np.r_[pairs[1:] != pairs[:-1], True]
    chain_end = np.flatnonzero(last)[np.cumsum(np.r_[True, last[:-1]]) - 1]  # each row's chain's last row
    days = np.empty(len(order))
    days[order] = from_here - from_here[chain_end] + gaps[chain_end]
    return days


def critic_errors(
    data: PairTransitions, replayed: ReplayedReturns, steps: int, seed: int, train_share: float = 1.0
) -> dict[str, Any]:
    """Each critic's RMSE per head on the held-out pairs' rows, against their Monte-Carlo returns and
    against the expected returns along the same meetings, the critics trained on ``train_share`` of the
    other pairs (drawn per pair; the held-out rows are the same at every share).

    The luck in a return, ``sum_k g^2k var_k`` over its meetings, is what no value of the row's state can
    predict; it leaves out that one draw moves later probabilities (a follow ends the pair's follows),
    which is second order for rare signals, and the luck of which meetings come at all, which only adds
    to it: ``best_reduction_over_mean`` is an upper bound.
    """
    returns, expected_returns, luck = replayed.drawn, replayed.expected, replayed.luck
    held_pairs = np.random.default_rng(seed).random(data.pairs.max() + 1) < HELD_OUT_SHARE
    held = held_pairs[data.pairs]
    kept_pairs = np.random.default_rng((seed, 1)).random(held_pairs.size) < train_share
    trained_on = ~held & kept_pairs[data.pairs]
    train = PairTransitions(*(a[trained_on] for a in dataclasses.astuple(data)))
    out: dict[str, Any] = {"held_out_rows": int(held.sum()), "training_rows": int(trained_on.sum())}
    # the reference any value should beat: each head's mean return over the training pairs' rows
    mean = returns[trained_on].mean(axis=0)

    def per_head(values: np.ndarray) -> dict[str, float]:
        return dict(zip(signals.PAIR_SIGNALS, map(float, values), strict=True))

    def rmse(predicted: np.ndarray, targets: np.ndarray) -> dict[str, float]:
        return per_head(np.sqrt(((predicted - targets[held]) ** 2).mean(axis=0)))

    predictions = {"training_mean": mean}
    for critic in ("mtcl", "independent"):
        policy = train_pair_value(train, CRITIC, critic=critic, steps=steps, batch_size=512, seed=seed)
        predictions[critic] = policy.values(data.states[held]).numpy()
    fitted = dataclasses.replace(train, rewards=expected_returns[trained_on].astype(np.float32))
    regression = train_pair_value(fitted, REGRESSION, critic="mtcl", steps=steps, batch_size=512, seed=seed)
    regressed = regression.values(data.states[held]).numpy()
    out |= {name: rmse(p, returns) for name, p in predictions.items()}
    out["expected_returns"] = {name: rmse(p, expected_returns) for name, p in predictions.items()}
    out["expected_returns"]["regression"] = rmse(regressed, expected_returns)
    # calibration: a value's mean over the held-out rows against their mean expected return, over all of
    # them and by days to the cut-off
    valued = {"mtcl": predictions["mtcl"], "independent": predictions["independent"], "regression": regressed}
    out["mean_value"] = {name: per_head(v.mean(axis=0)) for name, v in valued.items()}
    out["mean_value"]["expected_return"] = per_head(expected_returns[held].mean(axis=0))
    bins = np.digitize(days_to_cut_off(data)[held], CUT_OFF_DAYS[1:-1])
    out["calibration_by_days_to_cut_off"] = []
    for b, (low, high) in enumerate(itertools.pairwise(CUT_OFF_DAYS)):
        in_bin = bins == b
        if not in_bin.any():
            continue
        truth = expected_returns[held][in_bin].mean(axis=0)
        if np.all(truth > 0):
            out["calibration_by_days_to_cut_off"].append(
                {
                    "days": [low, high if math.isfinite(high) else None],
                    "rows": int(in_bin.sum()),
                    **{name: per_head(v[in_bin].mean(axis=0) / truth) for name, v in valued.items()},
                }
            )
    squared_error = ((mean - returns[held]) ** 2).mean(axis=0)
    share = np.divide(
        luck[held].mean(axis=0), squared_error, out=np.zeros(len(mean)), where=squared_error > 0
    )
    out["noise_share"] = {s: v for s, v in per_head(share).items() if s in _DRAWN}
    for errors in (out, out["expected_returns"]):
        errors["reduction"] = {
            s: 1.0 - errors["mtcl"][s] / errors["independent"][s] if errors["independent"][s] > 0 else None
            for s in signals.PAIR_SIGNALS
        }
    return out


# -- 2. the ranking term ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """One policy's run on one world: its per-user values and the author side."""

    values: PolicyValues
    impressions: np.ndarray  # (n_authors,) video impressions per author
    authors_followed: int  # authors who gained at least one follower
    pair_returns: np.ndarray  # (n_users,) each user's pair returns over the days (``pair_returns``)


def run(policy: FeedPolicy, *, users: int, days: int, world: int) -> Outcome:
    config = SimConfig(n_users=users)
    started = time.perf_counter()
    logs = run_days(config, policy, behaviour_allocation_policy(), seed=world, days=days)
    author = World.of_seed(config, world)
    served = np.concatenate([d.feed.served for d in logs])
    live_slot = np.concatenate([d.feed.live_slot for d in logs])
    videos = served[np.arange(served.shape[1]) != live_slot[:, None]]
    impressions = np.bincount(author.videos.author[videos], minlength=config.n_authors)
    follows = [d.views.item[~d.views.is_live & (d.views.signals[:, 3] > 0)] for d in logs]
    followed_authors = np.unique(author.videos.author[np.concatenate(follows)])
    print(f"ran {policy.version} on world {world} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return Outcome(
        evaluate_logs(logs, users), impressions, int(followed_authors.size), pair_returns(logs, author, users)
    )


@dataclasses.dataclass(frozen=True)
class Term:
    """A ranking term as a worker builds it: the pair critic exported at ``critic`` with ``heads`` (in
    reward-std units), or the critic-free term ``name`` (``CRITIC_FREE_TERMS``) when ``critic`` is None. A
    loaded critic does not pickle."""

    name: str
    critic: Path | None = None
    heads: tuple[float, ...] = ()

    def build(self) -> PairValueTerm | FollowProbabilityTerm | ExpectedFollowTerm:
        if self.critic is None:
            return CRITIC_FREE_TERMS[self.name]
        policy = load_pair_value_policy(self.critic)
        return PairValueTerm(policy.values, np.asarray(policy.manifest["reward_std"]), self.heads, self.name)


def ranked_run(
    tscac: Path, term: Term | None, weight: float, *, users: int, days: int, world: int
) -> Outcome:
    """A worker's job: TSCAC exported at ``tscac``, with ``term`` at ``weight`` added when given, on
    ``world``."""
    policy = load_feed_policy(tscac, numpy=True)
    return run(
        policy if term is None else TermRanking(policy, term.build(), weight),
        users=users,
        days=days,
        world=world,
    )


def pair_returns(logs: list[DayLog], world: World, users: int) -> np.ndarray:
    """Per user, the pair surface's ``author_return`` summed over the days: a pair that meets on k
    distinct days returns k - 1 times (a pair's first meeting in the run is none: the run is all the
    history the world has). What the gate's ``author_return`` judges on logs, counted on the views."""
    meetings = []
    for log in logs:
        user, author = pair_meetings(log.views, world)[:2]
        meetings.append(np.column_stack([user, author, np.full(user.size, log.day)]))
    met = np.unique(np.concatenate(meetings), axis=0)  # one row per (user, author, day) that met
    pairs, days = np.unique(met[:, :2], axis=0, return_counts=True)
    return np.bincount(pairs[:, 0], weights=days - 1, minlength=users)


def gini(counts: np.ndarray) -> float:
    """The Gini coefficient of ``counts`` over all its entries (0: even; near 1: all on one)."""
    ordered = np.sort(counts.astype(np.float64))
    n, total = ordered.size, ordered.sum()
    if total == 0:
        return 0.0
    return float((2.0 * np.arange(1, n + 1) - n - 1) @ ordered / (n * total))


def choose_weight(reference: PolicyValues, by_weight: dict[float, PolicyValues]) -> dict[str, Any]:
    """Each grid weight's term (``by_weight``, run on the tuning world) against TSCAC alone there
    (``reference``), and the weight chosen from them (``weight_with_margin``)."""
    tried = []
    for weight in sorted(by_weight):
        report = compare_values(reference, by_weight[weight])
        tried.append(
            {
                "weight": weight,
                "follow_lift": report["signals"]["follow"]["lift"],
                "holds": not broken_signals(report),
                "broken": broken_signals(report),
            }
        )
    return weight_with_margin(tried)


def weight_with_margin(tried: list[dict[str, Any]]) -> dict[str, Any]:
    """The weight with the most follows among those (``tried``, in increasing weight) that broke nothing on
    the tuning world and whose next larger weight broke nothing either; the smallest weight when none did.

    The margin is against the winner's curse of choosing on one world's intervals: at 46cc963 the
    every-head term held at 0.03 (+0.13% follows) next to 0.1, which broke every signal, and on the five
    evaluation worlds 0.03 broke watch time (-0.10%). A weight next to where a term breaks on one world is
    past it on the next; one grid step (a factor of 3) back from the edge is not. The largest weight has no
    next one, and counts when it holds itself."""
    above = [*tried[1:], None]
    safe = [
        t for t, after in zip(tried, above, strict=True) if t["holds"] and (after is None or after["holds"])
    ]
    chosen = max(safe, key=lambda t: t["follow_lift"] or 0.0) if safe else tried[0]
    return {
        "weight": chosen["weight"],
        "held_on_tuning_world": any(t["holds"] for t in tried),
        "held_with_margin": bool(safe),
        "tried": tried,
    }


def headline_term(weights: dict[str, dict[str, Any]]) -> str:
    """The user-author term with the most follows on the tuning world among those whose weight held there
    with its margin (``weight_with_margin``; the all-heads term when neither did): chosen before the
    evaluation worlds are run."""

    def tuned(name: str) -> float:
        chosen = next(t for t in weights[name]["tried"] if t["weight"] == weights[name]["weight"])
        return chosen["follow_lift"] or 0.0 if weights[name]["held_with_margin"] else -math.inf

    return max(HEADS, key=lambda name: (tuned(name), name == "user-author"))


def pooled(values: list[PolicyValues]) -> PolicyValues:
    """Several worlds' values as one population: their users side by side, paired with themselves."""
    return dataclasses.replace(
        values[0],
        per_user=np.concatenate([v.per_user for v in values]),
        return_rate=statistics.fmean(v.return_rate for v in values),
        episodes=sum(v.episodes for v in values),
    )


def term_summary(reference: list[Outcome], outcomes: list[Outcome]) -> dict[str, Any]:
    """Per seed and pooled: every signal's lift over TSCAC alone with its paired interval, the verdicts,
    and the author side."""
    per_seed = [compare_values(r.values, o.values) for r, o in zip(reference, outcomes, strict=True)]
    report = compare_values(pooled([r.values for r in reference]), pooled([o.values for o in outcomes]))
    follow = report["signals"]["follow"]
    reference_follows = follow["behaviour"]["mean"]
    returns = paired_per_user(
        "author_return",
        np.concatenate([r.pair_returns for r in reference]),
        np.concatenate([o.pair_returns for o in outcomes]),
    )
    gini_delta = [
        100 * (gini(o.impressions) - gini(r.impressions)) for r, o in zip(reference, outcomes, strict=True)
    ]
    return {
        "pooled": report,
        "follow_lift": follow["lift"],
        "follow_lift_interval": [
            x / reference_follows if x is not None else None for x in follow["interval"]
        ],
        "follow_lift_per_seed": [r["signals"]["follow"]["lift"] for r in per_seed],
        "pair_returns": returns,
        "holds_per_seed": [not broken_signals(r) for r in per_seed],
        "holds_pooled": not broken_signals(report),
        "return_rate": statistics.fmean(o.values.return_rate for o in outcomes),
        "authors_followed": statistics.fmean(o.authors_followed for o in outcomes),
        "authors_followed_reference": statistics.fmean(r.authors_followed for r in reference),
        "gini": statistics.fmean(gini(o.impressions) for o in outcomes),
        "gini_reference": statistics.fmean(gini(r.impressions) for r in reference),
        "gini_delta_points": statistics.fmean(gini_delta),
        "gini_delta_points_per_seed": gini_delta,
    }


def errors_summary(errors: list[dict[str, Any]], head: str) -> dict[str, Any]:
    """One head's RMSE of each predictor, averaged over the seeds, and MTCL's reduction of it."""
    predictors = [k for k in ("mtcl", "independent", "training_mean", "regression") if k in errors[0]]
    return {
        **{k: statistics.fmean(e[k][head] for e in errors) for k in predictors},
        "reduction": mean_and_stderr([e["reduction"][head] or 0.0 for e in errors]),
    }


def mean_and_stderr(values: list[float]) -> dict[str, float | None]:
    mean = statistics.fmean(values)
    stderr = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"mean": mean, "stderr": stderr}


def _error_table(per_head: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows: each head's RMSE by MTCL, by independent heads and by the training rows' mean, and by
    the regression on the truth where there is one (against the expected returns)."""
    regression = "regression" in next(iter(per_head.values()))
    rows = [
        "| head | MTCL | independent | reduction | training rows' mean |"
        + " regression on the truth |" * regression,
        "|---|---|---|---|---|" + "---|" * regression,
    ]
    for s, row in per_head.items():
        reduction = row["reduction"]
        rows.append(
            f"| {s} | {row['mtcl']:.4g} | {row['independent']:.4g} | "
            f"{100 * reduction['mean']:+.1f}% ± {100 * (reduction['stderr'] or 0):.1f} | "
            f"{row['training_mean']:.4g} |" + f" {row.get('regression', 0):.4g} |" * regression
        )
    return rows


def _tried(tried: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{t['weight']:g} ({100 * t['follow_lift']:+.2f}%, "
        f"{'held' if t['holds'] else 'broke ' + ' and '.join(t['broken'])})"
        for t in tried
    )


def fewer_pairs_summary(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """MTCL against independent heads at one share of the training pairs (``critic_errors`` per seed):
    the rows trained on, and each sparse head's RMSE against the expected returns."""
    return {
        "training_rows": statistics.fmean(e["training_rows"] for e in errors),
        "per_head": {s: errors_summary([e["expected_returns"] for e in errors], s) for s in SPARSE_HEADS},
    }


def fewer_pairs_table(by_share: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: per share of the training pairs and sparse head, each critic's RMSE over the mean's."""
    rows = [
        "| share of training pairs | rows | head | MTCL / mean | independent / mean | reduction |",
        "|---|---|---|---|---|---|",
    ]
    for point in by_share:
        for head, row in point["per_head"].items():
            reduction, mean = row["reduction"], row["training_mean"]
            rows.append(
                f"| {point['share']:g} | {point['training_rows']:.0f} | {head} | "
                f"{row['mtcl'] / mean:.3f} | {row['independent'] / mean:.3f} | "
                f"{100 * reduction['mean']:+.1f}% ± {100 * (reduction['stderr'] or 0):.1f} |"
            )
    return rows


#: The calibration tables' predictors, by their key in a result and their column's name.
_CALIBRATED = {"mtcl": "MTCL", "independent": "independent", "regression": "regression on the truth"}


def calibration_table(per_head: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows: each head's mean expected return on the held-out rows and each predictor's mean value
    (a result from before the regression has no such column)."""
    shown = [k for k in _CALIBRATED if k in next(iter(per_head.values()))["mean_value"]]
    rows = [
        "| head | mean expected return | " + " | ".join(_CALIBRATED[k] for k in shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    for s, row in per_head.items():
        means = row["mean_value"]
        truth = means["expected_return"]
        cells = [f"{means[k]:.4g} ({means[k] / truth:.2f}x)" for k in shown]
        rows.append(f"| {s} | {truth:.4g} | " + " | ".join(cells) + " |")
    return rows


def calibration_by_days(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bin of days to the cut-off: its held-out rows and each predictor's calibration per head, means
    over the seeds that have the bin (each seed holds out pairs of its own)."""
    by_days: dict[tuple, list[dict[str, Any]]] = {}
    for e in errors:
        for point in e["calibration_by_days_to_cut_off"]:
            by_days.setdefault(tuple(point["days"]), []).append(point)
    return [
        {
            "days": list(days),
            "rows": statistics.fmean(b["rows"] for b in bins),
            **{
                name: {s: statistics.fmean(b[name][s] for b in bins) for s in signals.PAIR_SIGNALS}
                for name in _CALIBRATED
            },
        }
        for days, bins in by_days.items()
    ]


def calibration_by_days_table(by_days: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: per bin of days to the cut-off, MTCL's and the regression's calibration per head."""
    heads = signals.PAIR_SIGNALS
    rows = [
        "| days to the cut-off | rows | " + " | ".join(f"{s}: MTCL | {s}: regression" for s in heads) + " |",
        "|---|---|" + "---|" * (2 * len(heads)),
    ]
    for point in by_days:
        low, high = point["days"]
        days = f"{low:g}-{high:g}" if high is not None else f"{low:g} or more"
        cells = [f"{point[k][s]:.2f}" for s in heads for k in ("mtcl", "regression")]
        rows.append(f"| {days} | {point['rows']:.0f} | " + " | ".join(cells) + " |")
    return rows


def calibration_by_days_section(mtcl: dict[str, Any]) -> list[str]:
    """The calibration by days to the cut-off, with what it compares (none in a result from before it)."""
    if "calibration_by_days_to_cut_off" not in mtcl:
        return []
    return [
        "The same ratio by days from the row's meeting to the log's cut-off (rows and ratios: means over "
        "seeds, each holding out pairs of its own). The world "
        "starts with no pair history, and the pair state has nothing that dates a row. 'regression' is "
        "the critics' network fitted to the training rows' expected returns along the replayed run, "
        "which come from the run's future and no critic has: the calibration a value of the pair state "
        "gets without TD (its column in the table above).",
        "",
        *calibration_by_days_table(mtcl["calibration_by_days_to_cut_off"]),
        "",
    ]


def _lift_with_interval(paired: dict[str, Any]) -> str:
    """A paired lift and its 95% interval, both relative to the reference's mean."""
    reference, (low, high) = paired["behaviour"]["mean"], paired["interval"]
    if paired["lift"] is None or not reference or low is None or high is None:
        return "n/a"
    return f"{100 * paired['lift']:+.2f}% ({100 * low / reference:+.2f}..{100 * high / reference:+.2f})"


def markdown(result: dict[str, Any]) -> str:
    """The page of a result, as run or as read back from its file (whose keys are sorted): heads and terms
    in the benchmark's own order."""
    config, mtcl = result["config"], result["mtcl"]
    # in a fixed order, the terms the result has (one from before the oracle row has no oracle)
    terms = {name: result["terms"][name] for name in (*HEADS, *CRITIC_FREE_TERMS) if name in result["terms"]}
    mtcl = {
        **mtcl,
        "per_head": {s: mtcl["per_head"][s] for s in signals.PAIR_SIGNALS},
        "by_training_share": [
            {**point, "per_head": {s: point["per_head"][s] for s in SPARSE_HEADS}}
            for point in mtcl["by_training_share"]
        ],
    }
    lines = [
        "# The user-author value in the simulator",
        "",
        f"Written by `python bench/user_author.py --{result['mode']} --docs docs/user_author.md` "
        f"at commit `{result['commit']}` in {result['wall_s'] / 60:.0f} min.",
        f"Logs: {config['users']} users x {config['days']} days of the behaviour policy "
        f"({config['pair_rows']} pair transitions over {config['pairs']} pairs, "
        f"{config['feed_rows']} feed transitions); TSCAC "
        f"{config['steps']} steps, pair critics {config['critic_steps']} steps; training seeds "
        f"{config['seeds']}. Evaluation: one world of {config['eval_users']} users per seed for "
        f"{config['eval_days']} days, never used for training or tuning.",
        "",
        "## MTCL against independent heads",
        "",
        "RMSE of each head against held-out Monte-Carlo returns "
        f"(discount {CRITIC.discounts[0]} per meeting and {CRITIC.daily_discount} per day, along the "
        f"replayed run and {EXTENSION_DAYS} days "
        f"past the log; every held-out row: {mtcl['held_out_rows']} rows), MTCL's reduction of it (mean ± "
        "standard error over "
        "seeds), and the RMSE of predicting each head's mean return over the training rows, the "
        "reference a value that learnt something from the pair's state beats:",
        "",
        *_error_table(mtcl["per_head"]),
        "",
        f"`mtcl_error_reduction` (mean over the sparse heads {', '.join(SPARSE_HEADS)}): "
        f"{100 * result['mtcl_error_reduction']:+.1f}% (target: at least +10%).",
        "",
        "How much of that error is the luck of the draws, which no value can predict: the share of the "
        "mean's squared error that is the draws' variance along the meetings (from each view's expected "
        "click, follow and gift in the replayed run), and the "
        "most any value could then cut the mean's RMSE (at most, since it leaves out which meetings come):",
        "",
        "| head | luck's share of the mean's squared error | best possible reduction over the mean |",
        "|---|---|---|",
        *(
            f"| {s} | {100 * row['noise_share']:.1f}% | {100 * row['best_reduction_over_mean']:.1f}% |"
            for s, row in mtcl["per_head"].items()
            if "noise_share" in row
        ),
        "",
        "The same RMSE against the expected returns along the same meetings (the draws' luck taken out; "
        "the pair's return is no draw of a view, so its row is the one above)"
        + (
            ", and that of the critics' network fitted to the training rows' expected returns ('regression "
            "on the truth': what the pair state can tell of a row's value, with returns no critic has, from "
            "the run's future)"
            if "regression" in mtcl["per_head"]["follow"]["expected_returns"]
            else ""
        )
        + ":",
        "",
        *_error_table({s: row["expected_returns"] for s, row in mtcl["per_head"].items()}),
        "",
        f"`mtcl_error_reduction_on_expected_returns`: "
        f"{100 * result['mtcl_error_reduction_on_expected_returns']:+.1f}%.",
        "",
        "Calibration: each critic's mean value over the held-out rows against their mean expected return "
        "(a value that is right on average has the ratio 1):",
        "",
        *calibration_table(mtcl["per_head"]),
        "",
        *calibration_by_days_section(mtcl),
        "On fewer training pairs, where a funnel's denser heads should help the sparse ones most: each "
        "critic trained on a share of the training pairs (the same held-out rows), its RMSE against the "
        "expected returns as a multiple of the training rows' mean's (below 1: the critic learnt something "
        "from the pair's state), and MTCL's reduction (mean ± standard error over seeds):",
        "",
        *fewer_pairs_table(mtcl["by_training_share"]),
        "",
        "## The ranking term",
        "",
        "Against TSCAC alone, pooled over the seeds' worlds (paired per user): lift of each signal's "
        "per-user total over the days, and whether anything broke (paired 95% interval).",
        "",
        "| term | weight | "
        + " | ".join(signals.FEED_SIGNALS)
        + " | holds | pair returns | authors followed | Gini delta |",
        "|---|---|" + "---|" * (len(signals.FEED_SIGNALS) + 4),
    ]
    for name, t in terms.items():
        lifts = [t["pooled"]["signals"][s]["lift"] for s in signals.FEED_SIGNALS]
        cells = [f"{100 * v:+.2f}%" if v is not None else "n/a" for v in lifts]
        cells += [str(t["holds_pooled"]), _lift_with_interval(t["pair_returns"])]
        lines.append(
            f"| {name} | {t['weight']['weight']:g} | " + " | ".join(cells) + " | "
            f"{t['authors_followed']:.0f} (TSCAC {t['authors_followed_reference']:.0f}) | "
            f"{t['gini_delta_points']:+.2f} |"
        )
    headline = result["headline_term"]
    low, high = terms[headline]["follow_lift_interval"]
    lines += [
        "",
        f"- headline term (chosen on the tuning world): {headline}",
        f"- `follow_lift_over_tscac`: {100 * result['follow_lift_over_tscac']:+.2f}% "
        f"(95% interval {100 * (low or 0):+.2f}% to {100 * (high or 0):+.2f}%; "
        "target +5% with nothing broken)",
        f"- `author_gini_delta`: {result['author_gini_delta']:+.2f} points (target: at most +2)",
        f"- `pair_return_lift_over_tscac`: {_lift_with_interval(terms[headline]['pair_returns'])} (the "
        "pairs' returns per user: a pair meeting again on a later day, what the user_author gate's "
        "author_return counts; reported, not a constraint)",
        f"- follow lift per seed: {rounded(terms[headline]['follow_lift_per_seed'], 4)}",
        f"- the boost's follow lift: {100 * terms['follow-boost']['follow_lift']:+.2f}% (holds: "
        f"{terms['follow-boost']['holds_pooled']}): the most direct lever on follows, at the weight with "
        "the most follows that broke nothing on the tuning world, at it and the next larger weight",
        "",
        "Weights tried on the tuning world (follows against TSCAC alone; what broke, if anything): "
        + "; ".join(f"{n}: {_tried(t['weight']['tried'])}" for n, t in terms.items()),
    ]
    return "\n".join([*lines, "", METHOD])


METHOD = """## The protocol

- **Data.** The behaviour policies' logs of one world go through embedded Kafka and the Beam pipeline with
  the user-author surface: the same dataset trains TSCAC (the feed policy) and the pair critic
  (`train --algo ua-mtcl`) per seed.
- **MTCL against independent heads.** A fifth of the pairs is held out; both critics train in process on
  the rest, with the registry's settings, then each head predicts the held-out rows' discounted returns
  along their pairs' chains, discounted as the critics' targets are: per meeting, and per day between
  meetings. The chains are the logged run replayed in the simulator and carried on for 14 days past the
  log, so that no row's return ends at the log's end (what would follow is discounted by 0.8^14 = 4% at
  least), and every held-out row is scored: choosing rows by how many meetings follow them would choose
  by the future, and a follow makes a pair meet more. Both critics train again on shares of the rest
  (``fewer_pairs``, drawn per pair) and are scored on the same held-out rows: with ample pairs a sparse
  head has data of its own, and the funnel's help, if any, shows where it has little.
- **The ranking term.** score = fusion(predictions, TSCAC's action) + weight * term(candidate). The
  user-author terms combine the critic's values of the candidate's pair state (its history through the
  last finished day, as the feature store would serve it) in reward-std units: every head, or the follow
  head alone. The boost is the candidate's predicted follow probability in a typical view's units; the
  oracle, a reference line and no policy, the world's own expected follow of the candidate in the same
  units (`ExpectedFollowTerm`), which no ranker knows: how far a follow term gets that knows each
  candidate's chance exactly (`bench/follow_ceiling.py` maps that edge on a finer grid). Each
  weight is the grid point with the most follows that breaks nothing against TSCAC alone on a tuning
  world, with a margin: the next larger grid point breaks nothing either (a weight next to the edge on
  one world is past it on the next; none holding: the smallest); the headline user-author term is the
  one of the two with more follows there.
- **Evaluation.** One world per training seed, never used for training or tuning; every policy on the same
  episode draws for the days; per user, each signal's total over the days from expected responses (a
  user kept away a day adds nothing that day). Pooled over the worlds, paired per user against TSCAC
  alone: 'holds' means no auxiliary constraint and not watch time has its 95% interval below TSCAC's.
- **Author side.** Authors who gained at least one follower in the days; the Gini coefficient of video
  impressions over every author (0: even exposure), its change against TSCAC alone in points; and the
  pairs' returns per user (a pair that meets on k of the days returns k - 1 times, the pair surface's
  author_return), paired per user against TSCAC alone like the signals, from the views as drawn.
"""


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "user_author")
    parser.add_argument("--docs", help="also write the tables as Markdown to this file")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    commit = git_commit()
    seeds = settings["seeds"]
    runs = {
        "tscac": {"algo": "tscac", "steps": settings["steps"]},
        "ua-mtcl": {"algo": "ua-mtcl", "steps": settings["critic_steps"]},
    }
    with worker_pool() as workers, tempfile.TemporaryDirectory() as work:
        with logged_dataset(
            work, users=settings["users"], days=settings["days"], seed=args.seed, user_author_surface=True
        ) as built:
            trained = train_runs(built.dataset_dir, work, runs, seeds, workers)
            surface = open_dataset(built.dataset_dir, USER_AUTHOR)
            pairs = PairTransitions.from_dataset(surface)
            replayed = replayed_returns(
                surface, pairs, users=settings["users"], days=settings["days"], seed=args.seed
            )
        tscac = trained.policy_dirs["tscac"]
        terms = {
            name: [Term(name, critic, heads) for critic in trained.policy_dirs["ua-mtcl"]]
            for name, heads in HEADS.items()
        }
        terms |= {name: [Term(name) for _ in seeds] for name in CRITIC_FREE_TERMS}
        size = {"users": settings["eval_users"], "days": settings["eval_days"]}
        tune = TUNE_WORLD + args.seed
        worlds = evaluation_worlds(args.seed, len(seeds))
        shares = (*settings["fewer_pairs"], 1.0)
        # the critics' errors at every share of the training pairs, and the terms' weights on the tuning
        # world (the first seed's policies): independent jobs
        done = workers.run(
            {
                **{
                    ("errors", share, seed): partial(
                        critic_errors, pairs, replayed, settings["critic_steps"], seed, share
                    )
                    for share in shares
                    for seed in seeds
                },
                ("tuning", "tscac"): partial(ranked_run, tscac[0], None, 0.0, world=tune, **size),
                **{
                    ("tuning", name, weight): partial(
                        ranked_run, tscac[0], per_seed[0], weight, world=tune, **size
                    )
                    for name, per_seed in terms.items()
                    for weight in WEIGHTS[name]
                },
            }
        )
        weights = {
            name: choose_weight(
                done["tuning", "tscac"].values,
                {weight: done["tuning", name, weight].values for weight in WEIGHTS[name]},
            )
            for name in terms
        }
        evaluated = workers.run(
            {
                **{
                    ("tscac", i): partial(ranked_run, p, None, 0.0, world=w, **size)
                    for i, (p, w) in enumerate(zip(tscac, worlds, strict=True))
                },
                **{
                    (name, i): partial(ranked_run, p, term, weights[name]["weight"], world=w, **size)
                    for name, per_seed in terms.items()
                    for i, (p, term, w) in enumerate(zip(tscac, per_seed, worlds, strict=True))
                },
            }
        )
        errors = [done["errors", 1.0, seed] for seed in seeds]
        by_share = {share: [done["errors", share, seed] for seed in seeds] for share in shares}
        reference = [evaluated["tscac", i] for i, _ in enumerate(seeds)]
        summaries = {
            name: {
                "weight": weights[name],
                **term_summary(reference, [evaluated[name, i] for i, _ in enumerate(seeds)]),
            }
            for name in terms
        }
    per_head = {
        s: {
            **errors_summary(errors, s),
            "expected_returns": errors_summary([e["expected_returns"] for e in errors], s),
        }
        for s in signals.PAIR_SIGNALS
    }
    for s in signals.PAIR_SIGNALS:
        per_head[s]["mean_value"] = {
            k: statistics.fmean(e["mean_value"][k][s] for e in errors) for k in errors[0]["mean_value"]
        }
    for s in _DRAWN:
        shares = [e["noise_share"][s] for e in errors]
        per_head[s]["noise_share"] = statistics.fmean(shares)
        # luck above the mean's whole error (a sampling accident) leaves nothing to cut
        per_head[s]["best_reduction_over_mean"] = statistics.fmean(
            max(0.0, 1.0 - math.sqrt(share)) for share in shares
        )
    result: dict[str, Any] = {
        "benchmark": "user_author",
        "commit": commit,
        "mode": args.mode,
        "seed": args.seed,
        "config": {
            **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
            "weights": WEIGHTS,
            "tune_world": TUNE_WORLD + args.seed,
            "eval_world_seeds": worlds,
            "pair_rows": len(pairs.states),
            "pairs": int(pairs.pairs.max() + 1),
            "feed_rows": built.manifest["surfaces"]["feed"]["rows"],
            "dataset_version": built.manifest["version"],
        },
        "mtcl": {
            "per_seed": errors,
            "per_head": per_head,
            "held_out_rows": errors[0]["held_out_rows"],
            "by_training_share": [
                {"share": share, **fewer_pairs_summary(e)} for share, e in sorted(by_share.items())
            ],
            "calibration_by_days_to_cut_off": calibration_by_days(errors),
        },
        "mtcl_error_reduction": statistics.fmean(per_head[s]["reduction"]["mean"] for s in SPARSE_HEADS),
        "mtcl_error_reduction_on_expected_returns": statistics.fmean(
            per_head[s]["expected_returns"]["reduction"]["mean"] for s in SPARSE_HEADS
        ),
        "terms": summaries,
        "headline_term": (headline := headline_term(weights)),
        "follow_lift_over_tscac": summaries[headline]["follow_lift"],
        "author_gini_delta": summaries[headline]["gini_delta_points"],
        "pair_return_lift_over_tscac": summaries[headline]["pair_returns"]["lift"],
        "train_seconds": trained.train_seconds,
    }
    result["wall_s"] = time.perf_counter() - started
    write_result(args.out, result)
    if args.docs:
        Path(args.docs).parent.mkdir(parents=True, exist_ok=True)
        Path(args.docs).write_text(markdown(result))
    print(
        f"user-author ({headline}): follows {100 * result['follow_lift_over_tscac']:+.2f}% over TSCAC "
        f"(holds {summaries[headline]['holds_pooled']}), boost "
        f"{100 * summaries['follow-boost']['follow_lift']:+.2f}%; "
        f"MTCL error reduction {100 * result['mtcl_error_reduction']:+.1f}%; Gini delta "
        f"{result['author_gini_delta']:+.2f} points; {result['wall_s']:.0f} s; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
