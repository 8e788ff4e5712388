"""The pair critic's pieces by hand (recsys_rl.training.pair_value): one training step's TD and waiting
targets, losses and target update in plain numpy, the served values, the heads' wiring, the rows read
from the surface's shards, Monte-Carlo returns and the settings' checks.

``test_pair_value.py`` trains the critic to convergence on hand-built worlds (a minute); these run in
seconds and pin each equation, so that a wrong discount, index or weight is caught by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.pipelines.transition_io import parquet_table, parquet_values
from recsys_rl.signals import PAIR_SIGNALS
from recsys_rl.training.agents.data import statistics_of
from recsys_rl.training.agents.policy_io import term_id
from recsys_rl.training.agents.specs import pair_transition_spec
from recsys_rl.training.pair_value import (
    PairTransitions,
    PairValueAgent,
    PairValueConfig,
    _as_transition,
    monte_carlo_returns,
    train_pair_value,
)

S, D = len(PAIR_SIGNALS), len(PAIR_STATE_FEATURES)
DAYS = PAIR_STATE_FEATURES.index("log_days_since_last")
CONFIG = PairValueConfig(
    discounts=(0.9, 0.5, 0.7, 0.3),
    daily_discount=0.8,
    task_weights=(1.0, 2.0, 0.5, 1.5),
    target_update=0.5,  # far from the critic after one step, so a target read as the critic shows
    hidden=(8, 8),
)


def _rows(n: int, seed: int) -> PairTransitions:
    """Random pairs' rows: rewards of every scale, waits of 0 to 9 days, a third waiting at the cut-off."""
    rng = np.random.default_rng(seed)
    rewards = np.column_stack(
        [rng.random(n) < 0.6, rng.random(n) < 0.1, 3.0 * (rng.random(n) < 0.2), rng.random(n) < 0.5]
    ).astype(np.float32)
    return PairTransitions(
        rng.normal(size=(n, D)).astype(np.float32),
        rng.normal(size=(n, D)).astype(np.float32),
        rewards,
        pairs=np.arange(n),
        steps=np.zeros(n, int),
        gap_days=rng.uniform(0.0, 9.0, n),
        truncated=rng.random(n) < 0.35,
    )


def _values(network, states: np.ndarray) -> np.ndarray:
    return network((tf.constant(states), tf.zeros([len(states), 0])))[0].numpy().astype(np.float64)


def _stats(data: PairTransitions):
    """The rows' statistics, as training takes them: the surface logs no action."""
    return statistics_of(data.states, data.rewards, np.zeros((len(data.states), 0)))


def _agent(critic: str = "mtcl") -> tuple[PairValueAgent, PairTransitions]:
    data = _rows(64, seed=0)
    tf.keras.utils.set_random_seed(1)
    agent = PairValueAgent(_stats(data), CONFIG, critic=critic)
    agent.train(_as_transition(data, np.arange(len(data.states))))  # targets and networks now differ
    return agent, data


@pytest.mark.parametrize("critic", ["mtcl", "independent"])
def test_one_step_fits_each_head_to_its_td_target_and_the_waiting_value_to_the_wait(critic):
    agent, data = _agent(critic)
    experience = _as_transition(data, np.arange(len(data.states)))
    # two rows end (no row of the surface does today; a discount of 0 must still stop the bootstrap)
    discount = np.ones(len(data.states), np.float32)
    discount[:2] = 0.0
    experience = experience._replace(
        next_time_step=experience.next_time_step._replace(discount=tf.constant(discount))
    )
    gap, truncated = data.gap_days, data.truncated
    counter = int(agent.train_step_counter.numpy())
    waited = gap * tf.random.stateless_uniform([len(gap)], [counter, 7]).numpy()
    waiting_states = data.next_states.copy()
    waiting_states[:, DAYS] = np.log1p(waited)

    following = np.where(
        truncated[:, None],
        _values(agent._waiting_target, data.next_states),
        np.asarray(CONFIG.discounts) * _values(agent._target, data.next_states),
    )
    rewards = data.rewards / agent.reward_std
    daily = CONFIG.daily_discount
    targets = rewards + (discount * daily**gap)[:, None] * following
    waiting_targets = (discount * daily ** (gap - waited))[:, None] * following
    td = np.mean(0.5 * (_values(agent._critic, data.states) - targets) ** 2, axis=0)
    squared = 0.5 * (_values(agent._waiting, waiting_states) - waiting_targets) ** 2
    waiting = np.sum(gap[:, None] * squared, axis=0) / gap.sum()
    before = {
        "critic": [v.numpy() for v in agent._critic.variables],
        "waiting": [v.numpy() for v in agent._waiting.variables],
        "target": [v.numpy() for v in agent._target.variables],
        "waiting_target": [v.numpy() for v in agent._waiting_target.variables],
    }

    info = agent.train(experience)

    np.testing.assert_allclose([info.extra[f"td_{s}"] for s in PAIR_SIGNALS], td, rtol=1e-4)
    np.testing.assert_allclose([info.extra[f"waiting_{s}"] for s in PAIR_SIGNALS], waiting, rtol=1e-4)
    assert float(info.loss) == pytest.approx(
        np.sum(np.asarray(CONFIG.task_weights) * (td + waiting)), rel=1e-4
    )
    assert int(agent.train_step_counter.numpy()) == counter + 1
    # both learnt networks stepped, and each target moved half way to its network
    for name, target in (("critic", "target"), ("waiting", "waiting_target")):
        learnt = getattr(agent, f"_{name}").variables
        assert any(not np.allclose(b, v.numpy()) for b, v in zip(before[name], learnt, strict=True))
        for old, new, moved in zip(
            before[target], learnt, getattr(agent, f"_{target}").variables, strict=True
        ):
            np.testing.assert_allclose(moved.numpy(), 0.5 * old + 0.5 * new.numpy(), rtol=1e-5, atol=1e-6)


def test_the_served_values_are_the_target_networks_in_each_signals_units():
    agent, data = _agent()
    served = agent.policy.values(data.states[:16]).numpy()
    np.testing.assert_allclose(served, _values(agent._target, data.states[:16]) * agent.reward_std, rtol=1e-5)
    assert not np.allclose(served, _values(agent._critic, data.states[:16]) * agent.reward_std, rtol=1e-3)
    np.testing.assert_allclose(agent.reward_std, np.maximum(data.rewards.std(axis=0), 1e-3), rtol=1e-6)
    step = agent.policy.action(_as_transition(data, np.arange(16)).time_step)
    np.testing.assert_allclose(step.action.numpy(), served, rtol=1e-6)


def test_mtcl_shares_one_trunk_and_stacks_the_funnel_where_independent_heads_have_their_own():
    mtcl, _ = _agent("mtcl")
    independent, _ = _agent("independent")
    assert mtcl._critic._shared_trunk and mtcl._critic._funnel == tuple(range(S))
    assert not independent._critic._shared_trunk and independent._critic._funnel == ()
    for agent in (mtcl, independent):  # the waiting value and the targets are wired as the critic
        for copy in (agent._waiting, agent._target, agent._waiting_target):
            assert [v.shape for v in copy.variables] == [v.shape for v in agent._critic.variables]
    with pytest.raises(ValueError, match="critic should be one of"):
        PairValueAgent(_stats(_rows(2, seed=0)), CONFIG, critic="x")


def test_a_new_agent_is_mtcl_of_its_width_with_every_target_equal_to_its_network():
    data = _rows(16, seed=0)
    counter = tf.Variable(3, dtype=tf.int64)
    agent = PairValueAgent(_stats(data), CONFIG, train_step_counter=counter)
    assert agent._critic._shared_trunk  # the default is MTCL
    assert agent.training_data_spec == pair_transition_spec()
    widths = {v.shape[-1] for v in agent._critic.trainable_variables if "kernel" in v.name}
    assert 8 in widths and 64 not in widths  # the config's trunk, not the default one
    for learnt, target in ((agent._critic, agent._target), (agent._waiting, agent._waiting_target)):
        for a, b in zip(learnt.variables, target.variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(agent._critic.variables[0].numpy(), agent._waiting.variables[0].numpy())
    agent.train(_as_transition(data, np.arange(16)))
    assert int(counter.numpy()) == 4
    with pytest.raises(NotImplementedError, match=r"from train\(\); there is no loss\(\)"):
        agent.loss(_as_transition(data, np.arange(16)))


def test_training_in_process_is_seeded_and_reads_the_rows_it_draws():
    data = _rows(48, seed=2)
    once = train_pair_value(data, CONFIG, steps=3, batch_size=8, seed=4).values(data.states).numpy()
    again = train_pair_value(data, CONFIG, steps=3, batch_size=8, seed=4).values(data.states).numpy()
    other = train_pair_value(data, CONFIG, steps=3, batch_size=8, seed=5).values(data.states).numpy()
    np.testing.assert_array_equal(once, again)
    assert not np.allclose(once, other)
    assert not train_pair_value(
        data, CONFIG, critic="independent", steps=1, batch_size=8
    )._critic._shared_trunk
    single = PairTransitions(**{f: getattr(data, f)[:1] for f in PairTransitions.__dataclass_fields__})
    assert np.all(
        np.isfinite(train_pair_value(single, CONFIG, steps=2, batch_size=4).values(data.states).numpy())
    )
    batch = _as_transition(data, np.array([5, 2, 5]))
    np.testing.assert_array_equal(batch.time_step.observation.numpy(), data.states[[5, 2, 5]])
    np.testing.assert_array_equal(batch.next_time_step.observation.numpy(), data.next_states[[5, 2, 5]])
    np.testing.assert_array_equal(batch.next_time_step.reward.numpy(), data.rewards[[5, 2, 5]])
    np.testing.assert_array_equal(batch.next_time_step.discount.numpy(), [1.0, 1.0, 1.0])
    info = batch.action_step.info
    np.testing.assert_allclose(info["gap_days"].numpy(), data.gap_days[[5, 2, 5]], rtol=1e-6)
    np.testing.assert_array_equal(info["truncated"].numpy(), data.truncated[[5, 2, 5]].astype(np.float32))


def test_rows_come_from_the_surfaces_parquet_shards():
    rows = [
        {
            "surface": USER_AUTHOR,
            "user_id": "u" if i < 3 else "w",
            "author_id": "a",
            "request_id": f"r{i}",
            "item_id": f"v{i}",
            "item_type": "video",
            "pair_step": i,
            "event_time_ms": i,
            "next_event_time_ms": i + 1,
            "truncated": i == 2,
            "state": [float(i)] * D,
            "next_state": [float(i + 1)] * D,
            "gap_days": 1.0 + i,
            "reward": [1.0, 0.0, float(i), 1.0],
        }
        for i in range(4)
    ]
    tables = [
        parquet_table(USER_AUTHOR, [parquet_values(r) for r in rows[:2]]),
        parquet_table(USER_AUTHOR, []),
    ]
    tables.append(parquet_table(USER_AUTHOR, [parquet_values(r) for r in rows[2:]]))
    data = PairTransitions.from_tables(tables)
    assert data.states.shape == (4, D) and data.rewards.shape == (4, S)
    assert data.states.dtype == data.next_states.dtype == data.rewards.dtype == np.float32
    assert data.truncated.dtype == bool
    np.testing.assert_array_equal(data.states[:, -1], [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_array_equal(data.next_states[:, 0], [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(data.rewards[:, PAIR_SIGNALS.index("gift")], [0.0, 1.0, 2.0, 3.0])
    assert data.pairs.tolist() == [0, 0, 0, 1] and data.steps.tolist() == [0, 1, 2, 3]
    assert data.gap_days.tolist() == [1.0, 2.0, 3.0, 4.0] and data.truncated.tolist() == [
        False,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize("daily", [1.0, 0.5])  # 1 by default
def test_monte_carlo_returns_run_back_along_each_pairs_chain_in_any_row_order(daily):
    # pair 7: three meetings, 1 then 2 days apart; pair 3: one; rows shuffled
    rewards = np.array(
        [[0, 0, 2, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]], np.float32
    )  # pair 7 step 2, pair 3 step 0, pair 7 step 1, pair 7 step 0
    data = PairTransitions(
        np.zeros((4, 6)),
        np.zeros((4, 6)),
        rewards,
        pairs=np.array([7, 3, 7, 7]),
        steps=np.array([2, 0, 1, 0]),
        gap_days=np.array([3.0, 5.0, 2.0, 1.0]),  # a chain's last gap runs to the cut-off: never read
        truncated=np.array([True, True, False, False]),
    )
    gammas = (0.5, 0.5, 0.5, 0.1)
    returns, following = (
        monte_carlo_returns(data, gammas, daily) if daily != 1 else monte_carlo_returns(data, gammas)
    )
    g1, g2 = 0.5 * daily, 0.5 * daily**2  # per meeting, times per day to the next meeting
    step_2 = [0, 0, 2, 1]
    step_1 = [1 + g2 * 0, 1 + g2 * 0, 0 + g2 * 2, 0 + 0.1 * daily**2 * 1]
    step_0 = [1 + g1 * step_1[0], 0 + g1 * step_1[1], 0 + g1 * step_1[2], 0 + 0.1 * daily * step_1[3]]
    np.testing.assert_allclose(returns, [step_2, [1, 0, 0, 0], step_1, step_0])
    assert following.tolist() == [0, 0, 1, 2] and following.dtype.kind == "i"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"discounts": (0.9,)}, r"discounts should have one value per signal .*, but has \(0.9,\)"),
        ({"task_weights": (1.0, -1.0, 1.0, 1.0)}, r"task_weights should be >= 0, but are \(1.0, -1.0"),
        ({"target_update": 0.0}, r"target_update should be in \(0, 1\], but is 0.0"),
        ({"target_update": 1.5}, r"target_update should be in \(0, 1\]"),
        ({"daily_discount": 0.0}, r"daily_discount should be in \(0, 1\], but is 0.0"),
        ({"daily_discount": 1.5}, r"daily_discount should be in \(0, 1\], but is 1.5"),
        ({"discounts": (1.0, 0.9, 0.9, 0.9)}, r"discounts should be in \[0, 1\), but are \(1.0"),
        ({"discounts": (0.9, -0.1, 0.9, 0.9)}, r"discounts should be in \[0, 1\)"),
        ({"learning_rate": 0.0}, "learning_rate should be positive, but is 0.0"),
        ({"hidden": ()}, r"hidden should list positive layer sizes, but is \(\)"),
        ({"hidden": (8, 0)}, r"hidden should list positive layer sizes, but is \(8, 0\)"),
        ({"term_coefficients": (1.0,)}, "term_coefficients should have one value per signal"),
        ({"term_weight": 0.0}, "term_weight and term_weight_std should be positive, but are 0.0 and 0.3"),
        ({"term_weight_std": -0.1}, "term_weight and term_weight_std should be positive"),
        ({"term_weight_std": 0.0}, "term_weight and term_weight_std should be positive"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        PairValueConfig(**settings)


def test_settings_at_the_edge_of_every_range_are_accepted():
    PairValueConfig(
        discounts=(0.0,) * S, task_weights=(0.0,) * S, daily_discount=1.0, target_update=1.0, hidden=(1,)
    )


def test_the_term_id_names_the_term_function_and_not_the_weights_distribution():
    manifest = {
        "sha256": {
            "saved_model.pb": "a1",
            "variables/variables.index": "b2",
            "variables/variables.data": "c3",
        },
        "reward_std": [1.0, 0.1, 0.01, 0.5],
        "term": {"coefficients": [1.0, 1.0, 1.0, 1.0], "weight_logit_mean": 0.0, "weight_logit_std": 0.3},
        "version": "ua-1",
    }
    same = {
        **manifest,
        "sha256": {**manifest["sha256"], "saved_model.pb": "other graph"},
        "term": {**manifest["term"], "weight_logit_mean": 1.0, "weight_logit_std": 0.1},
        "version": "ua-2",
    }
    assert term_id(same) == term_id(manifest)
    for changed in (
        {"sha256": {**manifest["sha256"], "variables/data": "trained on"}},
        {"reward_std": [1.0, 0.1, 0.02, 0.5]},
        {"term": {**manifest["term"], "coefficients": [0.0, 1.0, 0.0, 0.0]}},
    ):
        assert term_id({**manifest, **changed}) != term_id(manifest)
