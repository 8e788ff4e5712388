"""Builds the agent for an algorithm name of ``recsys_rl.agents.algorithms``."""

from __future__ import annotations

import tensorflow as tf

from recsys_rl.agents.algorithms import ALGORITHMS
from recsys_rl.agents.base import AgentConfig, FeedAgent
from recsys_rl.agents.baselines import BehaviourCloningAgent, RCPOAgent
from recsys_rl.agents.data import TransitionStatistics
from recsys_rl.agents.tscac import TSCACAgent


def build_agent(
    algorithm: str,
    stats: TransitionStatistics,
    config: AgentConfig,
    *,
    stage_one_steps: int,
    train_step_counter: tf.Variable | None = None,
) -> FeedAgent:
    common = {"train_step_counter": train_step_counter}
    if algorithm in ("tscac", "tscac-det"):
        return TSCACAgent(
            stats, config, stage_one_steps=stage_one_steps, deterministic=algorithm == "tscac-det", **common
        )
    if algorithm == "bc":
        return BehaviourCloningAgent(stats, config, **common)
    critics = {"rcpo": "single", "rcpo-mc": "multi", "ac-main": "main"}
    if algorithm in critics:
        return RCPOAgent(stats, config, critic=critics[algorithm], **common)
    raise ValueError(f"unknown algorithm {algorithm!r}; known: {sorted(ALGORITHMS)}")
