"""The algorithms ``recsys-rl train --algo`` offers, by name."""

from __future__ import annotations

import tensorflow as tf

from recsys_rl.agents.base import AgentConfig, FeedAgent
from recsys_rl.agents.baselines import BehaviourCloningAgent, RCPOAgent
from recsys_rl.agents.data import TransitionStatistics
from recsys_rl.agents.tscac import TSCACAgent

ALGORITHMS: dict[str, str] = {
    "tscac": "Two-Stage Constrained Actor-Critic (closed-form weighted likelihood)",
    "tscac-det": "TSCAC, deterministic variant (Q-maximising actor + BC + closeness to stage one)",
    "bc": "behaviour cloning",
    "rcpo": "RCPO with a single critic on the Lagrangian reward",
    "rcpo-mc": "RCPO with the multi-task critic",
    "ac-main": "actor-critic on watch time only",
}


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
