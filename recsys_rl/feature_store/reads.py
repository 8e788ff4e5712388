"""Reading features back: the online row of each user (serving) and point-in-time rows (a training-set join).

Feast returns integer features as floats once a value is missing; both reads give nullable integers, so
an absent feature stays absent instead of turning into NaN arithmetic downstream.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from feast import FeatureService, FeatureStore
from feast.types import Int64

from recsys_rl.feature_store.repo import (
    ENTITY_TIMESTAMP,
    PAIR_HISTORY_SERVICE,
    USER_STATE_SERVICE,
    progress_to_stderr,
    store_errors,
)


def _integer_columns(service: FeatureService, full_feature_names: bool) -> list[str]:
    names = []
    for projection in service.feature_view_projections:
        for field in projection.features:
            if field.dtype == Int64:
                names.append(
                    f"{projection.name_to_use()}__{field.name}" if full_feature_names else field.name
                )
    return names


def _with_nullable_ints(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    # A missing value would otherwise turn a whole count column into floats.
    for name in columns:
        if name in frame.columns:
            frame[name] = frame[name].astype("Int64")
    return frame


def online_user_features(
    store: FeatureStore, user_ids: Sequence[str], service: str = USER_STATE_SERVICE
) -> pd.DataFrame:
    """One row per user id, in order; an unknown user has nulls (serving falls back).

    An online row may be of any age (Feast applies a view's ttl to point-in-time reads only); the state
    builder reads the engagement row's own ``day`` and applies the ttl itself.
    """
    features = store.get_feature_service(service)
    with store_errors(store, "online read"):
        frame = store.get_online_features(features=features, entity_rows=[{"user_id": u} for u in user_ids])
        result = frame.to_df()
    return _with_nullable_ints(result, _integer_columns(features, False))


def online_pair_histories(
    store: FeatureStore, pairs: Sequence[tuple[str, str]], service: str = PAIR_HISTORY_SERVICE
) -> pd.DataFrame:
    """One row per (user id, author id) pair, in order; a pair that never met has nulls.

    Like the user rows, an online pair row may be of any age: a pair's history is all of it, and the time
    since its last interaction is part of its state (``recsys_rl.pair_state``)."""
    features = store.get_feature_service(service)
    with store_errors(store, "online read"):
        frame = store.get_online_features(
            features=features, entity_rows=[{"user_id": u, "author_id": a} for u, a in pairs]
        )
        result = frame.to_df()
    return _with_nullable_ints(result, _integer_columns(features, False))


def historical_features(
    store: FeatureStore,
    entity_df: pd.DataFrame,
    service: str = USER_STATE_SERVICE,
    *,
    full_feature_names: bool = False,
) -> pd.DataFrame:
    """Point-in-time features for each row of ``entity_df`` (join keys + ``event_timestamp``), in order.

    Feast 0.67's file offline store drops an entity row whose entity has rows but none in the
    point-in-time window (and collapses repeated rows), and with it the other views' features of that
    row. Training needs every row, with nulls where nothing was known (what serving's fallback sees), so
    each view is queried on its own, for the distinct rows, and joined back.
    """
    features = store.get_feature_service(service)
    views = [(p, store.get_feature_view(p.name).join_keys) for p in features.feature_view_projections]
    keys = sorted({k for _, join_keys in views for k in join_keys})
    missing = [c for c in (*keys, ENTITY_TIMESTAMP) if c not in entity_df.columns]
    if missing:
        raise ValueError(f"entity_df should have columns {[*keys, ENTITY_TIMESTAMP]}, but lacks {missing}")
    result = entity_df.reset_index(drop=True)
    result[ENTITY_TIMESTAMP] = pd.to_datetime(result[ENTITY_TIMESTAMP], utc=True).astype(
        "datetime64[ns, UTC]"
    )
    for projection, join_keys in views:
        on = [*join_keys, ENTITY_TIMESTAMP]
        refs = [f"{projection.name_to_use()}:{field.name}" for field in projection.features]
        with progress_to_stderr():
            found = store.get_historical_features(
                entity_df=result[on].drop_duplicates(), features=refs, full_feature_names=full_feature_names
            ).to_df()
        found[ENTITY_TIMESTAMP] = found[ENTITY_TIMESTAMP].astype("datetime64[ns, UTC]")
        result = result.merge(found, on=on, how="left", validate="many_to_one")
    return _with_nullable_ints(result, _integer_columns(features, full_feature_names))
