"""Feed transition shards written by hand, as the pipeline writes them, for the OPE readers' unit tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recsys_rl import signals
from recsys_rl.dataset_contract import DATASET_SCHEMA_VERSION, MANIFEST
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.pipelines.transition_io import parquet_schema
from recsys_rl.state import FEED_STATE_FEATURES

#: The dataset schema version that added each column.
COLUMNS_SINCE = {
    "deterministic": 2,
    "user_author_term_id": 4,
    "user_author_weight_logit": 4,
    "user_author_log_propensity": 4,
}


def _lists(matrix: np.ndarray) -> pa.Array:
    offsets = pa.array(np.arange(matrix.shape[0] + 1, dtype=np.int32) * matrix.shape[1])
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.astype(np.float32).ravel()))


def feed_table(
    logged: LoggedSteps, *, schema_version: int = DATASET_SCHEMA_VERSION, **columns: Any
) -> pa.Table:
    """``logged``'s rows as a feed shard's table, in its order; ``columns`` replace the defaults (blank
    ids and times, nothing deterministic, no user-author term). ``schema_version``: the columns a dataset
    of that version had."""
    n = logged.rows
    blank, zeros = [""] * n, np.zeros(n, np.int64)
    table = {
        "request_id": [f"r{i}" for i in range(n)],
        "user_id": [f"u{u}" for u in logged.user],
        "session_id": [f"s{s:06d}" for s in logged.session],  # zero-padded: string order is session order
        "surface": ["feed"] * n,
        "policy_version": blank,
        "features_missing_reason": blank,
        "step": logged.step,
        "event_time_ms": zeros,
        "next_event_time_ms": zeros,
        "user_group": logged.groups,
        "features_missing": zeros,
        "deterministic": zeros,
        "done": logged.done.astype(np.int64),
        "feedback_count": zeros,
        "state": _lists(logged.states),
        "next_state": _lists(logged.next_states),
        "action": _lists(logged.actions),
        "log_propensity": logged.behaviour_log_prob,
        "user_author_term_id": blank,
        "user_author_weight_logit": np.zeros(n),
        "user_author_log_propensity": np.zeros(n),
        **{f"reward_{s}": logged.rewards[:, i] for i, s in enumerate(signals.FEED_SIGNALS)},
        **columns,
    }
    schema = parquet_schema("feed")
    for name, version in COLUMNS_SINCE.items():
        if schema_version < version:
            del table[name]
            schema = schema.remove(schema.get_field_index(name))
    return pa.Table.from_pydict(table, schema=schema)


def write_feed_dataset(
    directory: Path, table: pa.Table, *, schema_version: int = DATASET_SCHEMA_VERSION, seed: int = 0
) -> None:
    """``table`` as a dataset's feed surface: two Parquet shards of its rows in no particular order, and
    the manifest that lists them."""
    n = table.num_rows
    shuffled = table.take(np.random.default_rng(seed).permutation(n))
    names = ["transitions-feed-00000-of-00002.parquet", "transitions-feed-00001-of-00002.parquet"]
    pq.write_table(shuffled.slice(0, n // 3), directory / names[0])
    pq.write_table(shuffled.slice(n // 3), directory / names[1])
    manifest = {
        "schema_version": schema_version,
        "kind": "transitions",
        "version": f"transitions-{seed}",
        "surfaces": {
            "feed": {
                "signals": list(signals.FEED_SIGNALS),
                "feature_names": list(FEED_STATE_FEATURES),
                "rows": n,
                "tfrecord_shards": [],
                "parquet_shards": names,
            }
        },
        "sha256": {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in names},
    }
    (directory / MANIFEST).write_text(json.dumps(manifest))
