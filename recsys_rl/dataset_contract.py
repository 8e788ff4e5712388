"""What a transition dataset directory promises its readers: file names, schema version, state names.

The pipelines write datasets and the trainers read them; both take these facts from here, so a trainer
never has to import the Beam pipeline code to know what it is reading.
"""

from __future__ import annotations

from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.signals import FEED_SIGNALS, LIVE_SIGNALS, PAIR_SIGNALS
from recsys_rl.state import FEED_STATE_FEATURES, LIVE_STATE_FEATURES

MANIFEST = "manifest.json"
#: Version the pipelines write. Version 2 added the ``deterministic`` column (1 where serving logged the
#: policy's mode instead of a draw, so that ``log_propensity`` is no behaviour propensity) and the
#: manifest's per-surface ``deterministic`` count.
#: Version 3 added the ``user_author`` surface (its shards, manifest section and pair-histories file).
#: Version 4 added the request rows' ``user_author_term_id``, ``user_author_weight_logit`` and
#: ``user_author_log_propensity`` (a Rank's user-author term; "" and zeros where none was routed).
#: Version 5 added the request rows' ``predicted_reward`` (per signal, the upstream model's logged
#: predictions summed over the viewed items), which training reads with ``rewards: predicted``.
#: Version 6 added the request rows' ``pair_reward`` (per ``PAIR_SIGNALS`` signal, the user-author
#: surface's rewards of the request's views; zeros unless that surface was built) and the pair rows'
#: ``request_id``: the OPE gate judges a user-author term on the pairs' return through them.
DATASET_SCHEMA_VERSION = 6
#: Versions readers accept. A version-1 dataset has no ``deterministic`` column: it was built from
#: version-1 decision records, which cannot say, and its decisions are all read as sampled.
READABLE_DATASET_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
#: The first version with ``predicted_reward``.
PREDICTED_REWARDS_SINCE = 5
#: The first version with ``pair_reward``.
PAIR_REWARDS_SINCE = 6
#: The surface of user-author pair transitions (issue 22): one row per interaction of a pair.
USER_AUTHOR = "user_author"
#: Every surface a dataset holds, with its reward vector's signals in order.
DATASET_SIGNALS: dict[str, tuple[str, ...]] = {
    "feed": FEED_SIGNALS,
    "live_allocation": LIVE_SIGNALS,
    USER_AUTHOR: PAIR_SIGNALS,
}
#: The surfaces every dataset holds; ``USER_AUTHOR`` is built on request (``dataset_surfaces``).
REQUEST_SURFACES: tuple[str, ...] = ("feed", "live_allocation")


def dataset_surfaces(user_author: bool) -> tuple[str, ...]:
    """The surfaces of a dataset built with or without the user-author surface."""
    return (*REQUEST_SURFACES, USER_AUTHOR) if user_author else REQUEST_SURFACES


STATE_FEATURES = {
    "feed": FEED_STATE_FEATURES,
    "live_allocation": LIVE_STATE_FEATURES,
    USER_AUTHOR: PAIR_STATE_FEATURES,
}
