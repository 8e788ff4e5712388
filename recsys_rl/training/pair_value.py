"""The user-author value (issue 22): each funnel signal's value of a pair's state, learnt by TD on the
``user_author`` surface of a dataset (``pipelines.user_author``).

Multi-task critic learning (MTCL, RLIV-UA): one trunk shared by every head, and heads along the funnel
click -> follow -> gift -> author_return, each later head also reading the values of the heads before it
(``MultiTaskCriticNetwork``'s funnel, detached). The dense click signal then shapes the features the
sparse heads learn from, through the shared trunk, and hands them its value as an input; each head keeps
its own discount and TD loss. ``train --algo ua-independent`` gives every signal its own trunk and
no funnel: the comparison the benchmark makes (``ua-mtcl`` is the above). The paper's exact head
wiring was not reachable (only its abstract was); the stacking above is our design, to be justified by
that comparison.

The critic is a state value: the surface logs no action of its own (the policy acts through one more term
in the ranking score, whose value this estimates), so the network's action input is empty.

**Time between meetings, and the log's end.** A later meeting counts the head's discount once per
meeting and ``daily_discount`` once per day until it comes (a semi-MDP's discount over the time a
transition takes, Bradtke & Duff 1995): a pair that meets tomorrow is worth more than one that meets
next month. No row ends a pair, but a pair's last row before the cut-off has no next meeting, only the
pair *waiting* at the cut-off (``pipelines.user_author``). Its value from there is not the value of a
meeting there: most pairs in the logs meet once and not again for weeks, if ever, and standing a meeting
in at the cut-off for them valued every pair as if it always met again (on a 1,000-user week of the
benchmark's logs, at the registry's discounts, the critics' mean click value was 1.8 times the held-out
rows' returns, and no head beat predicting the mean return).
So a second network of the same wiring learns the *waiting value* U: the value, discount of the next
meeting included, of a pair some days after a meeting with no meeting since. Every row teaches it: a
moment drawn uniformly between the row's meeting and its next state, valued as that next state's
(the next meeting's V, or U at the cut-off) discounted over the rest of the wait, and weighted by
the wait's length: U at a wait of w days averages over the pairs waiting at w, each once, and a row
stands for gap_days of them. Unweighted, a pair that came back after an hour counted as much at w = 0
as one that waited a week, so the pairs that came back soon were counted many times over (on the
benchmark's logs, 3,000 users for a week, the click and return heads put 2.0-2.5 times the replayed
run's value on what follows the cut-off, and 0.2 too much on the mean return value of 0.67; weighted,
1.4-1.9 times and 0.1.) What is left (the benchmark's critics value the held-out rows at 1.07-1.15 times
their expected returns, gift 0.8) comes from the logs' days, not from U's design. The simulated world
starts with no pair history, so over a week's logs its pairs are far from a steady state (of a day's
pairs, 12% had met before on day 1, 44% on day 6, 75% on day 20), and the pair state has nothing that
dates a row. The same network fitted by regression to the replayed run's expected returns
(``bench/user_author.py``, "regression on the truth") is right on average (0.96-1.00) but a time average:
1.07-1.12 times the truth within a day of the cut-off, 0.74-0.85 six days or more before it (up to 4% of
the first is the replay's end, 14 days past the log). TD bootstraps each row from its next state, which
comes later, where that average is too high, and U at the cut-off is the latest of all, so the error
builds up (click, follow and return; the rare gift runs the other way): 1.22-1.31 within a day of the
cut-off, 0.82-0.88 six days before it, 1.07-1.15 on average
(and 1.25 on the pairs waiting at the cut-off even with the true value as U's target there: U is the same
time average). A row that ends
waiting bootstraps from U at the cut-off, which pairs that waited as long earlier in the log, and did or
did not meet again, have taught. Waits longer than the log are taught by nothing but U itself: in the
test's hand-built world (``test_pair_value``) the values land 3-4% off the true ones from them, where the
stand-in put a pair that rarely comes back at 1.7 times its value. Serving reads V only: a candidate is a
meeting now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf
import tensorflow_probability as tfp
from tf_agents.agents import tf_agent
from tf_agents.policies import tf_policy
from tf_agents.trajectories import policy_step, time_step, trajectory
from tf_agents.utils import common

from recsys_rl import signals
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.signals import PAIR_SIGNALS
from recsys_rl.training.agents.base import FeedAgent, _in_cross_replica_context, init_offline_agent
from recsys_rl.training.agents.data import TransitionDataset, TransitionStatistics, statistics_of
from recsys_rl.training.agents.losses import critic_loss
from recsys_rl.training.agents.networks import MultiTaskCriticNetwork
from recsys_rl.training.agents.specs import (
    GAP_DAYS_KEY,
    LOG_PROPENSITY_KEY,
    TRUNCATED_KEY,
    pair_time_step_spec,
    pair_transition_spec,
    pair_values_spec,
)

#: How the heads get their features, by ``train --algo``: MTCL's shared trunk and funnel, or a trunk each.
CRITICS = {"ua-mtcl": "mtcl", "ua-independent": "independent"}


@dataclass(frozen=True)
class PairValueConfig:
    """The pair critic's settings (``TrainConfig.pair``); the algorithm picks the heads' wiring."""

    learning_rate: float = 1e-3
    target_update: float = 0.01  # Polyak rate of the target network the TD targets bootstrap from
    discounts: tuple[float, ...] = signals.discounts(PAIR_SIGNALS)  # per meeting of the pair
    # and per day from one meeting to the next: without it a pair met once is valued as if it met again
    # for sure (every row bootstraps), so its value is a lifetime of meetings it may never have
    daily_discount: float = 0.8
    task_weights: tuple[float, ...] = (1.0,) * len(PAIR_SIGNALS)  # each head's share of the loss
    hidden: tuple[int, ...] = (64, 64)
    # The ranking term serving builds from the values (issue 22), exported with the policy:
    # term = sum_s term_coefficients_s * value_s / reward_std_s, added to a candidate's fusion score times
    # exp(logit), with the logit drawn from N(log(term_weight), term_weight_std) when serving explores, so
    # that the logs support other weights for the OPE gate.
    term_coefficients: tuple[float, ...] = (1.0,) * len(PAIR_SIGNALS)
    term_weight: float = 1.0
    term_weight_std: float = 0.3

    def __post_init__(self) -> None:
        for name in ("discounts", "task_weights", "term_coefficients"):
            if len(getattr(self, name)) != len(PAIR_SIGNALS):
                raise ValueError(
                    f"{name} should have one value per signal {list(PAIR_SIGNALS)}, "
                    f"but has {getattr(self, name)}"
                )
        if not all(0.0 <= g < 1.0 for g in self.discounts):
            raise ValueError(f"discounts should be in [0, 1), but are {self.discounts}")
        if any(w < 0 for w in self.task_weights):
            raise ValueError(f"task_weights should be >= 0, but are {self.task_weights}")
        if not 0 < self.daily_discount <= 1:
            raise ValueError(f"daily_discount should be in (0, 1], but is {self.daily_discount}")
        if not 0 < self.target_update <= 1:
            raise ValueError(f"target_update should be in (0, 1], but is {self.target_update}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate should be positive, but is {self.learning_rate}")
        if not self.term_weight > 0 or not self.term_weight_std > 0:
            raise ValueError(
                f"term_weight and term_weight_std should be positive, but are {self.term_weight} and "
                f"{self.term_weight_std}"
            )
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden should list positive layer sizes, but is {self.hidden}")


_DAYS_SINCE_LAST = PAIR_STATE_FEATURES.index("log_days_since_last")


def _waiting_states(next_states: tf.Tensor, waited_days: tf.Tensor) -> tf.Tensor:
    """The pair ``waited_days`` after a meeting: the history of the row's next state (with the meeting),
    ``waited_days`` since it. Exact where the next state is the waiting pair at the cut-off or a meeting
    on a later day; a meeting later the same day has the history through the day before instead (a state
    sees only finished days, ``pipelines.user_author``), so its few hours' waits read a little less."""
    days = tf.math.log1p(waited_days)[:, None]
    return tf.concat([next_states[:, :_DAYS_SINCE_LAST], days, next_states[:, _DAYS_SINCE_LAST + 1 :]], 1)


def _values(network: MultiTaskCriticNetwork, states: tf.Tensor, training: bool = False) -> tf.Tensor:
    """Each head's value (B, S) of states (B, D), in reward-std units: the action input is empty."""
    return network((states, tf.zeros_like(states[:, :0])), training=training)[0]


class PairValuePolicy(tf_policy.TFPolicy):
    """What the trained critic serves: a pair's state -> each pair signal's value in its own units.

    A TF-Agents policy so that ``PolicySaver`` exports it like every other policy; its "action" is the
    value vector, deterministic, and the ranking term that combines them is serving's (issue 22)."""

    def __init__(self, critic: MultiTaskCriticNetwork, reward_std: np.ndarray) -> None:
        super().__init__(pair_time_step_spec(), pair_values_spec(), clip=False)
        self._critic = critic
        self._reward_std = tf.constant(reward_std, tf.float32)

    def values(self, states) -> tf.Tensor:
        """(N, D) pair states -> (N, S) values, in each signal's units."""
        return _values(self._critic, tf.convert_to_tensor(states, tf.float32)) * self._reward_std

    def _variables(self):
        return self._critic.variables

    def _distribution(self, time_step, policy_state):
        values = self.values(time_step.observation)
        return policy_step.PolicyStep(tfp.distributions.Deterministic(values), policy_state, ())


class PairValueAgent(tf_agent.TFAgent):
    """TD(0) per head on the user-author surface, rewards in units of each signal's std, a Polyak target.

    The policy serves that target, the average of the last hundred or so steps, not the network after the
    last one: a follow comes once in about 1,400 of the benchmark's pair rows, so a batch of 512 holds one
    or none, and the last Adam step's value of a rare head is the luck of the last few batches (on the
    benchmark's logs, over three seeds per critic, the last step's mean gift value ranged from 0.01 to 1.2
    times the held-out rows' expected return and the average's from 0.7 to 1.4; follow from 0.7 to 2.2
    against 0.9 to 1.4). The dense heads come out the same either way.

    The loss is the squared TD error (``losses.critic_loss``): a pair's next meeting is a gamble (it may
    lapse), and the value is the expectation over it; Huber's loss learnt 3.8 where the value is 2.5 in
    the tests' hand-built world. ``mtcl``: one trunk and the funnel click -> follow -> gift ->
    author_return; ``independent``: a trunk per head, no funnel (the benchmark's comparison)."""

    def __init__(
        self,
        stats: TransitionStatistics,
        config: PairValueConfig,
        *,
        critic: str = "mtcl",
        train_step_counter: tf.Variable | None = None,
    ) -> None:
        if critic not in CRITICS.values():
            raise ValueError(f"critic should be one of {sorted(CRITICS.values())}, but is {critic!r}")
        tf.Module.__init__(self, name=f"PairValue_{critic}")
        self._config = config
        self._reward_std = np.asarray(stats.reward_std, np.float32)
        self._reward_scale = tf.constant(1.0 / stats.reward_std, tf.float32)
        self._gammas = tf.constant(config.discounts, tf.float32)
        self._daily_discount = tf.constant(config.daily_discount, tf.float32)
        self._task_weights = tf.constant(config.task_weights, tf.float32)
        shared = critic == "mtcl"
        self._critic = MultiTaskCriticNetwork(
            (pair_time_step_spec().observation, tf.TensorSpec([0], tf.float32)),
            PAIR_SIGNALS,
            state_mean=stats.state_mean,
            state_std=stats.state_std,
            logged_action_coef=stats.logged_action_coef,
            hidden=config.hidden,
            funnel=PAIR_SIGNALS if shared else (),
            shared_trunk=shared,
            name="pair_critic",
        )
        self._critic.create_variables()
        self._waiting = self._critic.copy(name="waiting_pair_critic")
        self._waiting.create_variables()
        self._target = self._critic.copy(name="target_pair_critic")
        self._waiting_target = self._critic.copy(name="target_waiting_pair_critic")
        for target in (self._target, self._waiting_target):
            target.create_variables()
        common.soft_variables_update(self._learnt_variables, self._target_variables, 1.0)
        self._optimizer = tf.keras.optimizers.Adam(config.learning_rate)
        policy = PairValuePolicy(self._target, stats.reward_std)
        init_offline_agent(self, policy, pair_transition_spec(), train_step_counter)

    @property
    def config(self) -> PairValueConfig:
        return self._config

    @property
    def reward_std(self) -> np.ndarray:
        """Each signal's reward std in the training data: the unit of the critic's raw outputs."""
        return self._reward_std

    def train_kwargs(self, step: int) -> dict:
        return {}

    @property
    def _learnt_variables(self) -> list[tf.Variable]:
        return [*self._critic.variables, *self._waiting.variables]

    @property
    def _target_variables(self) -> list[tf.Variable]:
        return [*self._target.variables, *self._waiting_target.variables]

    def _train(self, experience: trajectory.Transition, weights=None) -> tf_agent.LossInfo:
        info = experience.action_step.info
        gap_days, truncated = info[GAP_DAYS_KEY], info[TRUNCATED_KEY][:, None] > 0
        rewards = experience.next_time_step.reward * self._reward_scale[None, :]
        next_states = experience.next_time_step.observation
        # the value of what follows, as of the row's next state: the pair's next meeting, or the pair
        # still waiting at the cut-off (its waiting value holds that meeting's discount already)
        following = tf.where(
            truncated,
            _values(self._waiting_target, next_states),
            self._gammas[None, :] * _values(self._target, next_states),
        )
        continues = experience.next_time_step.discount
        targets = rewards + (continues * self._daily_discount**gap_days)[:, None] * following
        # a moment of the wait between the row's meeting and its next state, and its value from there
        waited = gap_days * tf.random.stateless_uniform(tf.shape(gap_days), [self.train_step_counter, 7])
        waiting_targets = (continues * self._daily_discount ** (gap_days - waited))[:, None] * following
        with tf.GradientTape() as tape:
            per_head = critic_loss(_values(self._critic, experience.time_step.observation, True), targets)
            waiting_per_head = critic_loss(
                _values(self._waiting, _waiting_states(next_states, waited), True),
                waiting_targets,
                row_weights=gap_days,
            )
            total = tf.reduce_sum(self._task_weights * (per_head + waiting_per_head))
        variables = [*self._critic.trainable_variables, *self._waiting.trainable_variables]
        FeedAgent._apply(total, tape, variables, self._optimizer)
        tau = self._config.target_update
        _in_cross_replica_context(
            lambda: common.soft_variables_update(self._learnt_variables, self._target_variables, tau)
        )
        self.train_step_counter.assign_add(1)
        extra = {f"td_{name}": per_head[i] for i, name in enumerate(PAIR_SIGNALS)}
        extra |= {f"waiting_{name}": waiting_per_head[i] for i, name in enumerate(PAIR_SIGNALS)}
        return tf_agent.LossInfo(loss=total, extra=extra)

    def _initialize(self):
        return tf.no_op()

    def _loss(self, experience, weights=None, training=False):
        raise NotImplementedError("the pair critic reports its losses from train(); there is no loss()")


@dataclass(frozen=True)
class PairTransitions:
    """The surface's rows as arrays: states and next states (N, D), rewards (N, S) in PAIR_SIGNALS order,
    where each row is in its pair's chain: the pair (N,) as a code and the step (N,), and the days (N,)
    until the pair's next meeting (until the cut-off on a pair's last row)."""

    states: np.ndarray
    next_states: np.ndarray
    rewards: np.ndarray
    pairs: np.ndarray
    steps: np.ndarray
    gap_days: np.ndarray
    truncated: np.ndarray

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
        return cls(
            matrix("state"),
            matrix("next_state"),
            rewards,
            pairs,
            column("pair_step"),
            column("gap_days"),
            column("truncated").astype(bool),
        )


def monte_carlo_returns(
    data: PairTransitions, discounts: Sequence[float], daily_discount: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's discounted return over the rest of its pair's chain in the data (N, S), and how many
    meetings of the chain follow it there (N,). A later meeting counts ``discounts`` once per meeting
    and ``daily_discount`` to the power of the days it comes after, as the critic's TD targets do.

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
        returns[row] = data.rewards[row] + gammas * daily_discount ** data.gap_days[row] * later
        following[row] = later_count = later_count + 1
        later = returns[row]
    return returns, following


def train_pair_value(
    data: PairTransitions,
    config: PairValueConfig,
    *,
    critic: str = "mtcl",
    steps: int = 2_000,
    batch_size: int = 256,
    seed: int = 0,
) -> PairValuePolicy:
    """The agent trained in process on arrays, minibatches drawn with replacement: for comparisons that
    hold rows out (the benchmark's MTCL against independent heads), where ``recsys-rl train`` reads a
    whole dataset."""
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    stats = statistics_of(data.states, data.rewards, np.zeros((len(data.states), 0)))
    agent = PairValueAgent(stats, config, critic=critic)
    step = common.function(agent.train, autograph=False)
    for _ in range(steps):
        rows = rng.integers(0, len(data.states), batch_size)
        step(_as_transition(data, rows))
    return agent.policy


def _as_transition(data: PairTransitions, rows: np.ndarray) -> trajectory.Transition:
    """Rows of ``data`` as the batch ``read_transitions`` gives: no row ends its pair."""
    n = len(rows)
    ones = tf.ones([n], tf.float32)
    current = time_step.TimeStep(
        step_type=tf.fill([n], time_step.StepType.MID),
        reward=tf.zeros([n, len(PAIR_SIGNALS)], tf.float32),
        discount=ones,
        observation=tf.constant(data.states[rows]),
    )
    following = current._replace(
        reward=tf.constant(data.rewards[rows]), observation=tf.constant(data.next_states[rows])
    )
    info = {
        LOG_PROPENSITY_KEY: tf.zeros([n], tf.float32),
        GAP_DAYS_KEY: tf.constant(data.gap_days[rows], tf.float32),
        TRUNCATED_KEY: tf.constant(data.truncated[rows], tf.float32),
    }
    action = policy_step.PolicyStep(tf.zeros([n, 0], tf.float32), (), info)
    return trajectory.Transition(current, action, following)
