"""A feed policy with one more term in each candidate's ranking score (issue 22), for the simulator.

The user-author value enters the ranking as a term of its own beside the fusion of the candidate's
predictions: score = fusion(predictions, action) + weight * term(candidate). ``TermRanking`` wraps any
feed policy (its fusion action, and so its propensity, unchanged) with such a term; the simulator adds
``candidate_scores`` to the fusion scores (``Simulator._run_page``). Two terms:

* ``PairValueTerm``: the trained user-author critic's values of the candidate's pair state, combined
  per signal in reward-std units (the critic's own scale, so a weight of 1 on a signal means "one
  typical meeting's worth");
* ``FollowProbabilityTerm``: the candidate's predicted follow probability in typical units, the
  supervised follow boost the benchmark holds the user-author value against;
* ``ExpectedFollowTerm``: an oracle for reference lines (``bench/follow_ceiling.py``), the world's own
  expected follow of the candidate, net of a price on its expected hate: what a perfectly informed
  follow term can buy, which says how much of a term's limit is the world's rather than its model's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from recsys_rl import signals
from recsys_rl.exploration import Exploration
from recsys_rl.fusion import FEED_ACTION_NAMES, PREDICTION_SCALE
from recsys_rl.sim.behaviour import FeedPolicy
from recsys_rl.sim.simulator import PageContext

_FOLLOW = FEED_ACTION_NAMES.index("follow")
_HATE = FEED_ACTION_NAMES.index("hate")


@dataclass(frozen=True)
class FollowProbabilityTerm:
    """Each candidate's predicted follow probability, in units of a typical view's (fusion's scale)."""

    name: str = "follow-boost"

    def __call__(self, context: PageContext) -> np.ndarray:
        return context.predictions[..., _FOLLOW] / PREDICTION_SCALE[_FOLLOW]


@dataclass(frozen=True)
class ExpectedFollowTerm:
    """The world's expected follow of each candidate less ``hate_price`` times its expected hate, each in
    a typical view's units (fusion's scale). An oracle: it reads the simulator's expected responses
    (``PageContext.expected_responses``), which no ranker has, so it is a reference line, never a policy.

    The hate price is there because any term added to the fusion score dilutes the fusion's own weight on
    hate: a follow term alone raises hate before it raises follows much, whatever it knows, and a
    constrained designer would price hate back in (a Lagrangian term)."""

    hate_price: float = 0.0
    name: str = "follow-oracle"
    reads_expected_responses: ClassVar[bool] = True

    def __call__(self, context: PageContext) -> np.ndarray:
        expected = context.expected_responses
        if expected is None:
            raise ValueError(
                f"{self.name} reads the world's expected responses: run it as a TermRanking term"
            )
        return (
            expected[..., _FOLLOW] / PREDICTION_SCALE[_FOLLOW]
            - self.hate_price * expected[..., _HATE] / PREDICTION_SCALE[_HATE]
        )


@dataclass(frozen=True)
class PairValueTerm:
    """``values`` (pair states (N, D) -> (N, S) values in signal units, ``signals.PAIR_SIGNALS``) combined
    as sum_s coefficients_s * value_s / reward_std_s over each candidate's pair."""

    values: Callable[[np.ndarray], np.ndarray]
    reward_std: np.ndarray  # (S,) the critic's reward scale, from its training data
    coefficients: Sequence[float] = (1.0,) * len(signals.PAIR_SIGNALS)
    name: str = "user-author"

    def __post_init__(self) -> None:
        for name in ("reward_std", "coefficients"):
            if np.shape(getattr(self, name)) != (len(signals.PAIR_SIGNALS),):
                raise ValueError(
                    f"PairValueTerm.{name} should have one value per signal {list(signals.PAIR_SIGNALS)}, "
                    f"but is {getattr(self, name)}"
                )

    def __call__(self, context: PageContext) -> np.ndarray:
        return self.of_states(context.pair_states)

    def of_states(self, states: np.ndarray) -> np.ndarray:
        """The term (...) of pair states (..., D): the simulator's pages and serving's candidates alike."""
        values = self.values(states.reshape(-1, states.shape[-1]))
        per_signal = np.asarray(self.coefficients) / np.asarray(self.reward_std)
        return (values @ per_signal).reshape(states.shape[:-1])


@dataclass(frozen=True)
class TermRanking:
    """``base``'s fusion action, and ``weight * term`` added to each candidate's score."""

    base: FeedPolicy
    term: Callable[[PageContext], np.ndarray]
    weight: float

    @property
    def version(self) -> str:
        return f"{self.base.version}+{self.weight:g}*{getattr(self.term, 'name', 'term')}"

    @property
    def reads_expected_responses(self) -> bool:
        """Whether the simulator should show the term the world's expected responses (an oracle term)."""
        return getattr(self.term, "reads_expected_responses", False)

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        return self.base.act(states, rng)

    def candidate_scores(self, context: PageContext) -> np.ndarray:
        return self.weight * self.term(context)
