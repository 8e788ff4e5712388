"""Builds the agent for an algorithm name of ``recsys_rl.training.agents.algorithms``."""

from __future__ import annotations

import tensorflow as tf

from recsys_rl.training.agents.algorithms import ALL_ALGORITHMS
from recsys_rl.training.agents.allocation import VARIANTS, AllocationConfig, SLMGACAgent
from recsys_rl.training.agents.base import AgentConfig, FeedAgent
from recsys_rl.training.agents.baselines import BehaviourCloningAgent, RCPOAgent
from recsys_rl.training.agents.data import TransitionStatistics
from recsys_rl.training.agents.tscac import TSCACAgent
from recsys_rl.training.pair_value import CRITICS, PairValueAgent, PairValueConfig


def build_agent(
    algorithm: str,
    stats: TransitionStatistics,
    config: AgentConfig,
    *,
    stage_one_steps: int,
    train_step_counter: tf.Variable | None = None,
) -> FeedAgent:
    common = {"train_step_counter": train_step_counter}
    if algorithm in ("tscac", "tscac-dpg"):
        return TSCACAgent(
            stats, config, stage_one_steps=stage_one_steps, deterministic=algorithm == "tscac-dpg", **common
        )
    if algorithm == "bc":
        return BehaviourCloningAgent(stats, config, **common)
    critics = {"rcpo": "single", "rcpo-mc": "multi", "ac-main": "main"}
    if algorithm in critics:
        return RCPOAgent(stats, config, critic=critics[algorithm], **common)
    if algorithm in VARIANTS:
        raise ValueError(
            f"{algorithm!r} is a live-allocation algorithm: build it with build_allocation_agent"
        )
    raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(ALL_ALGORITHMS)}")


def build_allocation_agent(
    algorithm: str,
    stats: TransitionStatistics,
    config: AllocationConfig,
    *,
    train_step_counter: tf.Variable | None = None,
) -> SLMGACAgent:
    """SL-MGAC or one of its comparison variants (``recsys_rl.training.agents.allocation.VARIANTS``)."""
    if algorithm not in VARIANTS:
        raise ValueError(f"{algorithm!r} is not a live-allocation algorithm; those are {sorted(VARIANTS)}")
    group_routing, supervised = VARIANTS[algorithm]
    names = {"sl-mgac": "SLMGAC", "sl-mgac-nosl": "SLMGACNoSupervised", "ac-single-group": "SingleGroupAC"}
    return SLMGACAgent(
        stats,
        config,
        group_routing=group_routing,
        supervised=supervised,
        train_step_counter=train_step_counter,
        name=names[algorithm],
    )


def build_pair_value_agent(
    algorithm: str,
    stats: TransitionStatistics,
    config: PairValueConfig,
    *,
    train_step_counter: tf.Variable | None = None,
) -> PairValueAgent:
    """The user-author critic, with MTCL's or independent heads (``recsys_rl.training.pair_value``)."""
    if algorithm not in CRITICS:
        raise ValueError(f"{algorithm!r} is not a user-author algorithm; those are {sorted(CRITICS)}")
    return PairValueAgent(stats, config, critic=CRITICS[algorithm], train_step_counter=train_step_counter)
