"""What decides: loaded registry policies and the deterministic fallbacks, behind one small interface.

Every decision is a function of (state, seed). The seed comes from the request id (``request_seed``),
so a retried request gets the same action and the same logged propensity.

Propensities. With exploration on, the action is drawn from the policy and the logged value is the
log-density (feed, Gaussian over fusion-weight logits) or log-probability (allocation, Bernoulli) of
the action actually served. With exploration off, the policy's mode is served (the Gaussian mean; an
insert when its probability is at least one half) and the logged value is the policy's log-density or
log-probability *at that action*: the action itself was chosen deterministically, so the value is not
a behaviour propensity, and importance-weighted OPE should not use records logged that way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from recsys_rl.sim.policies import (
    BernoulliAllocationPolicy,
    GaussianFeedPolicy,
    behaviour_allocation_policy,
    behaviour_feed_policy,
)


def request_seed(request_id: str) -> tuple[int, int]:
    """Two non-negative int32 words from the sha256 of the request id (stable across processes)."""
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1, int.from_bytes(digest[4:8], "big") >> 1


class Decider(Protocol):
    version: str

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        """The action for one state vector and its log-propensity (see the module docstring)."""
        ...


@dataclass(frozen=True)
class SavedModelFeedDecider:
    """A registry feed policy: the SavedModel's stateless-seeded ``sample_action``, or its mean."""

    policy: Any  # recsys_rl.agents.policy_io.SavedFeedPolicy (typed loosely: TensorFlow loads lazily)
    version: str
    # The one traced signature of ``sample_action``, called directly: the restored function's dispatch
    # (matching the inputs to a signature on every call) cost as much as the model itself.
    sample_action: Any
    to_tensor: Any  # tf.constant

    @classmethod
    def load(cls, policy_dir: Path, version: str) -> SavedModelFeedDecider:
        # TensorFlow is imported only by a server that loads a model.
        import tensorflow as tf

        from recsys_rl.agents.policy_io import load_feed_policy

        policy = load_feed_policy(policy_dir, verify=True)
        (sample_action,) = policy.model.sample_action.concrete_functions
        return cls(policy, version, sample_action, tf.constant)

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        states = state[None, :]
        if explore:
            out = self.sample_action(
                {
                    "observation": self.to_tensor(states.astype(np.float32)),
                    "seed": self.to_tensor(np.array([seed], np.int32)),
                }
            )
            return out["action"].numpy()[0].astype(np.float64), float(out["log_probability"].numpy()[0])
        action = self.policy.mean(states)
        return action[0], float(self.policy.log_prob(states, action)[0])


@dataclass(frozen=True)
class GaussianFallbackDecider:
    """The hand-tuned behaviour ranking the simulator logs with: no model files, always available."""

    policy: GaussianFeedPolicy
    version: str

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        states = state[None, :].astype(np.float64)
        action = self.policy.mean(states)
        if explore:
            noise = np.random.default_rng(seed).standard_normal(action.shape)
            action = action + self.policy.sigma * noise
        return action[0], float(self.policy.log_prob(states, action)[0])


@dataclass(frozen=True)
class BernoulliAllocationDecider:
    """The heuristic allocation rule (insert when predicted live watch beats the displaced video time)."""

    policy: BernoulliAllocationPolicy
    version: str

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        p = float(self.policy.insert_probability(state[None, :].astype(np.float64))[0])
        insert = np.random.default_rng(seed).random() < p if explore else p >= 0.5
        return np.array([float(insert)]), float(np.log(p) if insert else np.log1p(-p))


def feed_fallback() -> Decider:
    return GaussianFallbackDecider(behaviour_feed_policy(), "fallback-behaviour-feed-v1")


def allocation_fallback() -> Decider:
    return BernoulliAllocationDecider(behaviour_allocation_policy(), "fallback-behaviour-live-v1")
