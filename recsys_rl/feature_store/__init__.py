"""The Feast feature store (DESIGN 6): the repo's profiles and definitions, materialisation, and reads.

``repo`` loads a profile of the feature repo (``recsys_rl.feature_repo``, the top-level ``features/``),
runs its definitions and opens, checks and applies the store; ``materialize`` fills the online store
(``recsys-rl features materialize``); ``reads`` gives features back to serving and to training joins.
This module is the public API.

Failures a user can act on raise ``ConfigError`` (bad settings) or ``FeatureStoreError`` (missing data,
unreachable Redis); both print as one line in the CLI.
"""

from recsys_rl.feature_store.materialize import (
    MaterializeConfig,
    MaterializedView,
    MaterializeReport,
    materialize,
    materialize_repo,
    parse_date,
)
from recsys_rl.feature_store.reads import historical_features, online_pair_histories, online_user_features
from recsys_rl.feature_store.repo import (
    CANDIDATE_STATS_SERVICE,
    DEFAULT_REPO,
    OFFLINE_ROOT_ENV,
    PAIR_HISTORY_SERVICE,
    PROFILES,
    REDIS_ENV,
    USER_STATE_SERVICE,
    Definitions,
    FeatureStoreError,
    apply_definitions,
    check_offline_data,
    check_online_store,
    load_definitions,
    load_repo_config,
    open_store,
    redis_connection_string,
)

__all__ = [
    "CANDIDATE_STATS_SERVICE",
    "DEFAULT_REPO",
    "OFFLINE_ROOT_ENV",
    "PAIR_HISTORY_SERVICE",
    "PROFILES",
    "REDIS_ENV",
    "USER_STATE_SERVICE",
    "Definitions",
    "FeatureStoreError",
    "MaterializeConfig",
    "MaterializeReport",
    "MaterializedView",
    "apply_definitions",
    "check_offline_data",
    "check_online_store",
    "historical_features",
    "load_definitions",
    "load_repo_config",
    "materialize",
    "materialize_repo",
    "online_pair_histories",
    "online_user_features",
    "open_store",
    "parse_date",
    "redis_connection_string",
]
