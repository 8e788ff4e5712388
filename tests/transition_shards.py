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
from recsys_rl.dataset_contract import DATASET_SCHEMA_VERSION, MANIFEST, USER_AUTHOR
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.pipelines.transition_io import feed_steps_table
from recsys_rl.state import FEED_STATE_FEATURES

#: The dataset schema version that added each column.
COLUMNS_SINCE = {
    "deterministic": 2,
    "user_author_term_id": 4,
    "user_author_weight_logit": 4,
    "user_author_log_propensity": 4,
    "predicted_reward": 5,
    "pair_reward": 6,
}


def feed_table(
    logged: LoggedSteps, *, schema_version: int = DATASET_SCHEMA_VERSION, **columns: Any
) -> pa.Table:
    """``logged``'s rows as a feed shard's table (``feed_steps_table``, ``columns`` replacing its defaults)
    with the columns a dataset of ``schema_version`` had."""
    table = feed_steps_table(logged, **columns)
    for name, version in COLUMNS_SINCE.items():
        if schema_version < version:
            table = table.remove_column(table.schema.get_field_index(name))
    return table


def write_feed_dataset(
    directory: Path,
    table: pa.Table,
    *,
    schema_version: int = DATASET_SCHEMA_VERSION,
    seed: int = 0,
    user_author: bool = False,
) -> None:
    """``table`` as a dataset's feed surface: two Parquet shards of its rows in no particular order, and
    the manifest that lists them; with ``user_author``, the manifest says that surface was built too (its
    section lists no shards: the OPE readers need only the request rows' pair rewards)."""
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
            },
            **({USER_AUTHOR: _empty_pair_section()} if user_author else {}),
        },
        "sha256": {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in names},
    }
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _empty_pair_section() -> dict[str, Any]:
    return {
        "signals": list(signals.PAIR_SIGNALS),
        "feature_names": list(PAIR_STATE_FEATURES),
        "rows": 0,
        "tfrecord_shards": [],
        "parquet_shards": [],
    }
