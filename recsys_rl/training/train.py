"""``recsys-rl train``: one training run of an agent on a transition dataset, into a run directory.

Its command-line side is ``recsys_rl.cli.train``; this module does the work.

The algorithm decides the surface (``recsys_rl.training.agents.algorithms.surface_of``): feed agents read the
dataset's ``feed`` transitions and export a feed policy, allocation agents (SL-MGAC and its variants)
read its ``live_allocation`` transitions and export an allocation policy, and the user-author critics
(``ua-mtcl``, ``ua-independent``) read its ``user_author`` transitions and export the pair values that
serving's ranking term reads; the rest is the same.

A run directory holds everything needed to trust, resume and ship the run:

    RUN/config.yaml          the resolved config (a rerun with another config is refused)
    RUN/input_manifest.json  the dataset manifest it read
    RUN/statistics.json      the normalisation moments baked into the networks
    RUN/tensorboard/         TensorBoard scalars, and the hyperparameters for the HParams tab
    RUN/metrics.jsonl        the same scalars as JSON lines, every ``log_every`` steps
    RUN/checkpoints/         agent, optimisers, step and data iterator, every ``checkpoint_every`` steps
    RUN/policy/              the exported policy (``recsys_rl.training.agents.policy_io``)
    RUN/manifest.json        written last and atomically: the run is complete when it exists

A killed run started again with the same config resumes from its last checkpoint, data iterator
included, so it ends where an uninterrupted run would have (bit for bit on CPU, where ops are made
deterministic). A non-finite loss stops the run with the names of the losses that broke.

Several machines train one run under ``tf.distribute.MultiWorkerMirroredStrategy`` when ``TF_CONFIG``
names more than one worker (``recsys-rl train --workers`` writes it): every worker runs this same
function with the same config and ``out`` on storage they share. The chief (worker 0) writes the run
directory; the others write their checkpoints and exported policy to scratch space they delete, since
saving takes part in the workers' collective operations, and restore from the chief's checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf
import yaml
from tf_agents.utils import common

from recsys_rl.atomic_json import write_json_atomic
from recsys_rl.config import ConfigError
from recsys_rl.errors import OperationalError
from recsys_rl.training.agents.algorithms import (
    ALL_ALGORITHMS,
    FEED,
    LIVE_ALLOCATION,
    USER_AUTHOR,
    surface_of,
)
from recsys_rl.training.agents.allocation import AllocationConfig
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.data import (
    REWARD_SOURCES,
    TransitionStatistics,
    open_dataset,
    read_transitions,
    transition_statistics,
)
from recsys_rl.training.agents.factory import build_agent, build_allocation_agent, build_pair_value_agent
from recsys_rl.training.agents.policy_io import (
    export_allocation_policy,
    export_pair_value_policy,
    export_policy,
)
from recsys_rl.training.hparams import write_hparams
from recsys_rl.training.pair_value import PairValueConfig

RUN_MANIFEST = "manifest.json"
RUN_SCHEMA_VERSION = 1


class TrainingDivergedError(OperationalError):
    """A loss became NaN or infinite."""


class RunDirectoryError(OperationalError):
    """The run directory belongs to a different run."""


@dataclass(frozen=True)
class TrainConfig:
    algo: str = "tscac"
    data: str = ""  # transition dataset directory (one version, with manifest.json)
    out: str = ""  # run directory
    steps: int = 3000
    batch_size: int = 512
    seed: int = 0
    stage_one_fraction: float = 0.5  # TSCAC: share of the steps spent on stage one
    checkpoint_every: int = 500
    log_every: int = 100
    shuffle_buffer: int = 65_536
    # What the critics learn from (``agents.data.REWARD_SOURCES``): "logged", the responses clients
    # reported; "predicted", the upstream model's predictions of the viewed items, the expectation those
    # responses are drawn around (bench/stage_one_actors.py measures what each teaches TSCAC's stage one).
    rewards: str = "logged"
    # Devices to mirror the model over (e.g. ["/gpu:0", "/gpu:1"]); empty: every GPU when there are
    # several, else the one device TensorFlow picks (a GPU if present, the CPU otherwise).
    devices: tuple[str, ...] = ()
    agent: AgentConfig = field(default_factory=AgentConfig)  # feed agents
    allocation: AllocationConfig = field(default_factory=AllocationConfig)  # live-allocation agents
    pair: PairValueConfig = field(default_factory=PairValueConfig)  # user-author critics

    def __post_init__(self) -> None:
        if self.algo not in ALL_ALGORITHMS:
            raise ValueError(f"algo should be one of {sorted(ALL_ALGORITHMS)}, but is {self.algo!r}")
        for name in ("data", "out"):
            if not getattr(self, name):
                raise ValueError(f"{name} is required")
        for name in ("steps", "batch_size", "checkpoint_every", "log_every", "shuffle_buffer"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be at least 1, but is {getattr(self, name)}")
        if not 0.0 <= self.stage_one_fraction < 1.0:
            raise ValueError(f"stage_one_fraction should be in [0, 1), but is {self.stage_one_fraction}")
        if self.rewards not in REWARD_SOURCES:
            raise ValueError(f"rewards should be one of {list(REWARD_SOURCES)}, but is {self.rewards!r}")

    @property
    def surface(self) -> str:
        return surface_of(self.algo)

    @property
    def stage_one_steps(self) -> int:
        return round(self.steps * self.stage_one_fraction)

    def to_dict(self) -> dict[str, Any]:
        """The config as the run directory records it: only the agent section of the algorithm's surface
        (so a feed run's record is what it was before allocation agents existed)."""
        data = json.loads(json.dumps(dataclasses.asdict(self)))  # tuples as lists, like the YAML
        for surface, section in _AGENT_SECTIONS.items():
            if surface != self.surface:
                del data[section]
        return data


#: Each surface's agent section of ``TrainConfig``.
_AGENT_SECTIONS = {FEED: "agent", LIVE_ALLOCATION: "allocation", USER_AUTHOR: "pair"}


@dataclass(frozen=True)
class Workers:
    """This process's place among the run's training workers, from ``TF_CONFIG``: one, unless it names
    several."""

    count: int = 1
    index: int = 0

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @classmethod
    def from_environment(cls) -> Workers:
        raw = os.environ.get(TF_CONFIG, "")
        if not raw.strip():
            return cls()
        try:
            tf_config = json.loads(raw)
            addresses = tf_config.get("cluster", {}).get("worker", [])
            task = tf_config.get("task", {})
            task_type, index = task.get("type", "worker"), int(task.get("index", 0))
        except (ValueError, AttributeError, TypeError) as exc:
            raise ConfigError(
                f"{TF_CONFIG} should be JSON like {TF_CONFIG_EXAMPLE}, but is {raw[:200]!r}: {exc}"
            ) from None
        roles = set(tf_config.get("cluster", {})) - {"worker"}
        if roles or task_type != "worker":
            raise ConfigError(
                f"{TF_CONFIG} should name workers only (MultiWorkerMirroredStrategy, worker 0 the chief), "
                f"but names {sorted(roles | {task_type} - {'worker'})}"
            )
        if not addresses or not 0 <= index < len(addresses):
            raise ConfigError(f"{TF_CONFIG} task index {index} is not one of its {len(addresses)} workers")
        return cls(count=len(addresses), index=index)


TF_CONFIG = "TF_CONFIG"
TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}'
)


def tf_config_for(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of a run trained by the workers at ``addresses``."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


@dataclass
class TrainResult:
    run_dir: Path
    manifest: dict[str, Any]
    resumed_from_step: int
    already_complete: bool


def train(
    config: TrainConfig,
    progress: Callable[[str, dict[str, Any]], None] = lambda event, fields: None,
) -> TrainResult:
    run_dir = Path(config.out)
    manifest_path = run_dir / RUN_MANIFEST
    workers = Workers.from_environment()
    # before claiming the directory: a bad --data must not lock it
    dataset = open_dataset(config.data, config.surface)
    if workers.is_chief:
        _claim_run_dir(run_dir, config)
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        return TrainResult(run_dir, manifest, int(manifest["steps"]), already_complete=True)
    # the chief's run directory, or scratch space for what another worker must save but nobody reads
    out_dir = (
        run_dir if workers.is_chief else Path(tempfile.mkdtemp(prefix=f"recsys-rl-worker{workers.index}-"))
    )
    try:
        return _train(config, dataset, workers, out_dir, progress)
    finally:
        if not workers.is_chief:
            shutil.rmtree(out_dir, ignore_errors=True)


def _train(config: TrainConfig, dataset, workers: Workers, out_dir: Path, progress) -> TrainResult:
    run_dir = Path(config.out)
    # first: a multi-worker strategy configures collective operations, which must happen before
    # TensorFlow runs anything
    strategy = training_strategy(config.devices, workers)
    replicas = strategy.num_replicas_in_sync
    if config.batch_size % replicas:
        raise ConfigError(f"batch_size {config.batch_size} does not split evenly over {replicas} replicas")
    tf.keras.utils.set_random_seed(config.seed)
    tf.config.experimental.enable_op_determinism()
    stats = transition_statistics(dataset, rewards=config.rewards)
    write_json_atomic(out_dir / "input_manifest.json", dataset.manifest)
    write_json_atomic(out_dir / "statistics.json", stats.to_dict())

    with strategy.scope():
        agent = _new_agent(config, stats)
    # Every worker reads the whole batch and trains on its replicas' shares (`compiled_train_step`):
    # the iterator stays a plain, checkpointable tf.data one, and a step is the one-worker step.
    batches = read_transitions(
        dataset,
        config.batch_size,
        seed=config.seed,
        shuffle_buffer=config.shuffle_buffer,
        rewards=config.rewards,
    )
    iterator = iter(batches)  # a plain tf.data iterator: checkpointable, unlike a distributed one
    checkpoint = tf.train.Checkpoint(agent=agent, iterator=iterator)
    manager = tf.train.CheckpointManager(checkpoint, str(out_dir / "checkpoints"), max_to_keep=2)
    # every worker resumes from the chief's checkpoints (its data iterator is the same on all of them)
    if latest := tf.train.latest_checkpoint(str(run_dir / "checkpoints")):
        checkpoint.restore(latest).assert_existing_objects_matched()
    start = int(agent.train_step_counter.numpy())
    progress("started", {"algo": config.algo, "step": start, "of": config.steps, "rows": dataset.rows})

    train_step = compiled_train_step(strategy, agent)
    writer = tf.summary.create_file_writer(str(out_dir / "tensorboard"))
    write_hparams(writer, config, dataset.manifest["version"])
    metrics_path = out_dir / "metrics.jsonl"
    _drop_metrics_after(metrics_path, start)  # steps a killed run logged past its last checkpoint
    window_start, window_steps = time.perf_counter(), 0
    last: dict[str, float] = _last_metrics(metrics_path)
    traced: set[tuple] = set()
    for step in range(start, config.steps):
        kwargs = agent.train_kwargs(step)
        loss, extra = train_step(next(iterator), **kwargs)
        window_steps += 1
        if tuple(sorted(kwargs.items())) not in traced:  # a step that traced: keep it out of the rate
            traced.add(tuple(sorted(kwargs.items())))
            window_start, window_steps = time.perf_counter(), 0
        loss = float(loss)
        if not math.isfinite(loss):
            broken = sorted(k for k, v in extra.items() if not math.isfinite(float(v)))
            raise TrainingDivergedError(
                f"{config.algo}: loss became {loss} at step {step + 1} (non-finite: {broken or ['total']}); "
                f"the last checkpoint is {manager.latest_checkpoint or 'none'}. Lower the learning rates or "
                f"check the dataset's rewards"
            )
        done = step + 1
        if done % config.log_every == 0 or done == config.steps:
            elapsed = time.perf_counter() - window_start
            last = {"loss": loss, **{k: float(v) for k, v in extra.items()}}
            if window_steps:
                last["transitions_per_s"] = window_steps * config.batch_size / elapsed
            _log_metrics(writer, metrics_path, done, last)
            # the loss and the speed on the line; every metric in metrics.jsonl, which the line names
            headline = {k: round(last[k], 4) for k in ("loss", "transitions_per_s") if k in last}
            progress("step", {"step": done, "of": config.steps, **headline, "metrics": str(metrics_path)})
            window_start, window_steps = time.perf_counter(), 0
        if done % config.checkpoint_every == 0 or done == config.steps:
            manager.save(checkpoint_number=done)
    writer.flush()

    policy_meta = {
        "algo": config.algo,
        "version": f"{config.algo}-{dataset.manifest['version']}-s{config.seed}",
    }
    exporter = {
        FEED: export_policy,
        LIVE_ALLOCATION: export_allocation_policy,
        USER_AUTHOR: export_pair_value_policy,
    }[config.surface]
    policy_manifest = exporter(agent, out_dir / "policy", policy_meta)
    manifest = {
        "schema_version": RUN_SCHEMA_VERSION,
        "kind": "training_run",
        "algo": config.algo,
        "surface": config.surface,
        "steps": config.steps,
        "seed": config.seed,
        "workers": workers.count,
        "replicas": replicas,
        "dataset": {"path": str(Path(config.data).resolve()), "version": dataset.manifest["version"]},
        "final_metrics": last,
        "policy": {"path": "policy", "version": policy_meta["version"], "sha256": policy_manifest["sha256"]},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(out_dir / RUN_MANIFEST, manifest)
    progress("exported", {"policy": str(out_dir / "policy")})
    return TrainResult(run_dir, manifest, start, already_complete=False)


def _new_agent(config: TrainConfig, stats: TransitionStatistics):
    if config.surface == FEED:
        return build_agent(config.algo, stats, config.agent, stage_one_steps=config.stage_one_steps)
    if config.surface == USER_AUTHOR:
        return build_pair_value_agent(config.algo, stats, config.pair)
    return build_allocation_agent(config.algo, stats, config.allocation)


def training_strategy(devices: tuple[str, ...] = (), workers: Workers = Workers()) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over several workers; MirroredStrategy over ``devices``, or over every
    GPU when there are several; else the default."""
    if workers.count > 1:
        if devices:
            raise ConfigError(
                "devices cannot be chosen with several workers: each worker mirrors over its GPUs"
            )
        # across machines only collective all-reduces exist; inside one compiled step TensorFlow orders
        # the collectives the same way on every worker
        return tf.distribute.MultiWorkerMirroredStrategy()
    # The agents update several networks per step, each with its own optimiser; with collective
    # all-reduces the replicas could order those reductions differently and deadlock or mismatch, so
    # gradients are summed on one device instead (small networks: the copy is cheap).
    reduce_on_one = tf.distribute.ReductionToOneDevice()
    if devices:
        return tf.distribute.MirroredStrategy(list(devices), cross_device_ops=reduce_on_one)
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy(cross_device_ops=reduce_on_one)
    return tf.distribute.get_strategy()


def compiled_train_step(strategy: tf.distribute.Strategy, agent):
    """One compiled step: every replica trains on its share of the batch; losses averaged over replicas.

    With the default strategy this is the compiled ``agent.train`` on the whole batch.
    """

    def mean(value):
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)

    def step(batch, **kwargs):
        info = strategy.run(agent.train, args=(batch,), kwargs=kwargs)
        return mean(info.loss), {name: mean(value) for name, value in info.extra.items()}

    compiled = common.function(step, autograph=False)
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return compiled

    def split_and_step(batch, **kwargs):
        def share(context: tf.distribute.experimental.ValueContext):
            return tf.nest.map_structure(
                lambda t: tf.split(t, replicas)[context.replica_id_in_sync_group], batch
            )

        return compiled(strategy.experimental_distribute_values_from_function(share), **kwargs)

    return split_and_step


def _claim_run_dir(run_dir: Path, config: TrainConfig) -> None:
    """Create the run directory with its config, or check that an existing one is the same run."""
    config_path = run_dir / "config.yaml"
    wanted = {**config.to_dict(), "data": str(Path(config.data).resolve())}  # ./ds and ds are one dataset
    if config_path.exists():
        recorded = yaml.safe_load(config_path.read_text())
        if recorded != wanted:
            changed = sorted(k for k in set(recorded) | set(wanted) if recorded.get(k) != wanted.get(k))
            raise RunDirectoryError(
                f"{run_dir} holds a run with a different config (differs in {changed}); "
                f"use a new --out or the same config to resume"
            )
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = config_path.with_name(".config.yaml.tmp")
    tmp.write_text(yaml.safe_dump(wanted, sort_keys=True))
    os.replace(tmp, config_path)


def _log_metrics(writer, path: Path, step: int, values: dict[str, float]) -> None:
    with writer.as_default(step=step):
        for name, value in values.items():
            tf.summary.scalar(name, value)
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, **values}, sort_keys=True) + "\n")


def _last_metrics(path: Path) -> dict[str, float]:
    """The last logged metrics: what a run killed after its final checkpoint reports when it finishes."""
    if not path.exists() or not path.read_text().strip():
        return {}
    record = json.loads(path.read_text().splitlines()[-1])
    return {k: v for k, v in record.items() if k != "step"}


def _drop_metrics_after(path: Path, step: int) -> None:
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
