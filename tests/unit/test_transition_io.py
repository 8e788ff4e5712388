"""Transition records as TensorFlow reads them: our Example bytes parse with TensorFlow's own parser."""

import numpy as np

from pipelines.transition_io import parquet_schema, shard_of, to_example, to_parquet_row
from recsys_rl import signals


def _row(surface: str = "feed") -> dict:
    return {
        "request_id": "r1",
        "user_id": "u1",
        "session_id": "u1/5",
        "surface": surface,
        "policy_version": "p",
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
        "reward": [12.5, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
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
        **{f"reward/{s}": tf.io.FixedLenFeature([], tf.float32) for s in signals.FEED_SIGNALS},
    }
    parsed = tf.io.parse_single_example(to_example(_row()), spec)
    assert parsed["request_id"].numpy() == b"r1"
    assert int(parsed["step"]) == 3 and int(parsed["done"]) == 1
    np.testing.assert_allclose(parsed["state"].numpy(), [0.5, -1.0])
    assert float(parsed["reward/watch_time"]) == 12.5 and float(parsed["reward/share"]) == 1.0
    assert float(parsed["log_propensity"]) == -3.5


def test_example_bytes_are_deterministic():
    assert to_example(_row()) == to_example(dict(reversed(list(_row().items()))))


def test_parquet_rows_name_each_reward():
    row = to_parquet_row(_row("live_allocation") | {"reward": [30.0, 2.0, 7.5]})
    assert {f"reward_{s}" for s in signals.LIVE_SIGNALS} <= set(row)
    assert set(parquet_schema("live_allocation").names) == set(row)


def test_shards_are_stable_and_in_range():
    assert shard_of("u1/5", 4) == shard_of("u1/5", 4)
    assert {shard_of(f"u{i}/1", 4) for i in range(200)} == {0, 1, 2, 3}
