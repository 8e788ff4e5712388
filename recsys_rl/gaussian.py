"""The log-density of the diagonal Gaussian feed policies: one formula for every place that logs or
checks a propensity (the behaviour policy, the exported actor's numpy twin, the server).

A logged propensity is compared with the density it came from; one shared function keeps a slip in
one copy (a dropped ``-sum(log sigma)``) from hiding behind an identical slip in another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from recsys_rl.exploration import Exploration

_LOG_2PI = math.log(2.0 * math.pi)


def log_normaliser(sigma: np.ndarray) -> float:
    """log N(mu; mu, diag(sigma^2)): the density at the mean, which ``standard_log_density`` lowers by
    half of z.z. A server that keeps it per policy pays one numpy call per density instead of six."""
    return -0.5 * len(sigma) * _LOG_2PI - float(np.log(sigma).sum())


def standard_log_density(z: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """log N(a; mu, diag(sigma^2)) over the last axis, from the standardised residual z = (a - mu) / sigma.

    Taking z, not (a, mu), lets a sampler that drew z itself skip recomputing the mean.
    """
    # the arrays' own sums: np.sum's wrapper costs a server's request more than the arithmetic
    return log_normaliser(sigma) - 0.5 * (z * z).sum(axis=-1)


def log_density(actions: np.ndarray, means: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """log N(actions; means, diag(sigma^2)), summed over the last axis."""
    return standard_log_density((np.asarray(actions, np.float64) - means) / sigma, sigma)


@dataclass(frozen=True)
class ScalarGaussian:
    """A Gaussian over one number that ignores the state: a user-author term's weight logit, as the OPE
    gate scores a user_author version (``serving.policies.UserAuthorTermDecider`` draws it)."""

    mean: float
    std: float
    version: str

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Log-densities (n,) of actions (n, 1)."""
        return log_density(actions, self.mean, np.array([self.std]))

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        actions = self.mean + self.std * rng.standard_normal((states.shape[0], 1))
        return actions, self.log_prob(states, actions)
