"""The quality benchmarks' common first half: simulated logs through Kafka and Beam, then training runs.

Both ``policy_quality.py`` and ``allocation_quality.py`` judge policies trained the production way on one
dataset of behaviour-policy logs; this builds the dataset and trains every named run with every seed.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads

# isort: split
from workers import Workers

from recsys_rl.kafka import open_broker
from recsys_rl.pipelines.simulated import simulated_dataset
from recsys_rl.training.train import TrainConfig, train

#: TrainConfig's agent sections, given to ``train_runs`` as mappings of their fields.
_AGENT_SECTIONS = ("agent", "allocation", "pair")

#: The first evaluation world: the training logs use --seed, the evaluation worlds EVAL_WORLD + --seed + i,
#: so that no policy is judged on the world it was trained on.
EVAL_WORLD = 2_000


def evaluation_worlds(seed: int, count: int) -> list[int]:
    """The seeds of the ``count`` evaluation worlds of a benchmark run with ``--seed seed``."""
    return [EVAL_WORLD + seed + i for i in range(count)]


@dataclass
class TrainedRuns:
    """Per run label, one entry per seed, in the seeds' order."""

    policy_dirs: dict[str, list[Path]]
    train_seconds: dict[str, list[float]]
    final_metrics: dict[str, list[dict[str, float]]]

    def merged(self, later: TrainedRuns, renamed: Mapping[str, str]) -> TrainedRuns:
        """These runs and ``later``'s in one record, the labels in ``renamed`` renamed: a benchmark that
        chooses a setting from a sweep (TSCAC's lambda, SL-MGAC's anti-greedy weight) and then trains the
        rest at it reports the chosen sweep point under the algorithm's own name."""

        def merge(field: str) -> dict[str, Any]:
            both = {**getattr(self, field), **getattr(later, field)}
            return {renamed.get(label, label): value for label, value in both.items()}

        return TrainedRuns(merge("policy_dirs"), merge("train_seconds"), merge("final_metrics"))


@contextmanager
def logged_dataset(work: str | Path, *, users: int, days: int, seed: int, user_author_surface: bool = False):
    """The behaviour policies' logs of ``users`` x ``days`` on world ``seed``, built by the pipeline on an
    embedded broker (with the user-author surface when asked); the build result (dataset directory and
    manifest) while the broker is up."""
    started = time.perf_counter()
    with open_broker(None, "embedded") as broker:
        built = simulated_dataset(
            broker.bootstrap_servers,
            f"{work}/data",
            users=users,
            days=days,
            seed=seed,
            user_author_surface=user_author_surface,
        )
        print(f"dataset built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        yield built


def train_runs(
    dataset_dir: Path,
    work: str | Path,
    runs: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    workers: Workers,
) -> TrainedRuns:
    """Train every run (a label and its TrainConfig fields, an agent section such as ``agent`` or
    ``pair`` as a mapping of its fields, ``seeds`` to train fewer than all) once per seed on
    ``dataset_dir``; seeds outermost.

    The runs train side by side in the ``workers`` (one a core), each with one TensorFlow thread: these
    networks are too small for TensorFlow's thread pools to keep two cores busy (a run used 1.2 of the 2
    here), so two one-thread runs at once finish 1.4 times as many steps a second as one run on both.
    Op determinism makes a run's result the same on any number of threads. A run's ``train_seconds``
    are therefore with other jobs beside it.
    """
    planned = []
    for seed in seeds:
        for label, fields_ in runs.items():
            settings = dict(fields_)
            if seed not in settings.pop("seeds", seeds):
                continue
            sections = {k: v for k, v in settings.items() if k in _AGENT_SECTIONS}
            config = TrainConfig(
                data=str(dataset_dir),
                out=str(Path(work) / f"{label}-s{seed}"),
                seed=seed,
                **{k: v for k, v in settings.items() if k not in sections},
            )
            config = dataclasses.replace(
                config,
                **{k: dataclasses.replace(getattr(config, k), **v) for k, v in sections.items()},
            )
            planned.append((label, config))
    out = TrainedRuns({k: [] for k in runs}, {k: [] for k in runs}, {k: [] for k in runs})
    for (label, config), (seconds, final_metrics) in zip(
        planned, workers.map(_timed_train, (config for _, config in planned)), strict=True
    ):
        out.train_seconds[label].append(seconds)
        out.final_metrics[label].append(final_metrics)
        out.policy_dirs[label].append(Path(config.out) / "policy")
        print(f"trained {label} seed {config.seed} in {seconds:.0f} s", file=sys.stderr)
    return out


def _timed_train(config: TrainConfig) -> tuple[float, dict[str, float]]:
    started = time.perf_counter()
    result = train(config)
    return time.perf_counter() - started, result.manifest["final_metrics"]
