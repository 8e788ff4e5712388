"""What decides: loaded registry policies and the deterministic fallbacks, behind one small interface.

Every decision is a function of (state, seed). The seed comes from the request id (``request_seed``),
so a retried request gets the same action and the same logged propensity.

Propensities. With exploration on, the action is drawn from the policy and the logged value is the
log-density (feed, Gaussian over fusion-weight logits) or log-probability (allocation, Bernoulli) of
the action actually served. With exploration off, the policy's mode is served (the Gaussian mean; an
insert when its probability is at least one half) and the logged value is the policy's log-density or
log-probability *at that action*: the action itself was chosen deterministically, so the value is not
a behaviour propensity. The decision record says which it was (``action_selection``: sampled or mode,
set by ``serving.service``), and offline evaluation leaves out the sessions of records logged that way.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from recsys_rl.gaussian import ScalarGaussian, log_normaliser
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy


def request_seed(request_id: str) -> tuple[int, int]:
    """Two non-negative int32 words from the sha256 of the request id (stable across processes)."""
    digest = hashlib.sha256(request_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1, int.from_bytes(digest[4:8], "big") >> 1


#: PCG64's stream increment for every decision (odd, as PCG requires); the seed sets the state.
_PCG_INCREMENT = 0xDA3E39CB94B95BDB_1D2A6C1B8A3F9E27
_threads = threading.local()


def seeded_generator(seed: tuple[int, int]) -> np.random.Generator:
    """This thread's generator, set to the PCG64 state ``seed`` names: the same draws for the same seed.

    ``np.random.default_rng(seed)`` would hash the seed through a SeedSequence first, about 15 us a
    call (a twentieth of a Rank's handler); the seed is already a hash of the request id, so it is
    used as the state directly. Not to be kept across calls: the next decision on the thread resets it.
    """
    generator = getattr(_threads, "generator", None)
    if generator is None:
        generator = _threads.generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (seed[0] << 31) | seed[1], "inc": _PCG_INCREMENT},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return generator


class Decider(Protocol):
    version: str

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        """The action for one state vector and its log-propensity (see the module docstring)."""
        ...


def load_feed_decider(policy_dir: Path, version: str) -> GaussianDecider:
    """A registry feed policy, verified against its manifest, decided by its numpy twin.

    ``numpy_actor`` checks that twin against the SavedModel at load time; per request it saves the
    TensorFlow call, which was a quarter of a Rank's CPU.
    """
    # TensorFlow is imported only by a server that loads a model.
    from recsys_rl.training.agents.policy_io import load_feed_policy, numpy_actor

    return GaussianDecider(numpy_actor(load_feed_policy(policy_dir, verify=True)), version)


class GaussianPolicy(Protocol):
    sigma: np.ndarray

    def mean(self, states: np.ndarray) -> np.ndarray: ...

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class GaussianDecider:
    """A Gaussian feed policy with a state-independent std: a registry policy's numpy twin, or the
    hand-tuned behaviour ranking the simulator logs with (the fallback: no files, always available)."""

    policy: GaussianPolicy
    version: str

    @cached_property
    def _log_normaliser(self) -> float:
        return log_normaliser(self.policy.sigma)

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        mean = self.policy.mean(state[None, :].astype(np.float64))[0]
        return gaussian_draw(mean, self.policy.sigma, self._log_normaliser, seed, explore)


def gaussian_draw(
    mean: np.ndarray, sigma: np.ndarray, normaliser: float, seed: tuple[int, int], explore: bool
) -> tuple[np.ndarray, float]:
    """An action around ``mean`` (its mode without ``explore``) and its log-density, from ``seed``.

    The density comes from the drawn noise itself, which is the standardised residual: a policy's
    network runs once per request, not a second time inside ``log_prob``. ``normaliser`` is
    ``gaussian.log_normaliser(sigma)``, kept by the decider: with it the density is one numpy call
    (a request's numpy calls cost a busy server several microseconds each).
    """
    if not explore:
        return mean, normaliser
    noise = seeded_generator(seed).standard_normal(mean.shape)
    return mean + sigma * noise, normaliser - 0.5 * float(noise @ noise)


def load_allocation_decider(policy_dir: Path, version: str) -> BernoulliAllocationDecider:
    """A registry allocation policy (SL-MGAC's exported actor), verified against its manifest.

    The SavedModel answers directly: one Allocate is one small network call, well inside the budget,
    so no numpy twin is kept for it.
    """
    from recsys_rl.training.agents.policy_io import load_allocation_policy

    return BernoulliAllocationDecider(load_allocation_policy(policy_dir, verify=True), version)


class InsertProbability(Protocol):
    def insert_probability(self, states: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class BernoulliAllocationDecider:
    """Insert with the policy's probability (explore) or when it is at least one half: a registry
    allocation policy, or the heuristic rule the simulator logs with (insert when predicted live watch
    beats the displaced video time; the fallback)."""

    policy: InsertProbability
    version: str

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        p = float(self.policy.insert_probability(state[None, :].astype(np.float64))[0])
        insert = seeded_generator(seed).random() < p if explore else p >= 0.5
        return np.array([float(insert)]), float(np.log(p) if insert else np.log1p(-p))


def load_user_author_decider(policy_dir: Path, version: str) -> UserAuthorTermDecider:
    """A registry user-author value (issue 22) and the ranking term its manifest names, verified.

    Its numpy twin answers (``numpy_pair_value``, checked against the SavedModel at load): TensorFlow's
    call was a millisecond of a Rank's few.
    """
    from recsys_rl.sim.ranking_terms import PairValueTerm
    from recsys_rl.training.agents.policy_io import load_pair_value_policy, numpy_pair_value, ranking_term

    policy = load_pair_value_policy(policy_dir, verify=True)
    term = ranking_term(policy.manifest, policy_dir)
    twin = numpy_pair_value(policy)
    values = PairValueTerm(twin.values, twin.reward_std, term.coefficients)
    return UserAuthorTermDecider(values, term.weight(version), term.term_id, version)


class PairTerm(Protocol):
    def of_states(self, states: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class UserAuthorTermDecider:
    """The user-author term of a Rank: each candidate's pair value (``term.of_states``), times a weight
    whose logit is drawn from ``weight``, the Gaussian the OPE gate scores the version by.

    The weight is explored like the fusion action so that the logs support other weights; it is drawn
    from the request's own seed for this surface (``user_author_seed``), independent of the fusion
    action's draw, so each decision's propensity is a factor of its own."""

    term: PairTerm
    weight: ScalarGaussian
    term_id: str  # which term function (``policy_io.term_id``), logged with each decision
    version: str

    @cached_property
    def _mean_and_sigma(self) -> tuple[np.ndarray, np.ndarray, float]:
        mean, sigma = np.array([self.weight.mean]), np.array([self.weight.std])
        mean.flags.writeable = sigma.flags.writeable = False  # the mode is served as this very array
        return mean, sigma, log_normaliser(sigma)

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        return gaussian_draw(*self._mean_and_sigma, seed, explore)


@dataclass(frozen=True)
class NoUserAuthorTerm:
    """The user_author surface's fallback: no term, so a Rank is the fusion of its predictions alone."""

    version: str = "fallback-no-user-author-term"
    term: None = None

    def decide(self, state: np.ndarray, seed: tuple[int, int], explore: bool) -> tuple[np.ndarray, float]:
        return np.zeros(0), 0.0


def user_author_seed(request_id: str) -> tuple[int, int]:
    """The user-author weight's seed: another hash of the request id than the fusion action's
    (``request_seed``), so that the two draws are independent and each is the same on a retry."""
    return request_seed(request_id + "#user_author")


def feed_fallback() -> Decider:
    return GaussianDecider(behaviour_feed_policy(), "fallback-behaviour-feed-v1")


def allocation_fallback() -> Decider:
    return BernoulliAllocationDecider(behaviour_allocation_policy(), "fallback-behaviour-live-v1")
