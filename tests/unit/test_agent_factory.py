"""Every feed algorithm name builds its agent, and the names say what the agents are."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from recsys_rl import signals
from recsys_rl.state import FEED_STATE_FEATURES
from recsys_rl.training.agents.algorithms import ALGORITHMS, ALLOCATION_ALGORITHMS
from recsys_rl.training.agents.base import AgentConfig, gammas_for
from recsys_rl.training.agents.data import TransitionStatistics
from recsys_rl.training.agents.factory import build_agent

SMALL = AgentConfig(actor_hidden=(8,), critic_hidden=(8,), head_hidden=4)
K = len(signals.FEED_SIGNALS)


def _stats() -> TransitionStatistics:
    d = len(FEED_STATE_FEATURES)
    return TransitionStatistics(
        state_mean=np.zeros(d),
        state_std=np.ones(d),
        reward_std=np.ones(K),
        reward_mean=np.zeros(K),
        action_mean=np.zeros(K),
        logged_action_coef=np.zeros((d + 1, K)),
        rows=10,
    )


def test_each_feed_algorithm_builds_an_agent_of_its_own():
    agents = {name: build_agent(name, _stats(), SMALL, stage_one_steps=1) for name in ALGORITHMS}
    assert len({agent.name for agent in agents.values()}) == len(ALGORITHMS)
    # the deterministic-policy-gradient variant serves its mean with a fixed spread; TSCAC learns it
    assert agents["tscac"].learns_std and not agents["tscac-dpg"].learns_std


def test_unknown_and_allocation_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown algorithm 'tscac-det'; known: .*'tscac-dpg'"):
        build_agent("tscac-det", _stats(), SMALL, stage_one_steps=1)
    allocation = next(iter(ALLOCATION_ALGORITHMS))
    with pytest.raises(ValueError, match="is a live-allocation algorithm"):
        build_agent(allocation, _stats(), SMALL, stage_one_steps=1)


def test_one_configured_discount_replaces_every_heads_default():
    defaults = gammas_for(signals.FEED_SIGNALS, SMALL).numpy()
    np.testing.assert_allclose(defaults, signals.discounts(signals.FEED_SIGNALS), rtol=1e-6)
    myopic = gammas_for(signals.FEED_SIGNALS, dataclasses.replace(SMALL, discount=0.0)).numpy()
    np.testing.assert_array_equal(myopic, np.zeros(K))
    # the agents read it: the myopic control of bench/policy_quality.py is the same TSCAC, discount 0
    agent = build_agent("tscac", _stats(), dataclasses.replace(SMALL, discount=0.0), stage_one_steps=1)
    np.testing.assert_array_equal(agent._gammas.numpy(), np.zeros(K))


@pytest.mark.parametrize("discount", [-0.1, 1.0])
def test_a_discount_outside_zero_to_one_is_refused(discount):
    with pytest.raises(ValueError, match=rf"discount should be in \[0, 1\) or None, but is {discount}"):
        AgentConfig(discount=discount)
