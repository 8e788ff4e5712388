"""What a policy's ``act`` draws its exploration from.

Two kinds of caller hand a policy its randomness: code that owns a numpy ``Generator`` (off-policy
evaluation sampling a target policy's actions, the tests), and the simulator, which hands each page a
stand-in keyed by the page's rows (``recsys_rl.sim.draws.KeyedExploration``) so that one user's
exploration never depends on another's. Policies may call only what both provide, and only per row: the
first dimension of ``size`` is the number of states.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Exploration(Protocol):
    def random(self, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Uniform draws on [0, 1)."""
        ...

    def standard_normal(self, size: int | tuple[int, ...] | None = None) -> np.ndarray:
        """Standard normal draws."""
        ...
