"""The agents' data reader on a dataset built the production way (simulator -> Kafka -> Beam pipeline).

The reader is the one place where logged rows become TF-Agents transitions, so every batch it yields
is matched row by row against the Parquet copy of the same dataset: a reward in the wrong slot, or a
discount that does not end a session where ``done`` says so, would train a critic on the wrong returns.
The manifest checks are exercised on edited copies of the dataset, never on the shared one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from recsys_rl import signals
from recsys_rl.dataset_contract import MANIFEST, USER_AUTHOR
from recsys_rl.sim.behaviour import behaviour_feed_policy
from recsys_rl.state import FEED_STATE_FEATURES
from recsys_rl.training.agents.data import (
    DatasetMismatchError,
    open_dataset,
    read_transitions,
    transition_statistics,
)
from recsys_rl.training.agents.specs import GAP_DAYS_KEY, LOG_PROPENSITY_KEY, TRUNCATED_KEY

pytestmark = pytest.mark.integration

STATE_SIZE = len(FEED_STATE_FEATURES)
ACTION_SIZE = 7
SIGNALS = signals.FEED_SIGNALS


@pytest.fixture(scope="module")
def feed_rows(feed_dataset: Path) -> pd.DataFrame:
    """Every feed transition from the Parquet shards, indexed by its (state, action) bytes."""
    manifest = json.loads((feed_dataset / MANIFEST).read_text())
    shards = [feed_dataset / name for name in manifest["surfaces"]["feed"]["parquet_shards"]]
    rows = pd.concat([pd.read_parquet(p) for p in shards], ignore_index=True)
    rows.index = [_key(s, a) for s, a in zip(rows["state"], rows["action"], strict=True)]
    assert rows.index.is_unique, "state and action should identify a logged transition"
    return rows


def _key(state, action) -> bytes:
    return np.asarray(state, np.float32).tobytes() + np.asarray(action, np.float32).tobytes()


def _all_rows_once(dataset, seed: int = 0) -> trajectory.Transition:
    """One batch holding every row exactly once (one pass, batch size = row count)."""
    (batch,) = list(read_transitions(dataset, dataset.rows, seed=seed, repeat=False))
    return batch


def _copy(feed_dataset: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "dataset"
    shutil.copytree(feed_dataset, copy)
    return copy


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


# -- the manifest is accepted and the batches are the dataset's rows ------------------------------


def test_open_dataset_accepts_a_pipeline_built_dataset(feed_dataset, feed_rows):
    dataset = open_dataset(feed_dataset)
    assert dataset.surface == "feed"
    assert dataset.signals == SIGNALS
    assert dataset.rows == len(feed_rows) > 1000
    assert len(dataset.shard_paths("tfrecord")) == len(dataset.shard_paths("parquet")) >= 1


def test_batches_have_exactly_batch_size_rows_and_the_transition_shapes(feed_dataset):
    dataset = open_dataset(feed_dataset)
    batch_size = 300  # does not divide the row count, so a ragged last batch would show
    assert dataset.rows % batch_size != 0
    batches = list(read_transitions(dataset, batch_size, seed=1, repeat=False))
    assert len(batches) == dataset.rows // batch_size

    for batch in batches[:2] + batches[-1:]:
        assert isinstance(batch, trajectory.Transition)
        assert batch.time_step.observation.shape == (batch_size, STATE_SIZE)
        assert batch.next_time_step.observation.shape == (batch_size, STATE_SIZE)
        assert batch.action_step.action.shape == (batch_size, ACTION_SIZE)
        assert batch.next_time_step.reward.shape == (batch_size, len(SIGNALS))
        assert batch.next_time_step.discount.shape == (batch_size,)
        assert batch.action_step.info[LOG_PROPENSITY_KEY].shape == (batch_size,)

    repeating = read_transitions(dataset, batch_size, seed=1)
    for batch in repeating.take(dataset.rows // batch_size + 3):  # past the end of the first pass
        assert batch.action_step.action.shape == (batch_size, ACTION_SIZE)


def test_the_reader_runs_untuned_so_that_no_autotuning_thread_outlives_its_iterator(feed_dataset):
    # tf.data's autotuning thread kept a finished training run waiting up to half a minute (read_transitions)
    reader = read_transitions(open_dataset(feed_dataset), 64, seed=1)
    assert reader.options().autotune.enabled is False


def test_every_row_arrives_once_with_its_rewards_discount_and_propensity(feed_dataset, feed_rows):
    dataset = open_dataset(feed_dataset)
    batch = _all_rows_once(dataset)
    states = batch.time_step.observation.numpy()
    actions = batch.action_step.action.numpy()
    keys = [_key(s, a) for s, a in zip(states, actions, strict=True)]
    assert sorted(keys) == sorted(feed_rows.index)  # a permutation of the dataset, nothing twice
    rows = feed_rows.loc[keys]

    expected_rewards = rows[[f"reward_{s}" for s in SIGNALS]].to_numpy(np.float32)  # FEED_SIGNALS order
    np.testing.assert_array_equal(batch.next_time_step.reward.numpy(), expected_rewards)
    assert expected_rewards[:, SIGNALS.index("watch_time")].std() > 0  # a real, varying reward column

    done = rows["done"].to_numpy()
    discount = batch.next_time_step.discount.numpy()
    assert 0 < done.sum() < len(done)
    np.testing.assert_array_equal(discount == 0.0, done == 1)
    np.testing.assert_array_equal(discount[done == 0], 1.0)
    last = batch.next_time_step.step_type.numpy() == ts.StepType.LAST
    np.testing.assert_array_equal(last, done == 1)
    first = batch.time_step.step_type.numpy() == ts.StepType.FIRST
    np.testing.assert_array_equal(first, rows["step"].to_numpy() == 0)

    np.testing.assert_array_equal(
        batch.action_step.info[LOG_PROPENSITY_KEY].numpy(), rows["log_propensity"].to_numpy(np.float32)
    )
    np.testing.assert_array_equal(
        batch.next_time_step.observation.numpy(), np.stack(rows["next_state"].to_numpy()).astype(np.float32)
    )


def test_the_same_seed_gives_the_same_batches_and_another_seed_others(feed_dataset):
    dataset = open_dataset(feed_dataset)

    def first_batches(seed: int) -> list[trajectory.Transition]:
        return [
            tf.nest.map_structure(np.asarray, b) for b in read_transitions(dataset, 256, seed=seed).take(3)
        ]

    first, again, other = first_batches(7), first_batches(7), first_batches(8)
    for batch, repeated in zip(first, again, strict=True):
        tf.nest.map_structure(np.testing.assert_array_equal, batch, repeated)
    for batch, reseeded in zip(first, other, strict=True):
        assert not np.array_equal(batch.time_step.observation, reseeded.time_step.observation)


def test_pair_rows_arrive_once_as_transitions_that_never_end_and_carry_no_action(feed_dataset):
    dataset = open_dataset(feed_dataset, USER_AUTHOR)
    manifest = json.loads((feed_dataset / MANIFEST).read_text())
    shards = [feed_dataset / name for name in manifest["surfaces"][USER_AUTHOR]["parquet_shards"]]
    rows = pd.concat([pd.read_parquet(p) for p in shards], ignore_index=True)
    batch = _all_rows_once(dataset)

    # a permutation of the rows: match each by its state, next state, rewards, gap and truncation
    def keys(*columns) -> list[bytes]:
        return [
            b"".join(np.asarray(c, np.float32).tobytes() for c in row) for row in zip(*columns, strict=True)
        ]

    rewards = rows[[f"reward_{s}" for s in signals.PAIR_SIGNALS]].to_numpy(np.float32)
    read = batch.next_time_step.reward.numpy()
    info = {k: v.numpy() for k, v in batch.action_step.info.items()}
    assert sorted(
        keys(
            batch.time_step.observation.numpy(),
            batch.next_time_step.observation.numpy(),
            read,
            info[GAP_DAYS_KEY],
            info[TRUNCATED_KEY],
        )
    ) == sorted(keys(rows["state"], rows["next_state"], rewards, rows["gap_days"], rows["truncated"]))
    assert 0 < info[TRUNCATED_KEY].sum() < len(rows)
    assert read[:, signals.PAIR_SIGNALS.index("click")].std() > 0
    np.testing.assert_array_equal(batch.next_time_step.discount.numpy(), 1.0)  # no row ends a pair
    assert not (batch.next_time_step.step_type.numpy() == ts.StepType.LAST).any()
    first = (batch.time_step.step_type.numpy() == ts.StepType.FIRST).sum()
    assert first == (rows["pair_step"] == 0).sum() > 0
    assert batch.action_step.action.shape == (dataset.rows, 0)
    stats = transition_statistics(dataset)
    assert stats.action_mean.shape == (0,) and stats.rows == len(rows)
    np.testing.assert_allclose(stats.reward_mean, rewards.mean(axis=0), rtol=1e-6)


def test_a_dataset_built_without_pairs_is_refused_with_the_flag_that_builds_them(feed_dataset, tmp_path):
    copy = _copy(feed_dataset, tmp_path)
    _edit_manifest(copy, lambda manifest: manifest["surfaces"].pop(USER_AUTHOR))  # as a default build
    with pytest.raises(DatasetMismatchError, match="has no 'user_author' surface; build it with "
                       "build-transitions --user-author-surface"):  # fmt: skip
        open_dataset(copy, USER_AUTHOR)
    assert open_dataset(copy).rows > 0  # its other surfaces still train


def test_predicted_rewards_arrive_in_the_reward_slot_when_asked(feed_dataset, feed_rows):
    """``rewards="predicted"``: every row's reward vector is its ``predicted_reward`` column, in signal
    order, and the statistics that scale the critics' rewards are that column's."""
    dataset = open_dataset(feed_dataset)
    batch = next(iter(read_transitions(dataset, dataset.rows, seed=0, repeat=False, rewards="predicted")))
    keys = [
        _key(s, a)
        for s, a in zip(batch.time_step.observation.numpy(), batch.action_step.action.numpy(), strict=True)
    ]
    rows = feed_rows.loc[keys]
    predicted = np.stack(rows["predicted_reward"].to_numpy()).astype(np.float32)
    np.testing.assert_array_equal(batch.next_time_step.reward.numpy(), predicted)
    logged = rows[[f"reward_{s}" for s in SIGNALS]].to_numpy(np.float32)
    assert predicted[:, SIGNALS.index("watch_time")].std() > 0 and not np.array_equal(predicted, logged)
    # the views' predictions are what their drawn responses scatter around: the dense signals' totals agree
    dense = [SIGNALS.index("watch_time"), SIGNALS.index("click")]
    np.testing.assert_allclose(predicted[:, dense].sum(axis=0), logged[:, dense].sum(axis=0), rtol=0.25)
    stats = transition_statistics(dataset, rewards="predicted")
    np.testing.assert_allclose(stats.reward_mean, predicted.astype(np.float64).mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(
        stats.reward_std, np.maximum(predicted.astype(np.float64).std(axis=0), 1e-3), rtol=1e-4
    )


def test_predicted_rewards_are_refused_where_the_dataset_has_none(feed_dataset, tmp_path):
    copy = _copy(feed_dataset, tmp_path)
    _edit_manifest(copy, lambda m: m.update(schema_version=4))
    old = open_dataset(copy, check_sha256=False)
    for read in (
        lambda: read_transitions(old, 8, seed=0, rewards="predicted"),
        lambda: transition_statistics(old, rewards="predicted"),
    ):
        with pytest.raises(DatasetMismatchError, match="schema_version 4, which has no predicted rewards"):
            read()
    read_transitions(old, 8, seed=0)  # its logged rewards still read
    with pytest.raises(DatasetMismatchError, match="user_author surface has no predicted rewards"):
        read_transitions(open_dataset(feed_dataset, USER_AUTHOR), 8, seed=0, rewards="predicted")
    with pytest.raises(
        ValueError, match=r"rewards should be one of \['logged', 'predicted'\], but is 'drawn'"
    ):
        read_transitions(open_dataset(feed_dataset), 8, seed=0, rewards="drawn")


def test_transition_statistics_match_numpy_over_the_parquet_shards(feed_dataset, feed_rows):
    stats = transition_statistics(open_dataset(feed_dataset))
    states = np.stack(feed_rows["state"].to_numpy()).astype(np.float64)
    actions = np.stack(feed_rows["action"].to_numpy()).astype(np.float64)
    rewards = feed_rows[[f"reward_{s}" for s in SIGNALS]].to_numpy(np.float64)

    assert stats.rows == len(feed_rows)
    assert stats.state_mean.shape == stats.state_std.shape == (STATE_SIZE,)
    assert stats.reward_mean.shape == stats.reward_std.shape == (len(SIGNALS),)
    assert stats.action_mean.shape == (ACTION_SIZE,)
    np.testing.assert_allclose(stats.state_mean, states.mean(axis=0), rtol=1e-9, atol=1e-9)
    spread = states.std(axis=0)
    constant = spread < 1e-3  # one simulated day: the users have no history yet
    assert constant.any() and not constant.all()
    np.testing.assert_allclose(stats.state_std[~constant], spread[~constant], rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(stats.state_std[constant], 1.0)  # centred, not blown up by a floor
    np.testing.assert_allclose(stats.reward_mean, rewards.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.reward_std, np.maximum(rewards.std(axis=0), 1e-3), rtol=1e-9)
    np.testing.assert_allclose(stats.action_mean, actions.mean(axis=0), rtol=1e-9, atol=1e-9)
    # the simulator's logging policy has a mean linear in the state, which the fit finds up to its noise
    fitted = (
        stats.logged_action_coef[0]
        + (states - stats.state_mean) / stats.state_std @ stats.logged_action_coef[1:]
    )
    logging_mean = behaviour_feed_policy().mean(states)
    assert np.abs(fitted - logging_mean).mean() < 0.2 * np.abs(stats.action_mean - logging_mean).mean()
    assert np.all(stats.state_std >= 1e-3) and np.all(stats.reward_std >= 1e-3)
    assert json.loads(json.dumps(stats.to_dict()))["rows"] == len(feed_rows)


def test_statistics_describe_the_states_the_reader_yields(feed_dataset):
    """Parquet (statistics) and TFRecord (training batches) must hold the same numbers."""
    dataset = open_dataset(feed_dataset)
    stats = transition_statistics(dataset)
    batch = _all_rows_once(dataset, seed=3)
    states = batch.time_step.observation.numpy().astype(np.float64)
    np.testing.assert_allclose(states.mean(axis=0), stats.state_mean, rtol=1e-6, atol=1e-9)
    rewards = batch.next_time_step.reward.numpy().astype(np.float64)
    np.testing.assert_allclose(rewards.mean(axis=0), stats.reward_mean, rtol=1e-5, atol=1e-7)


def test_read_transitions_rejects_an_empty_batch(feed_dataset):
    with pytest.raises(ValueError, match="batch_size should be at least 1"):
        read_transitions(open_dataset(feed_dataset), 0, seed=0)


# -- a dataset that does not fit the trainer is refused, with the reason --------------------------


def _wrong_version(manifest: dict) -> None:
    manifest["schema_version"] = 99


def _renamed_signal(manifest: dict) -> None:
    manifest["surfaces"]["feed"]["signals"][1] = "clicks"


def _reordered_signals(manifest: dict) -> None:
    names = manifest["surfaces"]["feed"]["signals"]
    names[1], names[2] = names[2], names[1]


def _renamed_feature(manifest: dict) -> None:
    manifest["surfaces"]["feed"]["feature_names"][0] = "group_very_active"


def _dropped_feature(manifest: dict) -> None:
    manifest["surfaces"]["feed"]["feature_names"].pop()


def _no_rows(manifest: dict) -> None:
    manifest["surfaces"]["feed"]["rows"] = 0


def _wrong_kind(manifest: dict) -> None:
    manifest["kind"] = "episodes"


def _no_feed_surface(manifest: dict) -> None:
    del manifest["surfaces"]["feed"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(_wrong_version, "with schema_version 99", id="schema-version"),
        pytest.param(_wrong_kind, "found kind 'episodes'", id="kind"),
        pytest.param(_renamed_signal, "feed signals are", id="signal-renamed"),
        pytest.param(_reordered_signals, "feed signals are", id="signals-reordered"),
        pytest.param(_renamed_feature, "feed feature_names are", id="feature-renamed"),
        pytest.param(_dropped_feature, "feed feature_names are", id="feature-dropped"),
        pytest.param(_no_rows, "holds no feed transitions", id="no-rows"),
        pytest.param(_no_feed_surface, "has no 'feed' surface", id="no-surface"),
    ],
)
def test_open_dataset_refuses_a_manifest_that_disagrees(feed_dataset, tmp_path, edit, message):
    copy = _copy(feed_dataset, tmp_path)
    open_dataset(copy)  # the untouched copy is fine, so the edit is what is refused
    _edit_manifest(copy, edit)
    with pytest.raises(DatasetMismatchError, match=message):
        open_dataset(copy)


def test_signal_mismatch_names_both_lists(feed_dataset, tmp_path):
    copy = _copy(feed_dataset, tmp_path)
    _edit_manifest(copy, _renamed_signal)
    with pytest.raises(DatasetMismatchError) as caught:
        open_dataset(copy)
    assert "'clicks'" in str(caught.value) and "'click'" in str(caught.value)


@pytest.mark.parametrize("kind", ["tfrecord", "parquet"])
def test_open_dataset_refuses_a_tampered_shard(feed_dataset, tmp_path, kind):
    copy = _copy(feed_dataset, tmp_path)
    shard = open_dataset(copy).shard_paths(kind)[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    shard.write_bytes(bytes(data))

    with pytest.raises(DatasetMismatchError, match=f"shard .*{shard.name} does not match the sha256"):
        open_dataset(copy)
    assert open_dataset(copy, check_sha256=False).rows > 0  # the check, not the parse, refused it


def test_open_dataset_refuses_a_missing_shard(feed_dataset, tmp_path):
    copy = _copy(feed_dataset, tmp_path)
    shard = open_dataset(copy).shard_paths("tfrecord")[0]
    shard.unlink()
    with pytest.raises(DatasetMismatchError, match=f"{shard.name} is listed in the manifest but missing"):
        open_dataset(copy)


def test_open_dataset_refuses_a_directory_without_a_manifest(feed_dataset, tmp_path):
    copy = _copy(feed_dataset, tmp_path)
    (copy / MANIFEST).unlink()
    with pytest.raises(DatasetMismatchError, match=f"has no {MANIFEST}: not a transition dataset"):
        open_dataset(copy)


def test_open_dataset_refuses_a_manifest_that_is_not_json(feed_dataset, tmp_path):
    copy = _copy(feed_dataset, tmp_path)
    (copy / MANIFEST).write_text("{not json")
    with pytest.raises(DatasetMismatchError, match="is not valid JSON"):
        open_dataset(copy)
