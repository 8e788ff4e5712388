"""Logged feed transitions for the feed agents' unit tests (TSCAC, RCPO, behaviour cloning): a tiny config,
training statistics, a random batch with session ends, and the signs of the auxiliary signals written by
hand rather than read from the signal registry the agents read."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import policy_step, time_step, trajectory

from recsys_rl import signals
from recsys_rl.state import FEED_STATE_FEATURES
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.data import TransitionStatistics
from recsys_rl.training.agents.specs import LOG_PROPENSITY_KEY

SMALL = AgentConfig(actor_hidden=(8,), critic_hidden=(8,), head_hidden=4)
D, K = len(FEED_STATE_FEATURES), len(signals.FEED_SIGNALS)
AUXILIARY = ("click", "like", "follow", "comment", "share", "hate")
# the one lower-is-better signal of the feed is hate
SIGN = {"click": 1.0, "like": 1.0, "follow": 1.0, "comment": 1.0, "share": 1.0, "hate": -1.0}


def stats(reward_std: np.ndarray | None = None) -> TransitionStatistics:
    return TransitionStatistics(
        state_mean=np.zeros(D),
        state_std=np.ones(D),
        reward_std=np.ones(K) if reward_std is None else reward_std,
        reward_mean=np.zeros(K),
        action_mean=np.zeros(K),
        logged_action_coef=np.zeros((D + 1, K)),
        rows=64,
    )


def batch(n: int = 64, seed: int = 0) -> trajectory.Transition:
    rng = np.random.default_rng(seed)
    obs, nxt = rng.normal(size=(2, n, D)).astype(np.float32)
    action = rng.normal(0.0, 1.0, (n, K)).astype(np.float32)
    reward = rng.random((n, K)).astype(np.float32)
    done = rng.random(n) < 0.2

    def step(observation, reward_, discount):
        return time_step.TimeStep(
            step_type=tf.fill([n], time_step.StepType.MID),
            reward=tf.constant(reward_),
            discount=tf.constant(discount, tf.float32),
            observation=tf.constant(observation),
        )

    log_propensity = rng.normal(-8.0, 1.0, n).astype(np.float32)
    return trajectory.Transition(
        step(obs, np.zeros_like(reward), np.ones(n)),
        policy_step.PolicyStep(
            action=tf.constant(action), state=(), info={LOG_PROPENSITY_KEY: tf.constant(log_propensity)}
        ),
        step(nxt, reward, 1.0 - done),
    )


def values(network) -> list[np.ndarray]:
    return [v.numpy().copy() for v in network.trainable_variables]


def moved(before: list[np.ndarray], network) -> bool:
    return any(
        not np.array_equal(b, v.numpy()) for b, v in zip(before, network.trainable_variables, strict=True)
    )
