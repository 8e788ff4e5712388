"""A transition dataset as TF-Agents ``Transition`` batches, checked against its manifest first.

Training on a dataset that was built for other signals or another state layout would not fail: it would
silently learn the wrong thing. So the reader refuses a dataset whose manifest disagrees with what the
agents were built for (schema version, signal names, state feature names) or whose shards do not match
their recorded sha256, and says which.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf
from tf_agents.trajectories import policy_step, time_step, trajectory

from recsys_rl.atomic_json import read_json_file
from recsys_rl.dataset_contract import (
    DATASET_SIGNALS,
    MANIFEST,
    PREDICTED_REWARDS_SINCE,
    READABLE_DATASET_SCHEMA_VERSIONS,
    STATE_FEATURES,
    USER_AUTHOR,
)
from recsys_rl.errors import OperationalError
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.training.agents.specs import GAP_DAYS_KEY, LOG_PROPENSITY_KEY, TRUNCATED_KEY

FEED = "feed"
#: A feed action is one fusion-weight logit per prediction; an allocation is one insert flag; a pair's
#: meeting logs no action (its value acts through a ranking term; ``recsys_rl.training.pair_value``).
ACTION_SIZES = {FEED: len(FEED_ACTION_NAMES), "live_allocation": 1, USER_AUTHOR: 0}
#: What a transition's reward is read from: the responses clients reported (``reward/<signal>``), or the
#: upstream model's predictions of the viewed items (``predicted_reward``, ``pipelines.episodes``).
REWARD_SOURCES = ("logged", "predicted")


class DatasetMismatchError(OperationalError):
    """The dataset cannot feed this training job; the message says what differs."""


@dataclass(frozen=True)
class TransitionDataset:
    """One surface of a dataset directory, after its manifest has been checked."""

    directory: Path
    surface: str
    manifest: dict[str, Any]

    @property
    def signals(self) -> tuple[str, ...]:
        return DATASET_SIGNALS[self.surface]

    @property
    def rows(self) -> int:
        return int(self.manifest["surfaces"][self.surface]["rows"])

    def shard_paths(self, kind: str) -> list[Path]:
        names = self.manifest["surfaces"][self.surface][f"{kind}_shards"]
        return [self.directory / name for name in names]


def open_dataset(
    directory: str | Path, surface: str = FEED, *, check_sha256: bool = True
) -> TransitionDataset:
    directory = Path(directory)
    path = directory / MANIFEST
    manifest = read_json_file(path, DatasetMismatchError, "not a transition dataset")
    readable = READABLE_DATASET_SCHEMA_VERSIONS
    if manifest.get("schema_version") not in readable or manifest.get("kind") != "transitions":
        raise DatasetMismatchError(
            f"{path}: expected a transitions dataset with schema_version {' or '.join(map(str, readable))}, "
            f"found kind {manifest.get('kind')!r} with schema_version {manifest.get('schema_version')!r}"
        )
    section = manifest.get("surfaces", {}).get(surface)
    if section is None:
        hint = "; build it with build-transitions --user-author-surface" if surface == USER_AUTHOR else ""
        raise DatasetMismatchError(f"{path} has no {surface!r} surface{hint}")
    for key, expected in (("signals", DATASET_SIGNALS[surface]), ("feature_names", STATE_FEATURES[surface])):
        if tuple(section.get(key, ())) != tuple(expected):
            raise DatasetMismatchError(
                f"{path}: {surface} {key} are {section.get(key)}, but this trainer expects {list(expected)}"
            )
    dataset = TransitionDataset(directory, surface, manifest)
    if dataset.rows == 0:
        raise DatasetMismatchError(f"{directory} holds no {surface} transitions to train on")
    if check_sha256:
        for shard in dataset.shard_paths("tfrecord") + dataset.shard_paths("parquet"):
            _check_digest(shard, manifest["sha256"].get(shard.name))
    return dataset


def _check_digest(path: Path, expected: str | None) -> None:
    if not path.is_file():
        raise DatasetMismatchError(f"shard {path} is listed in the manifest but missing")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise DatasetMismatchError(f"shard {path} does not match the sha256 in its manifest")


@dataclass(frozen=True)
class TransitionStatistics:
    """Moments the networks normalise with; baked into the exported policy so serving needs nothing else."""

    state_mean: np.ndarray  # (D,)
    state_std: np.ndarray  # (D,); 1 for a feature (nearly) constant in the data, see transition_statistics
    reward_std: np.ndarray  # (S,), floored so a constant signal does not divide by zero
    reward_mean: np.ndarray  # (S,)
    action_mean: np.ndarray  # (K,): where a new actor's mean starts, so it begins near the logged policy
    # (D + 1, K): the logged actions' least-squares fit on [1, normalised state], the part of an action
    # the logging policy's state dependence explains (see MultiTaskCriticNetwork)
    logged_action_coef: np.ndarray
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "state_mean": self.state_mean.tolist(),
            "state_std": self.state_std.tolist(),
            "reward_mean": self.reward_mean.tolist(),
            "reward_std": self.reward_std.tolist(),
            "action_mean": self.action_mean.tolist(),
            "logged_action_coef": self.logged_action_coef.tolist(),
            "rows": self.rows,
        }


def check_reward_source(dataset: TransitionDataset, rewards: str) -> None:
    """Refuse a reward source the dataset cannot give, saying why."""
    if rewards not in REWARD_SOURCES:
        raise ValueError(f"rewards should be one of {list(REWARD_SOURCES)}, but is {rewards!r}")
    if rewards == "logged":
        return
    if dataset.surface == USER_AUTHOR:
        raise DatasetMismatchError(
            "the user_author surface has no predicted rewards: train it with rewards 'logged'"
        )
    version = dataset.manifest["schema_version"]
    if version < PREDICTED_REWARDS_SINCE:
        raise DatasetMismatchError(
            f"{dataset.directory} has schema_version {version}, which has no predicted rewards (they came in "
            f"version {PREDICTED_REWARDS_SINCE}): rebuild it, or train with rewards 'logged'"
        )


def transition_statistics(
    dataset: TransitionDataset, floor: float = 1e-3, *, rewards: str = "logged"
) -> TransitionStatistics:
    """Per-feature and per-signal moments over the whole surface, read from the Parquet shards; the
    rewards' from the column ``rewards`` names (``REWARD_SOURCES``).

    A state feature whose spread in the data is below ``floor`` is centred but not scaled. Dividing it
    by the floor would turn any variation the data never showed into inputs a thousand times larger at
    serving time: logs of users' first day have no history, and a policy trained on them then met
    users with a day of history through the live loop and answered with fusion weights of +-50.
    """
    return statistics_of(*surface_arrays(dataset, rewards=rewards), floor)


def surface_arrays(
    dataset: TransitionDataset, *, rewards: str = "logged"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The surface's states, rewards (from the column ``rewards`` names) and actions, one row per
    transition, as float64 arrays read from the Parquet shards."""
    check_reward_source(dataset, rewards)
    tables = [pq.read_table(p) for p in dataset.shard_paths("parquet")]

    def matrix(column: str, width: int) -> np.ndarray:
        values = [np.asarray(t.column(column).combine_chunks().flatten(), np.float64) for t in tables]
        return np.concatenate(values).reshape(-1, width)

    states = matrix("state", len(STATE_FEATURES[dataset.surface]))
    if rewards == "predicted":
        values = matrix("predicted_reward", len(dataset.signals))
    else:
        values = np.stack(
            [np.concatenate([t.column(f"reward_{s}").to_numpy() for t in tables]) for s in dataset.signals],
            axis=1,
        )
    width = ACTION_SIZES[dataset.surface]
    actions = matrix("action", width) if width else np.zeros((len(states), 0))
    return states, values, actions


def statistics_of(
    states: np.ndarray, rewards: np.ndarray, actions: np.ndarray, floor: float = 1e-3
) -> TransitionStatistics:
    """The moments of rows held as arrays (``transition_statistics``'s rule for the floor)."""
    state_mean, spread = states.mean(axis=0), states.std(axis=0)
    state_std = np.where(spread < floor, 1.0, spread)
    design = np.column_stack([np.ones(len(states)), (states - state_mean) / state_std])
    return TransitionStatistics(
        state_mean=state_mean,
        state_std=state_std,
        reward_mean=rewards.mean(axis=0),
        reward_std=np.maximum(rewards.std(axis=0), floor),
        action_mean=actions.mean(axis=0),
        logged_action_coef=np.linalg.lstsq(design, actions, rcond=None)[0],
        rows=states.shape[0],
    )


def _feature_spec(dataset: TransitionDataset, rewards: str) -> dict[str, tf.io.FixedLenFeature]:
    state_size = len(STATE_FEATURES[dataset.surface])
    spec = {
        "state": tf.io.FixedLenFeature([state_size], tf.float32),
        "next_state": tf.io.FixedLenFeature([state_size], tf.float32),
    }
    if dataset.surface == USER_AUTHOR:
        spec["pair_step"] = tf.io.FixedLenFeature([], tf.int64)
        spec[GAP_DAYS_KEY] = tf.io.FixedLenFeature([], tf.float32)
        spec[TRUNCATED_KEY] = tf.io.FixedLenFeature([], tf.int64)
    else:
        spec.update(
            action=tf.io.FixedLenFeature([ACTION_SIZES[dataset.surface]], tf.float32),
            log_propensity=tf.io.FixedLenFeature([], tf.float32),
            step=tf.io.FixedLenFeature([], tf.int64),
            done=tf.io.FixedLenFeature([], tf.int64),
        )
    if rewards == "predicted":
        spec["predicted_reward"] = tf.io.FixedLenFeature([len(dataset.signals)], tf.float32)
    else:
        spec.update({f"reward/{s}": tf.io.FixedLenFeature([], tf.float32) for s in dataset.signals})
    return spec


def _pair_row_as_request_row(parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """A pair row with the fields of a request row. It has no action, propensity or end: no row ends a
    pair (its last one before the cut-off bootstraps from the pair waiting at the cut-off,
    ``pipelines.user_author``), so those are empty, zero and never; its ``pair_step`` is the step, and
    its gap and truncation go with the propensity (``pair_transition_spec``)."""
    batch = tf.shape(parsed["pair_step"])[0]
    return {
        **parsed,
        "step": parsed["pair_step"],
        "done": tf.zeros([batch], tf.int64),
        "action": tf.zeros([batch, 0], tf.float32),
        "log_propensity": tf.zeros([batch], tf.float32),
        TRUNCATED_KEY: tf.cast(parsed[TRUNCATED_KEY], tf.float32),
    }


def _to_transition(parsed: dict[str, tf.Tensor], signal_names: tuple[str, ...]) -> trajectory.Transition:
    if "pair_step" in parsed:
        parsed = _pair_row_as_request_row(parsed)
    done = tf.cast(parsed["done"], tf.bool)
    batch = tf.shape(done)[0]
    first = tf.equal(parsed["step"], 0)
    current = time_step.TimeStep(
        step_type=tf.where(first, time_step.StepType.FIRST, time_step.StepType.MID),
        reward=tf.zeros([batch, len(signal_names)], tf.float32),
        discount=tf.ones([batch], tf.float32),
        observation=parsed["state"],
    )
    if "predicted_reward" in parsed:
        reward = parsed["predicted_reward"]
    else:
        reward = tf.stack([parsed[f"reward/{s}"] for s in signal_names], axis=1)
    following = time_step.TimeStep(
        step_type=tf.where(done, time_step.StepType.LAST, time_step.StepType.MID),
        reward=reward,
        discount=1.0 - tf.cast(done, tf.float32),
        observation=parsed["next_state"],
    )
    info = {key: parsed[key] for key in (LOG_PROPENSITY_KEY, GAP_DAYS_KEY, TRUNCATED_KEY) if key in parsed}
    action = policy_step.PolicyStep(action=parsed["action"], state=(), info=info)
    return trajectory.Transition(current, action, following)


def read_transitions(
    dataset: TransitionDataset,
    batch_size: int,
    *,
    seed: int,
    shuffle_buffer: int = 65_536,
    repeat: bool = True,
    rewards: str = "logged",
) -> tf.data.Dataset:
    """Shuffled ``Transition`` batches of exactly ``batch_size`` (a ragged last batch is dropped), their
    rewards from the column ``rewards`` names (``REWARD_SOURCES``).

    Shuffling is seeded and the pipeline deterministic, so a run's batches depend only on the seed, and
    an iterator saved in a checkpoint resumes at the same place.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size should be at least 1, but is {batch_size}")
    check_reward_source(dataset, rewards)
    files = [str(p) for p in dataset.shard_paths("tfrecord")]
    records = tf.data.TFRecordDataset(files)
    records = records.shuffle(
        min(shuffle_buffer, max(dataset.rows, 1)), seed=seed, reshuffle_each_iteration=True
    )
    if repeat:
        records = records.repeat()
    spec = _feature_spec(dataset, rewards)
    signal_names = dataset.signals
    batches = records.batch(batch_size, drop_remainder=True).map(
        lambda serialized: _to_transition(tf.io.parse_example(serialized, spec), signal_names),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    # Autotuning off: its model thread can outlive the iterator, and freeing an iterator that had served a
    # training run waited for it 33.6 s in 2 runs of 4 here (0 of 4 untuned), so half a benchmark's runs
    # ended half a minute late. Untuned, AUTOTUNE takes tf.data's defaults: the same batches, no slower
    # here (1.8 against 2.0 ms a batch of 512).
    untuned = tf.data.Options()
    untuned.autotune.enabled = False
    return batches.prefetch(tf.data.AUTOTUNE).with_options(untuned)
