"""What a transition dataset directory promises its readers: file names, schema version, state names.

The pipelines write datasets and the trainers read them; both take these facts from here, so a trainer
never has to import the Beam pipeline code to know what it is reading.
"""

from __future__ import annotations

from recsys_rl.state import FEED_STATE_FEATURES, LIVE_STATE_FEATURES

MANIFEST = "manifest.json"
#: Version the pipelines write. Version 2 added the ``deterministic`` column (1 where serving logged the
#: policy's mode instead of a draw, so that ``log_propensity`` is no behaviour propensity) and the
#: manifest's per-surface ``deterministic`` count.
DATASET_SCHEMA_VERSION = 2
#: Versions readers accept. A version-1 dataset has no ``deterministic`` column: it was built from
#: version-1 decision records, which cannot say, and its decisions are all read as sampled.
READABLE_DATASET_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)
STATE_FEATURES = {"feed": FEED_STATE_FEATURES, "live_allocation": LIVE_STATE_FEATURES}
