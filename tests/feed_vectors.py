"""Per-signal feed vectors for tests of constrained choices: watch time first, like the signal registry,
every interaction at one level, and hate."""

from __future__ import annotations

import numpy as np

from recsys_rl import signals

K = len(signals.FEED_SIGNALS)
_HATE = signals.FEED_SIGNALS.index("hate")


def feed_signals(watch: float, interactions: float = 1.0, hate: float = 1.0) -> np.ndarray:
    """(K,) values: ``watch`` for watch time, ``hate`` for hate and ``interactions`` for every other."""
    out = np.full(K, interactions, dtype=np.float64)
    out[signals.FEED_SIGNALS.index(signals.FEED_MAIN_SIGNAL)], out[_HATE] = watch, hate
    return out
