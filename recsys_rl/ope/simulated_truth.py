"""Simulator ground truth beside the OPE estimates, for logs that a simulated world wrote.

A transition dataset records the Kafka offsets it read, not what produced the records: the pipeline cannot
tell simulated traffic from production's, and its manifest has no simulator section. So the world is
*declared* by whoever runs ``recsys-rl evaluate`` (``SimulatorWorld``: the users, seed and days of the
``simulate`` run, the demo or ``recsys_rl.pipelines.simulated.simulated_dataset`` that wrote the logs)
rather than read from the data, and the declaration is checked as far as the logs allow: the behaviour
policy run in the declared world must reproduce the logged on-policy value of the main signal
(``world_check``). A wrong seed on a world of the same size can still pass that check, so the page says the
world was declared, not recorded.

The truth of a policy is measured on both of OPE's scales, each comparable with one family of estimators
(``recsys_rl.ope.offline_evaluation``): ``per_decision``, the mean reward per decision of the surface (feed
request or allocation decision), and ``per_session_discounted``, the mean discounted return of a session
that holds at least one such decision, with the signals' default discounts. Rewards are the simulator's
expected responses of what was viewed (``expected_reward``), which have the draws' mean without their
noise. Several fresh episode seeds on the declared world are pooled (``repeats``; the logs used episode
seed 0, so the truth is independent of them). Standard errors treat each user of each repeat as one
cluster, since a user's sessions share the user's tastes; candidate and baseline run on the same world and
episode seeds, so their difference is paired user by user, which is far tighter than either value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from recsys_rl import signals
from recsys_rl.ope.logged import LoggedSteps
from recsys_rl.sim.behaviour import AllocationPolicy, FeedPolicy
from recsys_rl.sim.ground_truth import discounted_returns, run_days, step_within_episode
from recsys_rl.sim.parameters import SimConfig

SCALES = ("per_decision", "per_session_discounted")
#: How many standard errors the logged behaviour value may sit from the declared world's before the page
#: says the world does not match the logs; four keeps false alarms rare over many evaluations.
WORLD_CHECK_Z = 4.0


@dataclass(frozen=True)
class SimulatorWorld:
    """The simulated world that wrote the logs, as declared by the evaluation's caller (module docstring)."""

    users: int = 0  # users of the simulated run; with seed it fixes the world
    seed: int = 0  # world seed of the simulated run
    days: int = 1  # days the logs span: later days' users depend on earlier ones' satisfaction
    repeats: int = 8  # fresh episode seeds pooled into the truth; its standard error shrinks as 1/sqrt
    episode_seed: int = 1  # the first of them; the logged run used 0

    def __post_init__(self) -> None:
        for name in ("users", "days", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"simulator {name} should be at least 1, but is {getattr(self, name)}")
        for name in ("seed", "episode_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"simulator {name} should be non-negative, but is {getattr(self, name)}")


@dataclass(frozen=True)
class ClusterSums:
    """Per (repeat, user) cluster, one scale: reward sums (C, S) and the count they are divided by (C,)."""

    sums: np.ndarray
    counts: np.ndarray

    @property
    def value(self) -> np.ndarray:
        return self.sums.sum(axis=0) / self.counts.sum()

    def influence(self) -> np.ndarray:
        """Each cluster's linearised contribution to the ratio mean, (C, S): sums to zero."""
        return (self.sums - self.value[None, :] * self.counts[:, None]) / self.counts.sum()


@dataclass(frozen=True)
class PolicyTruth:
    """A policy pair's run in the declared world: cluster sums per scale, and sessions seen."""

    scales: dict[str, ClusterSums]
    sessions: int


def simulate_truth(
    world: SimulatorWorld, surface: str, feed_policy: FeedPolicy, allocation_policy: AllocationPolicy
) -> PolicyTruth:
    """Run the policies ``world.repeats`` times on the declared world; the surface's per-cluster sums."""
    names = signals.FEED_SIGNALS if surface == "feed" else signals.LIVE_SIGNALS
    gammas = np.asarray(signals.discounts(names))
    users = world.users
    clusters = world.repeats * users
    decision_sums, decision_counts = np.zeros((clusters, len(names))), np.zeros(clusters)
    session_sums, session_counts = np.zeros((clusters, len(names))), np.zeros(clusters)
    sessions = 0
    for repeat in range(world.repeats):
        logs = run_days(
            SimConfig(n_users=users),
            feed_policy,
            allocation_policy,
            seed=world.seed,
            episode_seed=world.episode_seed + repeat,
            days=world.days,
        )
        parts = [day.feed if surface == "feed" else day.live for day in logs]
        session = np.concatenate([p.session for p in parts])
        user = np.concatenate([p.user for p in parts]).astype(np.int64)
        reward = np.concatenate([p.expected_reward for p in parts]).astype(np.float64)
        page = np.concatenate([p.page for p in parts])
        cluster = repeat * users + user
        np.add.at(decision_sums, cluster, reward)
        np.add.at(decision_counts, cluster, 1.0)
        ids, returns = discounted_returns(session, step_within_episode(session, page), reward, gammas)
        # a session belongs to one user: its first row names it (ids and first rows both in sorted order)
        first = np.unique(session, return_index=True)[1]
        session_cluster = repeat * users + user[first]
        np.add.at(session_sums, session_cluster, returns)
        np.add.at(session_counts, session_cluster, 1.0)
        sessions += int(ids.size)
    return PolicyTruth(
        {
            "per_decision": ClusterSums(decision_sums, decision_counts),
            "per_session_discounted": ClusterSums(session_sums, session_counts),
        },
        sessions,
    )


def _standard_error(influence: np.ndarray) -> np.ndarray:
    clusters = influence.shape[0]
    return np.sqrt(clusters / max(clusters - 1, 1) * np.square(influence).sum(axis=0))


def compare(
    names: tuple[str, ...], candidate: PolicyTruth, baseline: PolicyTruth
) -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
    """Per scale and signal: both values, their difference and the relative difference, each with its
    standard error; the difference and relative ones paired over the same clusters (delta method)."""
    out: dict[str, Any] = {}
    for scale in SCALES:
        new, old = candidate.scales[scale], baseline.scales[scale]
        a, b = new.value, old.value
        u_a, u_b = new.influence(), old.influence()
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = (a - b) / np.abs(b)
            # d/da (a - b)/|b| = 1/|b|, d/db = -a sign(b) / b^2
            u_relative = u_a / np.abs(b) - u_b * (a * np.sign(b) / np.square(b))
        figures = {
            "candidate": (a, _standard_error(u_a)),
            "baseline": (b, _standard_error(u_b)),
            "difference": (a - b, _standard_error(u_a - u_b)),
            "relative": (relative, _standard_error(u_relative)),
        }
        out[scale] = {
            signal: {
                part: {"value": _number(value[i]), "stderr": _number(error[i])}
                for part, (value, error) in figures.items()
            }
            for i, signal in enumerate(names)
        }
    return out


def world_check(logged: LoggedSteps, behaviour: PolicyTruth) -> dict[str, Any]:
    """Does the declared world reproduce the logs? The logged per-decision mean of the main signal against
    the behaviour policy's truth there, in combined standard errors (the logged one clustered by user).

    Only meaningful where the behaviour policy logged the data; a dataset of served decisions (the demo's
    later days) fails it, which is right: the truth of that world is not the logs' truth.
    """
    main = logged.signals[0]
    column = logged.rewards[:, 0]
    _, cluster = np.unique(logged.user, return_inverse=True)
    sums = np.bincount(cluster, weights=column)
    counts = np.bincount(cluster).astype(np.float64)
    logged_value = ClusterSums(sums[:, None], counts)
    truth = behaviour.scales["per_decision"]
    logged_error = float(_standard_error(logged_value.influence())[0])
    truth_error = float(_standard_error(truth.influence())[0])
    value, expected = float(logged_value.value[0]), float(truth.value[0])
    z = (value - expected) / float(np.hypot(logged_error, truth_error))
    return {
        "signal": main,
        "scale": "per_decision",
        "logged": {"value": _number(value), "stderr": _number(logged_error)},
        "behaviour_truth": {"value": _number(expected), "stderr": _number(truth_error)},
        "z": _number(z),
        "limit": WORLD_CHECK_Z,
        "passed": bool(np.isfinite(z) and abs(z) <= WORLD_CHECK_Z),
    }


def ground_truth(
    world: SimulatorWorld,
    names: tuple[str, ...],
    candidate: PolicyTruth,
    baseline: PolicyTruth,
    check: dict[str, Any],
) -> dict[str, Any]:
    """The report's ``ground_truth`` section."""
    return {
        "source": "simulator",
        "world": asdict(world),
        "declared": "the simulated world was declared by the evaluation's caller (the dataset does not "
        "record its source), and checked only by whether the behaviour policy reproduces the logged value",
        "rewards": "expected responses of the viewed items (the draws' mean, without their noise)",
        "sessions": {"candidate": candidate.sessions, "baseline": baseline.sessions},
        "scales": compare(names, candidate, baseline),
        "world_check": check,
    }


def _number(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
