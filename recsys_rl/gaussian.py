"""The log-density of the diagonal Gaussian feed policies: one formula for every place that logs or
checks a propensity (the behaviour policy, the exported actor's numpy twin, the server).

A logged propensity is compared with the density it came from; one shared function keeps a slip in
one copy (a dropped ``-sum(log sigma)``) from hiding behind an identical slip in another.
"""

from __future__ import annotations

import math

import numpy as np

_LOG_2PI = math.log(2.0 * math.pi)


def standard_log_density(z: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """log N(a; mu, diag(sigma^2)) over the last axis, from the standardised residual z = (a - mu) / sigma.

    Taking z, not (a, mu), lets a sampler that drew z itself skip recomputing the mean.
    """
    return -0.5 * np.sum(z * z + _LOG_2PI, axis=-1) - np.sum(np.log(sigma))


def log_density(actions: np.ndarray, means: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """log N(actions; means, diag(sigma^2)), summed over the last axis."""
    return standard_log_density((np.asarray(actions, np.float64) - means) / sigma, sigma)
