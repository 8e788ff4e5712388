"""Logged allocation transitions for SL-MGAC's unit tests: random states with one activity group each,
the training statistics they are scaled by, and a batch with insertions, outcomes and session ends."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import policy_step, time_step, trajectory

from recsys_rl.state import ACTIVITY_GROUPS, LIVE_STATE_FEATURES
from recsys_rl.training.agents.allocation import AllocationConfig
from recsys_rl.training.agents.data import TransitionStatistics
from recsys_rl.training.agents.specs import LOG_PROPENSITY_KEY

D = len(LIVE_STATE_FEATURES)
SMALL = AllocationConfig(shared_hidden=(8,), tower_hidden=(8,), head_hidden=8, atoms=11)


def states(n: int, group: int | None = None, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = rng.random((n, D)).astype(np.float32)
    groups = rng.integers(0, len(ACTIVITY_GROUPS), n) if group is None else np.full(n, group)
    out[:, : len(ACTIVITY_GROUPS)] = np.eye(len(ACTIVITY_GROUPS))[groups]
    return out


def stats() -> TransitionStatistics:
    return TransitionStatistics(
        state_mean=np.full(D, 0.5),
        state_std=np.full(D, 0.3),
        reward_std=np.array([30.0, 0.5, 5.0]),
        reward_mean=np.array([7.0, 0.03, 3.0]),
        action_mean=np.array([0.3]),
        logged_action_coef=np.zeros((D + 1, 1)),
        rows=100,
    )


def batch(n: int = 32, seed: int = 0) -> trajectory.Transition:
    rng = np.random.default_rng(seed)
    obs, nxt = states(n, seed=seed), states(n, seed=seed + 1)
    done = rng.random(n) < 0.3
    action = (rng.random(n) < 0.4).astype(np.float32)
    reward = np.column_stack(
        [action * rng.exponential(30.0, n), action * (rng.random(n) < 0.1), action * 13.0 * rng.random(n)]
    ).astype(np.float32)

    def step(observation, reward_, discount, kind):
        return time_step.TimeStep(
            step_type=tf.fill([n], kind),
            reward=tf.constant(reward_),
            discount=tf.constant(discount, tf.float32),
            observation=tf.constant(observation),
        )

    return trajectory.Transition(
        step(obs, np.zeros_like(reward), np.ones(n), time_step.StepType.MID),
        policy_step.PolicyStep(
            action=tf.constant(action[:, None]),
            state=(),
            info={LOG_PROPENSITY_KEY: tf.constant(np.log(np.where(action == 1, 0.3, 0.7)), tf.float32)},
        ),
        step(nxt, reward, 1.0 - done, time_step.StepType.MID),
    )
