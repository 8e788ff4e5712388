"""Monte-Carlo ground-truth values of any policy pair, per signal: what OPE estimates are checked against.

The value of a signal is the expected discounted return of an episode (a session, DESIGN 3.1) with the
signal's default discount from the registry, estimated by running the policies in the simulator on the
same world that produced the logs (the same seed) and averaging over sessions. The standard error comes
with it, so a check can say "within k standard errors" rather than trust a single number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recsys_rl import signals
from recsys_rl.sim.behaviour import AllocationPolicy, FeedPolicy
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulator import DayLog, Simulator


@dataclass(frozen=True)
class Estimate:
    mean: float
    stderr: float
    n: int


@dataclass(frozen=True)
class PolicyValues:
    """Per-signal episode values of a feed policy and an allocation policy run together."""

    feed: dict[str, Estimate]  # FEED_SIGNALS, discounted over the session's feed requests
    live: dict[str, Estimate]  # LIVE_SIGNALS, discounted over the session's allocation decisions
    # undiscounted mean reward per feed request, FEED_SIGNALS, from the expected responses of the viewed
    # videos (the same mean as the draws', without their noise)
    per_request: dict[str, float]
    episodes: int
    return_rate: float  # fraction of users active on days after the first (long-term effect)
    # (n_users, FEED_SIGNALS): each user's expected responses (the simulator's probabilities and means of
    # the items they viewed, not the draws) summed over every request of every day, undiscounted, 0 for a
    # user who never came. The multi-day objective and constraints: a user kept away a day adds nothing
    # that day, so return counts. Two runs on one world and episode seed have the same users: their
    # difference, user by user, is the paired comparison.
    per_user: np.ndarray


def discounted_returns(
    episode: np.ndarray, step: np.ndarray, rewards: np.ndarray, gammas: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode discounted returns sum_t gamma^t r_t for rewards (n, S) with per-column gammas (S,).

    ``step`` is each row's index within its episode; rows may come in any order. Returns the episode ids
    present and their returns (episodes, S).
    """
    ids, inverse = np.unique(episode, return_inverse=True)
    weighted = rewards * np.power(gammas[None, :], step[:, None])
    out = np.zeros((ids.size, rewards.shape[1]))
    np.add.at(out, inverse, weighted)
    return ids, out


def step_within_episode(episode: np.ndarray, order_key: np.ndarray) -> np.ndarray:
    """Index of each row within its episode, ordered by ``order_key`` (rows may come in any order)."""
    order = np.lexsort((order_key, episode))
    sorted_ep = episode[order]
    first = np.r_[True, sorted_ep[1:] != sorted_ep[:-1]]
    position = np.arange(order.size)
    rank_sorted = position - np.maximum.accumulate(np.where(first, position, 0))
    rank = np.empty_like(rank_sorted)
    rank[order] = rank_sorted
    return rank


def _estimates(names: tuple[str, ...], returns: np.ndarray) -> dict[str, Estimate]:
    n = returns.shape[0]
    if n == 0:
        return {name: Estimate(float("nan"), float("nan"), 0) for name in names}
    means = returns.mean(axis=0)
    errors = returns.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.full(len(names), np.inf)
    return {name: Estimate(float(m), float(e), n) for name, m, e in zip(names, means, errors, strict=True)}


def evaluate_logs(days: list[DayLog], n_users: int) -> PolicyValues:
    """Per-signal values from simulated days (the simulator's own record, not the Kafka events)."""
    feed_names, live_names = signals.FEED_SIGNALS, signals.LIVE_SIGNALS
    feed_session = np.concatenate([d.feed.session for d in days])
    feed_page = np.concatenate([d.feed.page for d in days])
    feed_reward = np.concatenate([d.feed.reward for d in days])
    _, feed_returns = discounted_returns(
        feed_session, feed_page, feed_reward, np.asarray(signals.discounts(feed_names))
    )
    feed_user = np.concatenate([d.feed.user for d in days])
    per_user = np.zeros((n_users, len(feed_names)))
    np.add.at(per_user, feed_user, np.concatenate([d.feed.expected_reward for d in days]))
    live_session = np.concatenate([d.live.session for d in days])
    live_step = step_within_episode(live_session, np.concatenate([d.live.page for d in days]))
    live_reward = np.concatenate([d.live.reward for d in days])
    live_ids, live_returns = discounted_returns(
        live_session, live_step, live_reward, np.asarray(signals.discounts(live_names))
    )
    # sessions with no allocation decision contribute a zero live return
    all_live = np.zeros((np.unique(feed_session).size, len(live_names)))
    all_live[np.searchsorted(np.unique(feed_session), live_ids)] = live_returns
    later = days[1:]
    return_rate = float(np.mean([d.returning_users for d in later]) / n_users) if later else float("nan")
    return PolicyValues(
        feed=_estimates(feed_names, feed_returns),
        live=_estimates(live_names, all_live),
        per_request=dict(
            zip(
                feed_names,
                map(float, np.concatenate([d.feed.expected_reward for d in days]).mean(axis=0)),
                strict=True,
            )
        ),
        episodes=int(feed_returns.shape[0]),
        return_rate=return_rate,
        per_user=per_user,
    )


def monte_carlo_values(
    config: SimConfig,
    feed_policy: FeedPolicy,
    allocation_policy: AllocationPolicy,
    *,
    seed: int,
    episode_seed: int = 1,
    days: int = 1,
) -> PolicyValues:
    """Run the policies for ``days`` days on the world of ``seed`` and return their per-signal values.

    ``episode_seed`` draws fresh episodes on that world: the logs a ``simulate`` run wrote use episode
    seed 0, so the default keeps ground truth independent of the data it is compared with. More users
    (``config.n_users``) or days give more episodes and a smaller standard error.
    """
    logs = run_days(config, feed_policy, allocation_policy, seed=seed, episode_seed=episode_seed, days=days)
    return evaluate_logs(logs, config.n_users)


def run_days(
    config: SimConfig,
    feed_policy: FeedPolicy,
    allocation_policy: AllocationPolicy,
    *,
    seed: int,
    episode_seed: int = 1,
    days: int = 1,
) -> list[DayLog]:
    """The simulator's record of ``days`` days of the policies on the world of ``seed``."""
    if days < 1:
        raise ValueError(f"days should be at least 1, but is {days}")
    sim = Simulator(config, seed, episode_seed=episode_seed)
    return [sim.run_day(feed_policy, allocation_policy) for _ in range(days)]
