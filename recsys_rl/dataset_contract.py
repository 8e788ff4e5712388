"""What a transition dataset directory promises its readers: file names, schema version, state names.

The pipelines write datasets and the trainers read them; both take these facts from here, so a trainer
never has to import the Beam pipeline code to know what it is reading.
"""

from __future__ import annotations

from recsys_rl.state import FEED_STATE_FEATURES, LIVE_STATE_FEATURES

MANIFEST = "manifest.json"
DATASET_SCHEMA_VERSION = 1
STATE_FEATURES = {"feed": FEED_STATE_FEATURES, "live_allocation": LIVE_STATE_FEATURES}
