"""TF-Agents specs of every surface: what a policy observes, what it emits and what training reads.

Training reads logged transitions, not environment trajectories, so the agents' ``training_data_spec``
is TF-Agents' own ``Transition`` (time step, action step, next time step) with the reward vector and the
``done`` flag on the next time step, as TF-Agents places them: ``next.discount`` is 0 after the last
step of a session and 1 otherwise. The behaviour policy's logged log-density rides in the action step's
``info``, where off-policy corrections expect it.
"""

from __future__ import annotations

import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step, time_step, trajectory

from recsys_rl import signals
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.state import FEED_STATE_FEATURES, LIVE_STATE_FEATURES

#: Fusion-weight logits beyond this magnitude mean a weight below e^-8 or above e^8 "typical units":
#: further out the ranking no longer changes, so the bound only keeps a sampled action finite and sane.
ACTION_BOUND = 8.0
LOG_PROPENSITY_KEY = "log_propensity"
#: A pair transition's days from its meeting to the pair's next one (to the cut-off on the pair's last
#: row): the pair critic's per-day discount is raised to it (``PairValueConfig.daily_discount``).
GAP_DAYS_KEY = "gap_days"
#: 1.0 on a pair's last row before the cut-off, whose next state is the pair waiting at the cut-off.
TRUNCATED_KEY = "truncated"


def feed_observation_spec() -> tf.TensorSpec:
    return tf.TensorSpec((len(FEED_STATE_FEATURES),), tf.float32, name="state")


def feed_action_spec() -> tensor_spec.BoundedTensorSpec:
    return tensor_spec.BoundedTensorSpec(
        (len(FEED_ACTION_NAMES),), tf.float32, -ACTION_BOUND, ACTION_BOUND, name="fusion_logits"
    )


def feed_time_step_spec() -> time_step.TimeStep:
    reward = tf.TensorSpec((len(signals.FEED_SIGNALS),), tf.float32, name="reward")
    return time_step.time_step_spec(feed_observation_spec(), reward_spec=reward)


def feed_transition_spec() -> trajectory.Transition:
    info = {LOG_PROPENSITY_KEY: tf.TensorSpec((), tf.float32, name=LOG_PROPENSITY_KEY)}
    return trajectory.Transition(
        time_step=feed_time_step_spec(),
        action_step=policy_step.PolicyStep(action=feed_action_spec(), state=(), info=info),
        next_time_step=feed_time_step_spec(),
    )


# -- live allocation (DESIGN 3.2) ------------------------------------------------------------------------
# The insert flag is kept as one float in [0, 1], the layout of the dataset's ``action`` column, so the
# logged transitions feed the agent without a cast and serving logs the same vector.


def live_observation_spec() -> tf.TensorSpec:
    return tf.TensorSpec((len(LIVE_STATE_FEATURES),), tf.float32, name="state")


def allocation_action_spec() -> tensor_spec.BoundedTensorSpec:
    return tensor_spec.BoundedTensorSpec((1,), tf.float32, 0.0, 1.0, name="insert")


def live_time_step_spec() -> time_step.TimeStep:
    reward = tf.TensorSpec((len(signals.LIVE_SIGNALS),), tf.float32, name="reward")
    return time_step.time_step_spec(live_observation_spec(), reward_spec=reward)


def allocation_transition_spec() -> trajectory.Transition:
    info = {LOG_PROPENSITY_KEY: tf.TensorSpec((), tf.float32, name=LOG_PROPENSITY_KEY)}
    return trajectory.Transition(
        time_step=live_time_step_spec(),
        action_step=policy_step.PolicyStep(action=allocation_action_spec(), state=(), info=info),
        next_time_step=live_time_step_spec(),
    )


# -- user-author pairs (issue 22) ------------------------------------------------------------------------
# The pair surface logs no action (the value acts through one more ranking term, not a logged choice), so
# its training data carries an empty action and a zero log-propensity, and the policy's "action" is what
# serving reads: each pair signal's value of the pair's state, in that signal's units.


def pair_observation_spec() -> tf.TensorSpec:
    return tf.TensorSpec((len(PAIR_STATE_FEATURES),), tf.float32, name="state")


def pair_values_spec() -> tf.TensorSpec:
    return tf.TensorSpec((len(signals.PAIR_SIGNALS),), tf.float32, name="pair_values")


def pair_time_step_spec() -> time_step.TimeStep:
    reward = tf.TensorSpec((len(signals.PAIR_SIGNALS),), tf.float32, name="reward")
    return time_step.time_step_spec(pair_observation_spec(), reward_spec=reward)


def pair_transition_spec() -> trajectory.Transition:
    keys = (LOG_PROPENSITY_KEY, GAP_DAYS_KEY, TRUNCATED_KEY)
    info = {key: tf.TensorSpec((), tf.float32, name=key) for key in keys}
    return trajectory.Transition(
        time_step=pair_time_step_spec(),
        action_step=policy_step.PolicyStep(action=tf.TensorSpec((0,), tf.float32), state=(), info=info),
        next_time_step=pair_time_step_spec(),
    )
