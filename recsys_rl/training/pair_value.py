"""The user-author value (issue 22): each funnel signal's value of a pair's state, learnt by TD on the
``user_author`` surface of a dataset (``pipelines.user_author``).

Multi-task critic learning (MTCL, RLIV-UA): one trunk shared by every head, and heads along the funnel
click -> follow -> gift -> author_return, each later head also reading the values of the heads before it
(``MultiTaskCriticNetwork``'s funnel, detached). The dense click signal then shapes the features the
sparse heads learn from, through the shared trunk, and hands them its value as an input; each head keeps
its own discount and TD loss. ``critic="independent"`` gives every signal its own trunk and no funnel:
the comparison the benchmark makes. The paper's exact head wiring was not reachable (only its abstract
was); the stacking above is our design, to be justified by that comparison.

The critic is a state value: the surface logs no action of its own (the policy acts through one more term
in the ranking score, whose value this estimates), so the network's action input is empty. No row ends a
pair: a pair's last row before the cut-off bootstraps from the stand-in state at the cut-off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from recsys_rl import signals
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.signals import PAIR_SIGNALS
from recsys_rl.training.agents.data import TransitionDataset
from recsys_rl.training.agents.losses import critic_loss, td_targets
from recsys_rl.training.agents.networks import MultiTaskCriticNetwork

CRITICS = ("mtcl", "independent")


@dataclass(frozen=True)
class PairValueConfig:
    critic: str = "mtcl"  # "mtcl" (shared trunk, funnel heads) or "independent" (own trunks, no funnel)
    steps: int = 2_000
    batch_size: int = 256
    learning_rate: float = 1e-3
    target_update: float = 0.01  # Polyak rate of the target network the TD targets bootstrap from
    discounts: tuple[float, ...] = signals.discounts(PAIR_SIGNALS)  # per meeting of the pair
    task_weights: tuple[float, ...] = (1.0,) * len(PAIR_SIGNALS)  # each head's share of the loss
    hidden: tuple[int, ...] = (64, 64)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.critic not in CRITICS:
            raise ValueError(f"critic should be one of {list(CRITICS)}, but is {self.critic!r}")
        for name in ("discounts", "task_weights"):
            if len(getattr(self, name)) != len(PAIR_SIGNALS):
                raise ValueError(
                    f"{name} should have one value per signal {list(PAIR_SIGNALS)}, "
                    f"but has {getattr(self, name)}"
                )
        if not all(0.0 <= g < 1.0 for g in self.discounts):
            raise ValueError(f"discounts should be in [0, 1), but are {self.discounts}")


@dataclass(frozen=True)
class PairTransitions:
    """The surface's rows as arrays: states and next states (N, D), rewards (N, S) in PAIR_SIGNALS order,
    and where each row is in its pair's chain: the pair (N,) as a code and the step (N,)."""

    states: np.ndarray
    next_states: np.ndarray
    rewards: np.ndarray
    pairs: np.ndarray
    steps: np.ndarray

    @classmethod
    def from_dataset(cls, dataset: TransitionDataset) -> PairTransitions:
        """From a dataset opened on its user-author surface (``open_dataset(path, USER_AUTHOR)``)."""
        return cls.from_tables([pq.read_table(path) for path in dataset.shard_paths("parquet")])

    @classmethod
    def from_tables(cls, tables: Sequence[pa.Table]) -> PairTransitions:
        """From the surface's Parquet shards (``transition_io.parquet_table(USER_AUTHOR, ...)``)."""
        width = len(PAIR_STATE_FEATURES)

        def matrix(column: str) -> np.ndarray:
            flat = [np.asarray(t.column(column).combine_chunks().flatten(), np.float32) for t in tables]
            return np.concatenate(flat).reshape(-1, width)

        def column(name: str) -> np.ndarray:
            return np.concatenate([t.column(name).to_numpy(zero_copy_only=False) for t in tables])

        rewards = np.stack([column(f"reward_{s}") for s in PAIR_SIGNALS], axis=1).astype(np.float32)
        pairs, _ = pd.factorize(pd.Series(column("user_id")) + "\x00" + pd.Series(column("author_id")))
        return cls(matrix("state"), matrix("next_state"), rewards, pairs, column("pair_step"))


def monte_carlo_returns(data: PairTransitions, discounts: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's discounted return over the rest of its pair's chain in the data (N, S), and how many
    meetings of the chain follow it there (N,).

    The returns are censored: a chain's meetings after the data's end are missing, so a return is the
    value's Monte-Carlo estimate only where the discount has all but vanished over the meetings that
    follow (few left: compare on rows with many).
    """
    order = np.lexsort((data.steps, data.pairs))
    gammas = np.asarray(discounts, np.float64)
    returns = np.zeros(data.rewards.shape, np.float64)
    following = np.zeros(len(order), np.int64)
    later, later_count, later_pair = np.zeros(len(gammas)), 0, None
    for row in order[::-1]:
        if data.pairs[row] != later_pair:
            later, later_count, later_pair = np.zeros(len(gammas)), -1, data.pairs[row]
        returns[row] = data.rewards[row] + gammas * later
        following[row] = later_count = later_count + 1
        later = returns[row]
    return returns, following


class PairValue:
    """A trained pair critic: ``values(states)`` gives each signal's value, in that signal's units."""

    def __init__(self, network: MultiTaskCriticNetwork, reward_std: np.ndarray) -> None:
        self.network = network
        self.reward_std = reward_std

    def values(self, states: np.ndarray) -> np.ndarray:
        """(N, D) pair states -> (N, S) values."""
        return _values(self.network, tf.constant(states, tf.float32)).numpy() * self.reward_std


def _values(network: MultiTaskCriticNetwork, states: tf.Tensor) -> tf.Tensor:
    no_action = tf.zeros_like(states[:, :0])
    return network((states, no_action))[0]


def train_pair_value(data: PairTransitions, config: PairValueConfig) -> PairValue:
    """TD(0) per head on minibatches drawn with replacement, rewards in units of each signal's std.

    The loss is the squared TD error (``losses.critic_loss``): a pair's next meeting is a gamble (it may
    lapse), and the value is the expectation over it; Huber's loss, which the critics used before, learnt
    3.8 where the value is 2.5 in the tests' hand-built world."""
    tf.random.set_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    reward_std = np.maximum(data.rewards.std(axis=0), 1e-3).astype(np.float32)
    state_std = data.states.std(axis=0)
    spec = (
        tf.TensorSpec([len(PAIR_STATE_FEATURES)], tf.float32),
        tf.TensorSpec([0], tf.float32),
    )
    shared = config.critic == "mtcl"

    def network(name: str) -> MultiTaskCriticNetwork:
        critic = MultiTaskCriticNetwork(
            spec,
            PAIR_SIGNALS,
            state_mean=data.states.mean(axis=0),
            state_std=np.where(state_std < 1e-3, 1.0, state_std),
            hidden=config.hidden,
            funnel=PAIR_SIGNALS if shared else (),
            shared_trunk=shared,
            name=name,
        )
        critic.create_variables()
        return critic

    online, target = network("pair_critic"), network("pair_critic_target")
    for mine, theirs in zip(target.variables, online.variables, strict=True):
        mine.assign(theirs)
    optimizer = tf.keras.optimizers.Adam(config.learning_rate)
    gammas = tf.constant(config.discounts, tf.float32)
    weights = tf.constant(config.task_weights, tf.float32)
    scaled_rewards = data.rewards / reward_std

    @tf.function(autograph=False)  # plain Python control flow only; autograph would rewrite TF-Agents' too
    def step(states, next_states, rewards):
        targets = td_targets(rewards, tf.ones_like(rewards[:, 0]), gammas, _values(target, next_states))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weights * critic_loss(_values(online, states), targets))
        optimizer.apply_gradients(
            zip(tape.gradient(loss, online.trainable_variables), online.trainable_variables, strict=True)
        )
        for mine, theirs in zip(target.variables, online.variables, strict=True):
            mine.assign(mine + config.target_update * (theirs - mine))
        return loss

    for _ in range(config.steps):
        rows = rng.integers(0, len(data.states), config.batch_size)
        step(data.states[rows], data.next_states[rows], scaled_rewards[rows])
    return PairValue(online, reward_std)
