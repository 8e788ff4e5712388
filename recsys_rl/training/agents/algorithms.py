"""The algorithms ``recsys-rl train --algo`` offers, by name, and the surface each one decides for.

Kept free of TensorFlow so that the command line can list them without paying for a TensorFlow import;
``recsys_rl.training.agents.factory`` builds them.
"""

from __future__ import annotations

from recsys_rl.dataset_contract import USER_AUTHOR

FEED = "feed"
LIVE_ALLOCATION = "live_allocation"

#: Feed-ranking algorithms (what feed benchmarks and pipelines iterate over).
ALGORITHMS: dict[str, str] = {
    "tscac": "Two-Stage Constrained Actor-Critic (closed-form weighted likelihood)",
    "tscac-dpg": "TSCAC, a deterministic-policy-gradient variant of ours (Q-maximising actor + BC + "
    "closeness to stage one; not the authors' code)",
    "bc": "behaviour cloning",
    "rcpo": "RCPO with a single critic on the Lagrangian reward",
    "rcpo-mc": "RCPO with the multi-task critic",
    "ac-main": "actor-critic on watch time only",
}

#: Live-allocation algorithms (DESIGN 3.2).
ALLOCATION_ALGORITHMS: dict[str, str] = {
    "sl-mgac": "live allocation: Supervised-Learning-enhanced Multi-Group Actor-Critic",
    "sl-mgac-nosl": "live allocation: SL-MGAC without the supervised heads",
    "ac-single-group": "live allocation: SL-MGAC's actor-critic without group routing",
}

#: User-author pair values (issue 22), learnt on a dataset's user_author surface.
PAIR_VALUE_ALGORITHMS: dict[str, str] = {
    "ua-mtcl": "user-author value: multi-task critic, one trunk and funnel heads click -> follow -> gift -> "
    "author_return",
    "ua-independent": "user-author value: a trunk per signal and no funnel (MTCL's comparison)",
}

#: Everything ``recsys-rl train --algo`` accepts.
ALL_ALGORITHMS: dict[str, str] = {**ALGORITHMS, **ALLOCATION_ALGORITHMS, **PAIR_VALUE_ALGORITHMS}


def surface_of(algorithm: str) -> str:
    """``feed``, ``live_allocation`` or ``user_author``: which decisions the algorithm's policy informs."""
    if algorithm not in ALL_ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(ALL_ALGORITHMS)}")
    if algorithm in PAIR_VALUE_ALGORITHMS:
        return USER_AUTHOR
    return LIVE_ALLOCATION if algorithm in ALLOCATION_ALGORITHMS else FEED
