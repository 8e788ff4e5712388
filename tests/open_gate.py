"""The gate rules of tests whose subject is a path through the gate, not its verdict.

Every rule is as loose as it goes: any lift, any loss within 100 times a signal's baseline, any support.
What such a gate still refuses is a lift it cannot compute (a signal no bootstrap resample drew), so
those tests simulate enough users for every signal to occur.
"""

from __future__ import annotations

#: GateConfig fields (or a config's ``gate`` mapping) that bless whatever the gate can judge.
OPEN_GATE: dict[str, float] = {
    "min_main_lift": -1.0,
    "default_tolerance": 100.0,
    "min_ess": 0.0,
    "max_weight_share": 1.0,
}
