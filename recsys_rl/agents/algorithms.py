"""The algorithms ``recsys-rl train --algo`` offers, by name.

Kept free of TensorFlow so that the command line can list them without paying for a TensorFlow import;
``recsys_rl.agents.registry`` builds them.
"""

from __future__ import annotations

ALGORITHMS: dict[str, str] = {
    "tscac": "Two-Stage Constrained Actor-Critic (closed-form weighted likelihood)",
    "tscac-det": "TSCAC, deterministic variant (Q-maximising actor + BC + closeness to stage one)",
    "bc": "behaviour cloning",
    "rcpo": "RCPO with a single critic on the Lagrangian reward",
    "rcpo-mc": "RCPO with the multi-task critic",
    "ac-main": "actor-critic on watch time only",
}
