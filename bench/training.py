"""Benchmark: TSCAC training in transitions per second at batch 512 (target: at least 20,000).

The dataset is built the production way (simulated traffic -> embedded Kafka -> the Beam pipeline), and
each step is what ``recsys_rl.training.train`` runs: the compiled ``agent.train`` on the next batch of the
tf.data reader, with the loss read back every step. Stage one (six auxiliary actors) and stage two (the
main actor) are timed separately after warm-up (tracing); the headline figure is the rate of a whole run
with the default ``stage_one_fraction``.

Baselines, timed in the same run on the same data and networks: behaviour cloning (the cheapest agent,
one actor and no critic) and the bare reader (batches per second x 512), the ceiling of any trainer.

    python bench/training.py --quick --out bench/results/training.json
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
import tensorflow as tf
from common import bench_parser, repeat_rate, write_result

from recsys_rl.kafka import open_broker
from recsys_rl.pipelines.simulated import simulated_dataset
from recsys_rl.training.agents.base import AgentConfig, FeedAgent
from recsys_rl.training.agents.data import (
    TransitionDataset,
    open_dataset,
    read_transitions,
    transition_statistics,
)
from recsys_rl.training.agents.factory import build_agent
from recsys_rl.training.train import TrainConfig, compiled_train_step, training_strategy

TARGET_TRANSITIONS_PER_S = 20_000
BATCH_SIZE = 512
# steps: timed steps per repeat and stage. full: a 3000-user dataset (about 18k transitions, 35 batches)
# and enough steps that a repeat takes seconds, well past the per-call overheads.
MODES = {
    "quick": {"users": 300, "steps": 20, "repeats": 2},
    "full": {"users": 3_000, "steps": 200, "repeats": 5},
}
STAGE_ONE_FRACTION = next(
    f.default for f in dataclasses.fields(TrainConfig) if f.name == "stage_one_fraction"
)


def build_dataset(users: int, seed: int, out: str) -> TransitionDataset:
    with open_broker(None, "embedded") as broker:
        result = simulated_dataset(broker.bootstrap_servers, out, users=users, seed=seed)
    return open_dataset(result.dataset_dir)


def training_rate(
    agent: FeedAgent, dataset: TransitionDataset, step: int, steps: int, repeats: int, seed: int
) -> dict:
    """Transitions per second of ``agent``'s training step at global ``step`` (which sets TSCAC's stage)."""
    iterator = iter(read_transitions(dataset, BATCH_SIZE, seed=seed))
    train_step = compiled_train_step(training_strategy(), agent)  # exactly the job's step
    kwargs = agent.train_kwargs(step)
    float(train_step(next(iterator), **kwargs)[0])  # warm-up: tracing and the first run

    def work() -> int:
        for _ in range(steps):
            float(train_step(next(iterator), **kwargs)[0])  # the training loop checks every loss
        return steps * BATCH_SIZE

    return repeat_rate(work, repeats)


def reader_rate(dataset: TransitionDataset, steps: int, repeats: int, seed: int) -> dict:
    iterator = iter(read_transitions(dataset, BATCH_SIZE, seed=seed))
    next(iterator)  # warm-up: the shuffle buffer's first fill

    def work() -> int:
        for _ in range(steps):
            next(iterator)
        return steps * BATCH_SIZE

    return repeat_rate(work, repeats)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "training")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        dataset = build_dataset(settings["users"], args.seed, out)
        built_s = time.perf_counter() - started
        # as recsys_rl.training.train does: seeded, deterministic ops
        tf.keras.utils.set_random_seed(args.seed)
        tf.config.experimental.enable_op_determinism()
        stats = transition_statistics(dataset)
        config = AgentConfig()
        timing = {"steps": settings["steps"], "repeats": settings["repeats"], "seed": args.seed}
        tscac = build_agent("tscac", stats, config, stage_one_steps=1)
        stage_one = training_rate(tscac, dataset, step=0, **timing)
        stage_two = training_rate(tscac, dataset, step=1, **timing)
        bc = training_rate(build_agent("bc", stats, config, stage_one_steps=0), dataset, step=0, **timing)
        reader = reader_rate(dataset, **timing)
    # a run spends STAGE_ONE_FRACTION of its steps in stage one: its rate is the steps' harmonic mean
    overall = 1.0 / (STAGE_ONE_FRACTION / stage_one["value"] + (1 - STAGE_ONE_FRACTION) / stage_two["value"])
    result = {
        "benchmark": "training",
        "mode": args.mode,
        "seed": args.seed,
        "config": {
            "users": settings["users"],
            "rows": dataset.rows,
            "batch_size": BATCH_SIZE,
            "steps_per_repeat": settings["steps"],
            "repeats": settings["repeats"],
            "stage_one_fraction": STAGE_ONE_FRACTION,
            "agent": dataclasses.asdict(config),
            "device": "GPU" if tf.config.list_physical_devices("GPU") else "CPU",
            "dataset_build_s": built_s,
        },
        "transitions_per_s": overall,
        "bc_transitions_per_s": bc["value"],
        "reader_transitions_per_s": reader["value"],
        "metrics": {
            "tscac_stage_one_transitions_per_s": stage_one,
            "tscac_stage_two_transitions_per_s": stage_two,
            "bc_transitions_per_s": bc,
            "reader_transitions_per_s": reader,
            "ratio_to_bc": overall / bc["value"],
            "ratio_to_reader": overall / reader["value"],
        },
        # wide bounds: one shared 2-core machine; only the lower target is a goal
        "targets": {"transitions_per_s": {"min": TARGET_TRANSITIONS_PER_S, "max": None}},
        "meets_targets": overall >= TARGET_TRANSITIONS_PER_S,
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    verdict = "met" if result["meets_targets"] else "NOT met"
    print(
        f"training: tscac {overall:,.0f} transitions/s at batch {BATCH_SIZE} "
        f"(stage one {stage_one['value']:,.0f}, stage two {stage_two['value']:,.0f}); "
        f"bc {bc['value']:,.0f}/s; reader {reader['value']:,.0f}/s; ratio to bc "
        f"{result['metrics']['ratio_to_bc']:.2f}; target >= {TARGET_TRANSITIONS_PER_S:,} -> {verdict}; "
        f"wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
