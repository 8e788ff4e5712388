"""Transition records as TensorFlow reads them: our Example bytes parse with TensorFlow's own parser."""

import math
import random

import numpy as np
import pytest

from recsys_rl import contracts, signals
from recsys_rl.dataset_contract import DATASET_SIGNALS, USER_AUTHOR
from recsys_rl.pipelines.transition_io import (
    LAYOUTS,
    parquet_schema,
    parquet_table,
    parquet_values,
    shard_of,
    to_example,
)


def _row(surface: str = "feed") -> dict:
    return {
        "request_id": "r1",
        "user_id": "u1",
        "session_id": "u1/5",
        "surface": surface,
        "policy_version": "p",
        "features_missing_reason": "timeout",
        "features_missing": True,
        "deterministic": True,
        "step": 3,
        "event_time_ms": 1_767_225_600_000,
        "next_event_time_ms": -1,
        "user_group": 2,
        "done": True,
        "feedback_count": 4,
        "state": [0.5, -1.0],
        "next_state": [0.0, 0.0],
        "action": [0.25] * 7,
        "log_propensity": -3.5,
        "user_author_term_id": "t1",
        "user_author_weight_logit": 0.5,
        "user_author_log_propensity": -0.25,
        "reward": [12.5, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        "predicted_reward": [11.0, 0.75, 0.5, 0.0, 0.125, 0.25, 0.0],
        "pair_reward": [2.0, 1.0, 0.0, 1.0],
    }


def test_examples_parse_with_tensorflow():
    import tensorflow as tf  # the trainer's reader; the pipeline itself never imports TensorFlow

    spec = {
        "request_id": tf.io.FixedLenFeature([], tf.string),
        "step": tf.io.FixedLenFeature([], tf.int64),
        "done": tf.io.FixedLenFeature([], tf.int64),
        "state": tf.io.FixedLenFeature([2], tf.float32),
        "action": tf.io.FixedLenFeature([7], tf.float32),
        "log_propensity": tf.io.FixedLenFeature([], tf.float32),
        "predicted_reward": tf.io.FixedLenFeature([7], tf.float32),
        "pair_reward": tf.io.FixedLenFeature([4], tf.float32),
        **{f"reward/{s}": tf.io.FixedLenFeature([], tf.float32) for s in signals.FEED_SIGNALS},
    }
    parsed = tf.io.parse_single_example(to_example(_row()), spec)
    assert parsed["request_id"].numpy() == b"r1"
    assert int(parsed["step"]) == 3 and int(parsed["done"]) == 1
    np.testing.assert_allclose(parsed["state"].numpy(), [0.5, -1.0])
    assert float(parsed["reward/watch_time"]) == 12.5 and float(parsed["reward/share"]) == 1.0
    assert parsed["predicted_reward"].numpy().tolist() == [11.0, 0.75, 0.5, 0.0, 0.125, 0.25, 0.0]
    assert parsed["pair_reward"].numpy().tolist() == [2.0, 1.0, 0.0, 1.0]
    assert float(parsed["log_propensity"]) == -3.5
    flags = {
        "features_missing": tf.io.FixedLenFeature([], tf.int64),
        "features_missing_reason": tf.io.FixedLenFeature([], tf.string),
        "deterministic": tf.io.FixedLenFeature([], tf.int64),
    }
    parsed = tf.io.parse_single_example(to_example(_row()), flags)
    assert int(parsed["features_missing"]) == 1 and parsed["features_missing_reason"].numpy() == b"timeout"
    assert int(parsed["deterministic"]) == 1
    parsed = tf.io.parse_single_example(to_example(_row() | {"deterministic": False}), flags)
    assert int(parsed["deterministic"]) == 0
    term = {
        "user_author_term_id": tf.io.FixedLenFeature([], tf.string),
        "user_author_weight_logit": tf.io.FixedLenFeature([], tf.float32),
        "user_author_log_propensity": tf.io.FixedLenFeature([], tf.float32),
    }
    parsed = tf.io.parse_single_example(to_example(_row()), term)
    assert parsed["user_author_term_id"].numpy() == b"t1"
    assert (float(parsed["user_author_weight_logit"]), float(parsed["user_author_log_propensity"])) == (
        0.5,
        -0.25,
    )


def test_example_bytes_are_deterministic():
    assert to_example(_row()) == to_example(dict(reversed(list(_row().items()))))


def test_parquet_rows_name_each_reward_and_keep_every_value():
    live = _row("live_allocation") | {"reward": [30.0, 2.0, 7.5], "predicted_reward": [25.0, 1.5, 7.5]}
    rows = [live, live | {"state": []}]
    table = parquet_table("live_allocation", [parquet_values(row) for row in rows])
    assert table.schema == parquet_schema("live_allocation")
    assert {f"reward_{s}" for s in signals.LIVE_SIGNALS} <= set(table.column_names)
    first = table.to_pylist()[0]
    assert [first[f"reward_{s}"] for s in signals.LIVE_SIGNALS] == [30.0, 2.0, 7.5]
    assert first["predicted_reward"] == [25.0, 1.5, 7.5]
    assert first["pair_reward"] == [2.0, 1.0, 0.0, 1.0]
    assert first["state"] == [0.5, -1.0] and first["done"] == 1 and first["step"] == 3
    assert first["deterministic"] == 1
    assert (first["user_author_term_id"], first["user_author_weight_logit"]) == ("t1", 0.5)
    assert table.column("state").to_pylist()[1] == [] and table.num_rows == 2
    assert parquet_table("feed", []).num_rows == 0


def test_a_pair_row_keeps_its_own_fields_in_both_formats():
    import tensorflow as tf

    row = {
        "surface": USER_AUTHOR,
        "user_id": "u1",
        "author_id": "a7",
        "request_id": "r9",
        "item_id": "v3",
        "item_type": "live",
        "pair_step": 4,
        "event_time_ms": 1_767_225_600_000,
        "next_event_time_ms": -1,
        "truncated": True,
        "state": [0.5, 1.0],
        "next_state": [0.75, 1.0],
        "gap_days": 2.5,
        "reward": [1.0, 0.0, 5.0, 1.0],
    }
    [parquet_row] = parquet_table(USER_AUTHOR, [parquet_values(row)]).to_pylist()
    assert parquet_row == {
        **{k: v for k, v in row.items() if k != "reward"},
        "truncated": 1,
        **{f"reward_{s}": v for s, v in zip(signals.PAIR_SIGNALS, row["reward"], strict=True)},
    }
    spec = {
        "author_id": tf.io.FixedLenFeature([], tf.string),
        "request_id": tf.io.FixedLenFeature([], tf.string),
        "truncated": tf.io.FixedLenFeature([], tf.int64),
        "next_state": tf.io.FixedLenFeature([2], tf.float32),
        "gap_days": tf.io.FixedLenFeature([], tf.float32),
        "reward/author_return": tf.io.FixedLenFeature([], tf.float32),
    }
    parsed = tf.io.parse_single_example(to_example(row), spec)
    assert parsed["author_id"].numpy() == b"a7" and int(parsed["truncated"]) == 1
    assert parsed["request_id"].numpy() == b"r9"
    assert float(parsed["gap_days"]) == 2.5 and float(parsed["reward/author_return"]) == 1.0
    np.testing.assert_allclose(parsed["next_state"].numpy(), [0.75, 1.0])


def test_shards_are_stable_and_in_range():
    assert shard_of("u1/5", 4) == shard_of("u1/5", 4)
    assert {shard_of(f"u{i}/1", 4) for i in range(200)} == {0, 1, 2, 3}


def _reference_example(row: dict) -> bytes:
    """The Example built through the protobuf API: what the hand-written wire format must equal."""
    example = contracts.TFExample()
    feature = example.features.feature
    layout = LAYOUTS[row["surface"]]
    for name in layout.strings:
        feature[name].bytes_list.value.append(row[name].encode("utf-8"))
    for name in layout.ints:
        feature[name].int64_list.value.append(int(row[name]))
    for name in layout.float_lists:
        feature[name].float_list.value.extend(row[name])
    for name in layout.floats:
        feature[name].float_list.value.append(row[name])
    for signal, value in zip(DATASET_SIGNALS[row["surface"]], row["reward"], strict=True):
        feature[f"reward/{signal}"].float_list.value.append(value)
    return example.SerializeToString(deterministic=True)


def _random_row(rng: random.Random) -> dict:
    """Rows of every surface that reach every branch: long and non-ASCII strings, negative and 64-bit
    ints, empty lists, floats that round, underflow or overflow float32, NaN and infinities."""
    surface = rng.choice(list(DATASET_SIGNALS))
    size = rng.choice([0, 1, 14, 17, 40])

    def floats(count: int) -> list[float]:
        return [
            rng.choice([rng.uniform(-1e6, 1e6), 0.1, -0.0, 1e-50, 1e300, math.inf, math.nan])
            for _ in range(count)
        ]

    if surface == USER_AUTHOR:
        return {
            "surface": surface,
            "user_id": rng.choice(["u1", "x" * 200, "é✓"]),
            "author_id": rng.choice(["a7", "", "a" * 150]),
            "request_id": rng.choice(["", "sim0-r0000000001", "r" * rng.randint(100, 300)]),
            "item_id": rng.choice(["", "v1", "v" * rng.randint(100, 300)]),
            "item_type": rng.choice(["video", "live"]),
            "pair_step": rng.randint(0, 2 ** rng.randint(1, 40)),
            "event_time_ms": rng.choice([0, 127, 128, 1_767_225_600_000, 2**62, -(2**63)]),
            "next_event_time_ms": rng.choice([-1, 1_767_225_600_000]),
            "truncated": rng.choice([True, False]),
            "state": floats(size),
            "next_state": floats(size),
            "gap_days": floats(1)[0],
            "reward": floats(len(DATASET_SIGNALS[surface])),
        }
    return {
        "request_id": rng.choice(["", "sim0-r0000000001", "é✓", "r" * rng.randint(100, 300)]),
        "user_id": rng.choice(["u1", "x" * 200]),
        "session_id": "u1/1767225600000",
        "surface": surface,
        "policy_version": rng.choice(["", "behaviour-feed-v1", "p" * 150]),
        "features_missing_reason": (reason := rng.choice(["", "timeout", "unknown_user"])),
        "features_missing": bool(reason),
        "deterministic": rng.choice([True, False]),
        "step": rng.randint(0, 2 ** rng.randint(1, 40)),
        "event_time_ms": rng.choice([0, -1, 127, 128, 1_767_225_600_000, 2**62, -(2**63)]),
        "next_event_time_ms": rng.choice([-1, 1_767_225_600_000]),
        "user_group": rng.randint(0, 3),
        "done": rng.choice([True, False]),
        "feedback_count": rng.randint(0, 300),
        "state": floats(size),
        "next_state": floats(size),
        "action": floats(rng.choice([0, 1, 7, 40])),
        "log_propensity": floats(1)[0],
        "user_author_term_id": rng.choice(["", "0123456789abcdef"]),
        "user_author_weight_logit": floats(1)[0],
        "user_author_log_propensity": floats(1)[0],
        "reward": floats(len(DATASET_SIGNALS[surface])),
        "predicted_reward": floats(len(DATASET_SIGNALS[surface])),
        "pair_reward": floats(len(DATASET_SIGNALS[USER_AUTHOR])),
    }


@pytest.mark.parametrize("seed", range(4))
def test_examples_are_byte_for_byte_what_protobuf_serialises(seed):
    rng = random.Random(seed)
    for _ in range(500):
        row = _random_row(rng)
        assert to_example(row) == _reference_example(row), row
