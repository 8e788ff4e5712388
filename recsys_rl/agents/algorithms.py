"""The algorithms ``recsys-rl train --algo`` offers, by name, and the surface each one decides for.

Kept free of TensorFlow so that the command line can list them without paying for a TensorFlow import;
``recsys_rl.agents.registry`` builds them.
"""

from __future__ import annotations

FEED = "feed"
LIVE_ALLOCATION = "live_allocation"

ALGORITHMS: dict[str, str] = {
    "tscac": "Two-Stage Constrained Actor-Critic (closed-form weighted likelihood)",
    "tscac-det": "TSCAC, deterministic variant (Q-maximising actor + BC + closeness to stage one)",
    "bc": "behaviour cloning",
    "rcpo": "RCPO with a single critic on the Lagrangian reward",
    "rcpo-mc": "RCPO with the multi-task critic",
    "ac-main": "actor-critic on watch time only",
    "sl-mgac": "live allocation: Supervised-Learning-enhanced Multi-Group Actor-Critic",
    "sl-mgac-nosl": "live allocation: SL-MGAC without the supervised heads",
    "ac-single-group": "live allocation: SL-MGAC's actor-critic without group routing",
}

#: The surface of every algorithm that does not rank the feed.
_SURFACES: dict[str, str] = {
    "sl-mgac": LIVE_ALLOCATION,
    "sl-mgac-nosl": LIVE_ALLOCATION,
    "ac-single-group": LIVE_ALLOCATION,
}


def surface_of(algorithm: str) -> str:
    """``feed`` or ``live_allocation``: which decisions the algorithm's policy makes."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(ALGORITHMS)}")
    return _SURFACES.get(algorithm, FEED)
