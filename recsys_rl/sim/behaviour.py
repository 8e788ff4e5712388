"""Policies the simulator can run: the logging (behaviour) policies and the interface any policy meets.

A policy maps a batch of state vectors to actions and reports the log-propensity of each action it took;
logging that value is what makes off-policy evaluation and offline learning possible later. The
behaviour policies explore around a sensible hand-tuned ranking (Gaussian noise on the fusion-weight
logits) and allocation rule (Bernoulli with probabilities kept away from 0 and 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from recsys_rl.exploration import Exploration
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.gaussian import log_density
from recsys_rl.state import FEED_STATE_FEATURES, LIVE_PREDICTION_SCALE, LIVE_STATE_FEATURES


class FeedPolicy(Protocol):
    version: str

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        """Actions (n, K) and their log-densities (n,) for states (n, len(FEED_STATE_FEATURES))."""
        ...


class AllocationPolicy(Protocol):
    version: str

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        """Insert decisions (n,) in {0, 1} and their log-probabilities (n,) for live states."""
        ...


@dataclass(frozen=True)
class GaussianFeedPolicy:
    """a ~ N(base_logits + states @ state_coef, diag(sigma^2)) over fusion-weight logits."""

    base_logits: np.ndarray  # (K,)
    state_coef: np.ndarray  # (D, K)
    sigma: np.ndarray  # (K,), all > 0
    version: str = "behaviour-feed-v1"

    def __post_init__(self) -> None:
        k, d = len(FEED_ACTION_NAMES), len(FEED_STATE_FEATURES)
        for name, value, shape in (
            ("base_logits", self.base_logits, (k,)),
            ("state_coef", self.state_coef, (d, k)),
            ("sigma", self.sigma, (k,)),
        ):
            if np.shape(value) != shape:
                raise ValueError(
                    f"GaussianFeedPolicy.{name} should have shape {shape}, but has {np.shape(value)}"
                )
        if np.any(self.sigma <= 0):
            raise ValueError(f"GaussianFeedPolicy.sigma should be positive, but is {self.sigma}")

    def mean(self, states: np.ndarray) -> np.ndarray:
        return self.base_logits + states @ self.state_coef

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return log_density(actions, self.mean(states), self.sigma)

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        actions = self.mean(states) + self.sigma * rng.standard_normal((states.shape[0], self.sigma.shape[0]))
        return actions, self.log_prob(states, actions)


def behaviour_feed_policy(sigma: float = 0.3, seed: int = 7) -> GaussianFeedPolicy:
    """The production-like logging policy: a hand-tuned fusion with mild state dependence plus exploration.

    Weights in typical units: watch time 1, click 0.3, like 0.3, follow/comment/share 0.2, hate 0.5.
    """
    rng = np.random.default_rng(seed)
    base = np.log(np.array([1.0, 0.3, 0.3, 0.2, 0.2, 0.2, 0.5]))
    coef = 0.1 * rng.standard_normal((len(FEED_STATE_FEATURES), len(FEED_ACTION_NAMES)))
    return GaussianFeedPolicy(base, coef, np.full(len(FEED_ACTION_NAMES), sigma))


@dataclass(frozen=True)
class BernoulliAllocationPolicy:
    """Insert with probability eps + (1 - 2 eps) * sigmoid(bias + states @ coef)."""

    bias: float
    coef: np.ndarray  # (len(LIVE_STATE_FEATURES),)
    epsilon: float = 0.05
    version: str = "behaviour-live-v1"

    def __post_init__(self) -> None:
        if np.shape(self.coef) != (len(LIVE_STATE_FEATURES),):
            raise ValueError(
                f"BernoulliAllocationPolicy.coef should have shape ({len(LIVE_STATE_FEATURES)},), "
                f"but has {np.shape(self.coef)}"
            )
        if not 0.0 < self.epsilon < 0.5:
            raise ValueError(
                f"BernoulliAllocationPolicy.epsilon should be in (0, 0.5), but is {self.epsilon}"
            )

    def insert_probability(self, states: np.ndarray) -> np.ndarray:
        logits = self.bias + states @ self.coef
        return self.epsilon + (1.0 - 2.0 * self.epsilon) / (1.0 + np.exp(-logits))

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        p = self.insert_probability(states)
        return np.where(actions == 1, np.log(p), np.log1p(-p))

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        p = self.insert_probability(states)
        actions = (rng.random(p.shape) < p).astype(np.int64)
        return actions, np.where(actions == 1, np.log(p), np.log1p(-p))


def behaviour_allocation_policy(epsilon: float = 0.05) -> BernoulliAllocationPolicy:
    """Greedy-ish logging rule: insert when predicted live watch beats the displaced video time."""
    coef = np.zeros(len(LIVE_STATE_FEATURES))
    coef[LIVE_STATE_FEATURES.index("pred_live_watch_time")] = 2.0
    coef[LIVE_STATE_FEATURES.index("pred_video_watch_displaced")] = -1.0
    coef[LIVE_STATE_FEATURES.index("hist_live_watch")] = 1.0
    return BernoulliAllocationPolicy(bias=-1.0, coef=coef, epsilon=epsilon)


@dataclass(frozen=True)
class ThresholdAllocationPolicy:
    """Greedy allocation: insert whenever the predicted live watch time exceeds ``threshold_s`` seconds.
    Deterministic, so its log-probability is 0 for the decision it takes.

    With weights it is a linear rule on more of the state: insert when predicted live watch
    - ``displaced_weight`` * predicted displaced video watch + ``history_weight`` * the user's
    ``hist_live_watch`` exceeds the threshold (the allocation benchmark's search for headroom beyond
    greedy's frontier)."""

    threshold_s: float
    version: str = "greedy-live-v1"
    displaced_weight: float = 0.0
    history_weight: float = 0.0  # seconds per unit of hist_live_watch (a minute of live watch per view)

    def insert_probability(self, states: np.ndarray) -> np.ndarray:
        # the state holds each prediction divided by its typical value
        live = states[:, LIVE_STATE_FEATURES.index("pred_live_watch_time")] * LIVE_PREDICTION_SCALE[0]
        displaced = (
            states[:, LIVE_STATE_FEATURES.index("pred_video_watch_displaced")] * LIVE_PREDICTION_SCALE[2]
        )
        history = states[:, LIVE_STATE_FEATURES.index("hist_live_watch")]
        score = live - self.displaced_weight * displaced + self.history_weight * history
        return (score > self.threshold_s).astype(np.float64)

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        return self.insert_probability(states).astype(np.int64), np.zeros(states.shape[0])


@dataclass(frozen=True)
class FixedRateAllocationPolicy:
    """The fixed-rate heuristic: insert with probability ``rate`` whatever the state."""

    rate: float
    version: str = "fixed-rate-live-v1"

    def __post_init__(self) -> None:
        if not 0.0 < self.rate < 1.0:
            raise ValueError(f"FixedRateAllocationPolicy.rate should be in (0, 1), but is {self.rate}")

    def insert_probability(self, states: np.ndarray) -> np.ndarray:
        return np.full(states.shape[0], self.rate)

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        actions = (rng.random(states.shape[0]) < self.rate).astype(np.int64)
        return actions, np.where(actions == 1, math.log(self.rate), math.log1p(-self.rate))
