"""Benchmark: does each TSCAC stage-one actor raise its own signal on the simulated world (issue 16)?

TSCAC's stage two keeps the main actor close to one stage-one actor per auxiliary signal, each trained
to maximise that signal under its own critic head; if a stage-one actor does not move its signal, the
constraint it stands for is not what stage two is anchored to. This trains stage one alone, the
production agent on the pipeline-built logs of the behaviour policy (bench/trained.py), then runs each
stage-one actor's mean for a day on an evaluation world the training never saw, paired per user against
the behaviour policy on the same draws, from expected responses (recsys_rl.sim.ground_truth).

An actor raises its signal when the paired difference is beyond 1.96 standard errors in the signal's good
direction (hate: down). Reported per seed, with the watch-time lift beside it, and
``every_actor_raises_its_signal``: every actor, on every seed. ``--discount 0`` makes every critic head
myopic, which tells whether an actor misses its signal by chasing the session's continuation.

Each seed trains twice on the same logs: with the rewards clients reported (``logged``) and with the
upstream model's predictions of the viewed items (``predicted``, ``pipelines.episodes``). A sparse
signal's draws are nearly all zero, and how a fusion weight moves its rate is a few percent of it: on
logs of 20,000 users over two days a regression of the page's drawn follows, comments, shares or hates on
the logged action's exploration finds no own effect beyond two standard errors (``identifiability``), so
a critic cannot learn one either; the predictions carry it without the draws' noise.
``rewards_compared`` reports both.

    python bench/stage_one_actors.py --full --out bench/results/stage_one_actors.json
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np
from common import bench_parser, git_commit, write_result
from trained import evaluation_worlds, logged_dataset

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
import tensorflow as tf

from recsys_rl import signals
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.ground_truth import PolicyValues, monte_carlo_values
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.sim_eval import compare_values
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.data import (
    REWARD_SOURCES,
    open_dataset,
    read_transitions,
    surface_arrays,
    transition_statistics,
)
from recsys_rl.training.agents.factory import build_agent
from recsys_rl.training.agents.tscac import AUXILIARY, STAGE_ONE

MODES = {
    "quick": {"users": 400, "days": 1, "steps": 100, "batch_size": 256, "eval_users": 1_500, "seeds": [0]},
    "full": {
        "users": 20_000,
        "days": 2,
        "steps": 3_000,
        "batch_size": 256,
        "eval_users": 50_000,
        "seeds": [0, 1, 2],
    },
}
Z = 1.96


class ActorMean:
    """A stage-one actor's mean as a simulator feed policy (the mode, as the benchmarks evaluate)."""

    def __init__(self, actor, version: str) -> None:
        self._actor = actor
        self.version = version

    def act(self, states: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        mean, _ = self._actor.mean_and_std(tf.constant(states, tf.float32))
        mean = mean.numpy().astype(np.float64)
        return mean, np.zeros(mean.shape[0])


def identifiability(dataset, rewards: str) -> dict:
    """How well the logs show each signal's own fusion weight moving it: the least-squares effect of the
    logged action's exploration (its distance from the behaviour policy's mean) on each signal's page
    total, with the state and an intercept, as a share of the signal's mean per exploration standard
    deviation, and its z. A critic cannot learn an effect the logs do not show beyond their noise."""
    states, totals, actions = surface_arrays(dataset, rewards=rewards)
    behaviour = behaviour_feed_policy()
    design = np.column_stack([np.ones(len(states)), actions - behaviour.mean(states), states])
    coef, *_ = np.linalg.lstsq(design, totals, rcond=None)
    residual_var = ((totals - design @ coef) ** 2).sum(axis=0) / (len(states) - np.linalg.matrix_rank(design))
    inverse = np.linalg.pinv(design.T @ design)
    out = {}
    for k, name in enumerate(FEED_ACTION_NAMES):
        effect = coef[1 + k, k]
        stderr = np.sqrt(inverse[1 + k, 1 + k] * residual_var[k])
        sigma = float(behaviour.sigma[k])
        out[name] = {
            "effect_per_sigma": float(sigma * effect / totals[:, k].mean()),
            "z": float(effect / stderr),
        }
    return out


def stage_one_actors(
    dataset, settings: dict, seed: int, config: AgentConfig, rewards: str
) -> tuple[list, float]:
    """The stage-one actors after ``settings['steps']`` stage-one steps on ``rewards``, and the seconds it
    took."""
    tf.config.experimental.enable_op_determinism()  # as training jobs run: the same seed, the same actors
    tf.random.set_seed(seed)
    stats = transition_statistics(dataset, rewards=rewards)
    agent = build_agent("tscac", stats, config, stage_one_steps=settings["steps"])
    step = tf.function(lambda batch: agent.train(batch, stage=STAGE_ONE), autograph=False)
    batches = iter(read_transitions(dataset, settings["batch_size"], seed=seed, rewards=rewards))
    started = time.perf_counter()
    for _ in range(settings["steps"]):
        step(next(batches))
    return list(agent.aux_actors), time.perf_counter() - started


def verdict(behaviour: PolicyValues, actor: ActorMean, values) -> dict:
    """The actor's own signal and watch time against the behaviour policy, paired per user."""
    report = compare_values(behaviour, values(actor))
    name = actor.version.removeprefix("stage-one-")
    own, watch = report["signals"][name], report["signals"]["watch_time"]
    sign = signals.get(name).direction.sign
    return {
        "own_lift": own["lift"],
        "own_difference": own["difference"],
        "own_difference_stderr": own["difference_stderr"],
        "raised": sign * own["difference"] > Z * own["difference_stderr"],
        "watch_time_lift": watch["lift"],
        "lifts": {s: report["signals"][s]["lift"] for s in signals.FEED_SIGNALS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "stage_one_actors")
    parser.add_argument(
        "--discount", type=float, help="one discount for every critic head (default: each signal's)"
    )
    args = parser.parse_args(argv)
    agent_config = AgentConfig(discount=args.discount)
    settings = MODES[args.mode]
    started, commit = time.perf_counter(), git_commit()
    world = evaluation_worlds(args.seed, 1)[0]

    def values(policy) -> PolicyValues:
        config = SimConfig(n_users=settings["eval_users"])
        return monte_carlo_values(config, policy, behaviour_allocation_policy(), seed=world, days=1)

    with (
        tempfile.TemporaryDirectory() as work,
        logged_dataset(work, users=settings["users"], days=settings["days"], seed=args.seed) as built,
    ):
        dataset = open_dataset(built.dataset_dir)
        shown = {rewards: identifiability(dataset, rewards) for rewards in REWARD_SOURCES}
        trained = {
            (rewards, seed): stage_one_actors(dataset, settings, seed, agent_config, rewards)
            for rewards in REWARD_SOURCES
            for seed in settings["seeds"]
        }
    behaviour = values(behaviour_feed_policy())
    compared = {}
    for rewards in REWARD_SOURCES:
        per_seed = {}
        for seed in settings["seeds"]:
            actors, seconds = trained[rewards, seed]
            verdicts = {
                name: verdict(behaviour, ActorMean(actor, f"stage-one-{name}"), values)
                for name, actor in zip(AUXILIARY, actors, strict=True)
            }
            per_seed[str(seed)] = {"train_seconds": seconds, "actors": verdicts}
        raised = {
            name: [per_seed[str(s)]["actors"][name]["raised"] for s in settings["seeds"]]
            for name in AUXILIARY
        }
        compared[rewards] = {
            "identifiability": shown[rewards],
            "per_seed": per_seed,
            "raised_own_signal": raised,
            "every_actor_raises_its_signal": all(all(r) for r in raised.values()),
        }
    result = {
        "benchmark": "stage_one_actors",
        "mode": args.mode,
        "seed": args.seed,
        "commit": commit,
        "config": {
            **settings,
            "discount": args.discount,
            "evaluation_world": world,
            "eval_days": 1,
            "interval_z": Z,
        },
        "rewards_compared": compared,
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    for rewards, outcome in compared.items():
        fit = ", ".join(
            f"{n} {v['effect_per_sigma']:+.1%} (z {v['z']:+.1f})"
            for n, v in outcome["identifiability"].items()
        )
        print(f"{rewards} rewards: each signal's own weight in the logs, per exploration sd: {fit}")
        for name in AUXILIARY:
            lifts = ", ".join(
                f"{100 * outcome['per_seed'][str(s)]['actors'][name]['own_lift']:+.2f}%"
                for s in settings["seeds"]
            )
            raised = outcome["raised_own_signal"][name]
            print(
                f"{rewards} rewards, stage-one {name:8s} actor: own signal {lifts} (beyond {Z} SE: {raised})"
            )
        print(f"{rewards} rewards: every actor raises its signal: {outcome['every_actor_raises_its_signal']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
