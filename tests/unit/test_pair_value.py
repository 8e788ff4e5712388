"""The pair critic (issue 22): TD per funnel head learns the values a hand-built pair world implies."""

from __future__ import annotations

import numpy as np
import pytest

from recsys_rl.dataset_contract import USER_AUTHOR
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.pipelines.transition_io import parquet_table, parquet_values
from recsys_rl.signals import PAIR_SIGNALS
from recsys_rl.training.agents.policy_io import term_id
from recsys_rl.training.pair_value import (
    PairTransitions,
    PairValueConfig,
    monte_carlo_returns,
    train_pair_value,
)

GAMMA = 0.8
STAY = 0.75
# a loyal pair meets with a click each time, a gift every other time on average and a return; after each
# meeting it stays loyal with probability STAY, else lapses for good, and a lapsed pair brings nothing.
# So a lapsed pair is worth 0 and a loyal one V = r + GAMMA * STAY * V, that is r / (1 - GAMMA * STAY)
LOYAL_REWARD = np.array([1.0, 0.0, 0.5, 1.0], np.float32)


def _world(rows: int, seed: int = 0) -> PairTransitions:
    rng = np.random.default_rng(seed)
    loyal = rng.random(rows) < 0.5
    stays = loyal & (rng.random(rows) < STAY)
    states = rng.normal(size=(rows, len(PAIR_STATE_FEATURES))).astype(np.float32)
    states[:, 2] = loyal  # "followed": what tells the two kinds apart
    next_states = rng.normal(size=states.shape).astype(np.float32)
    next_states[:, 2] = stays
    rewards = np.where(loyal[:, None], LOYAL_REWARD, 0.0).astype(np.float32)
    return PairTransitions(states, next_states, rewards, pairs=np.arange(rows), steps=np.zeros(rows, int))


@pytest.mark.parametrize("critic", ["mtcl", "independent"])
def test_each_head_learns_its_discounted_value_and_never_treats_a_row_as_the_end(critic):
    config = PairValueConfig(discounts=(GAMMA,) * 4, hidden=(32, 32))
    value = train_pair_value(_world(4000), config, critic=critic, steps=1500, seed=3)
    probe = _world(200, seed=1)
    values = value.values(probe.states).numpy()
    loyal = probe.states[:, 2] == 1.0
    expected = LOYAL_REWARD / (1.0 - GAMMA * STAY)  # 2.5, 0, 1.25, 2.5: bootstrapping every row
    np.testing.assert_allclose(values[loyal].mean(axis=0), expected, rtol=0.15, atol=0.2)
    np.testing.assert_allclose(values[~loyal].mean(axis=0), 0.0, atol=0.3)


def test_rows_come_from_the_surfaces_parquet_shards():
    rows = [
        {
            "surface": USER_AUTHOR,
            "user_id": "u",
            "author_id": "a",
            "item_id": f"v{i}",
            "item_type": "video",
            "pair_step": i,
            "event_time_ms": i,
            "next_event_time_ms": i + 1,
            "truncated": False,
            "state": [float(i)] * len(PAIR_STATE_FEATURES),
            "next_state": [float(i + 1)] * len(PAIR_STATE_FEATURES),
            "gap_days": 1.0,
            "reward": [1.0, 0.0, float(i), 1.0],
        }
        for i in range(3)
    ]
    tables = [
        parquet_table(USER_AUTHOR, [parquet_values(r) for r in rows[:2]]),
        parquet_table(USER_AUTHOR, []),
    ]
    tables.append(parquet_table(USER_AUTHOR, [parquet_values(rows[2])]))
    data = PairTransitions.from_tables(tables)
    assert data.states.shape == (3, len(PAIR_STATE_FEATURES)) and data.rewards.shape == (3, len(PAIR_SIGNALS))
    np.testing.assert_array_equal(data.next_states[:, 0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(data.rewards[:, PAIR_SIGNALS.index("gift")], [0.0, 1.0, 2.0])
    assert data.pairs.tolist() == [0, 0, 0] and data.steps.tolist() == [0, 1, 2]


def test_monte_carlo_returns_run_back_along_each_pairs_chain_in_any_row_order():
    # pair 7: three meetings; pair 3: one; rows shuffled
    rewards = np.array(
        [[0, 0, 2, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]], np.float32
    )  # pair 7 step 2, pair 3 step 0, pair 7 step 1, pair 7 step 0
    data = PairTransitions(
        np.zeros((4, 6)),
        np.zeros((4, 6)),
        rewards,
        pairs=np.array([7, 3, 7, 7]),
        steps=np.array([2, 0, 1, 0]),
    )
    returns, following = monte_carlo_returns(data, (0.5, 0.5, 0.5, 0.1))
    step_2 = [0, 0, 2, 1]
    step_1 = [1 + 0.5 * 0, 1 + 0.5 * 0, 0 + 0.5 * 2, 0 + 0.1 * 1]
    step_0 = [1 + 0.5 * step_1[0], 0 + 0.5 * step_1[1], 0 + 0.5 * step_1[2], 0 + 0.1 * step_1[3]]
    np.testing.assert_allclose(returns, [step_2, [1, 0, 0, 0], step_1, step_0])
    assert following.tolist() == [0, 0, 1, 2]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"discounts": (0.9,)}, "one value per signal"),
        ({"task_weights": (1.0, -1.0, 1.0, 1.0)}, "task_weights should be >= 0"),
        ({"target_update": 0.0}, r"target_update should be in \(0, 1\]"),
        ({"discounts": (1.0, 0.9, 0.9, 0.9)}, r"in \[0, 1\)"),
        ({"term_coefficients": (1.0,)}, "term_coefficients should have one value per signal"),
        ({"term_weight": 0.0}, "term_weight and term_weight_std should be positive"),
        ({"term_weight_std": -0.1}, "term_weight and term_weight_std should be positive"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        PairValueConfig(**settings)


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
