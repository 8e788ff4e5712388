"""The agents' losses on batches small enough to check by hand, plus the limits the design relies on.

Every expected value below is written out as arithmetic, so a changed exponent, a dropped ``done`` or a
gradient that leaks through a detached term shows up as a number that no longer matches.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys_rl.training.agents import losses
from recsys_rl.training.agents.base import AgentConfig
from recsys_rl.training.agents.tscac import AUXILIARY, stage_two_log_weights


def _t(values) -> tf.Tensor:
    return tf.constant(values, tf.float32)


def _close(actual: tf.Tensor, expected, atol: float = 1e-6) -> None:
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected, np.float64), rtol=1e-6, atol=atol)


# -- TD targets and the critic loss ---------------------------------------------------------------


def test_td_targets_use_each_signals_gamma_and_stop_at_done():
    rewards = _t([[1.0, 2.0], [3.0, 4.0]])
    continues = _t([1.0, 0.0])  # the second row ends its session
    gammas = _t([0.9, 0.5])
    next_q = _t([[10.0, 20.0], [30.0, 40.0]])

    targets = losses.td_targets(rewards, continues, gammas, next_q)

    _close(
        targets,
        [
            [1.0 + 0.9 * 10.0, 2.0 + 0.5 * 20.0],  # = [10, 12]
            [3.0 + 0.9 * 0.0 * 30.0, 4.0 + 0.5 * 0.0 * 40.0],  # done: reward only
        ],
    )


def test_critic_loss_is_half_the_squared_error_per_head_large_errors_included():
    q = _t([[0.0, 0.0], [0.0, 0.0]])
    targets = _t([[0.5, 3.0], [-2.0, 0.1]])  # errors q - target: [[-0.5, -3], [2, -0.1]]

    per_head = losses.critic_loss(q, targets)

    assert per_head.shape == (2,)
    _close(per_head, [(0.125 + 2.0) / 2, (4.5 + 0.005) / 2])  # a Huber loss would give 0.8125, 1.2525


def test_critic_loss_with_row_weights_is_their_weighted_mean_and_zero_for_no_weight():
    q = _t([[0.0, 0.0], [0.0, 0.0]])
    targets = _t([[1.0, 2.0], [3.0, -1.0]])  # half squared errors [[0.5, 2], [4.5, 0.5]]

    _close(losses.critic_loss(q, targets, row_weights=_t([1.0, 3.0])), [(0.5 + 13.5) / 4, (2 + 1.5) / 4])
    _close(losses.critic_loss(q, targets, row_weights=_t([0.0, 0.0])), [0.0, 0.0])  # not NaN


def test_critic_loss_does_not_train_the_targets():
    q = tf.Variable([[1.0], [-1.0]])
    targets = tf.Variable([[0.0], [0.0]])
    with tf.GradientTape() as tape:
        loss = losses.critic_loss(q, targets)
    grad_q, grad_targets = tape.gradient(loss, [q, targets])

    _close(loss, [0.5])
    _close(grad_q, [[0.5], [-0.5]])  # d/dq of the mean half squared error: error / B
    assert grad_targets is None  # targets are detached: the critic chases them, never moves them


# -- closed-form likelihood weights ---------------------------------------------------------------

BEHAVIOUR_LOG_PROB = [-1.0, -2.0]
PRIOR_LOG_PROBS = [[0.0, -1.0], [-1.0, 1.0]]
PRIOR_LAMBDAS = [1.0, 3.0]
BEHAVIOUR_LAMBDA = 4.0  # L = 4 + 1 + 3 = 8, so the prior exponents are 1/8 and 3/8


def test_closed_form_log_weights_with_priors_use_exponents_lambda_over_total():
    log_w = losses.closed_form_log_weights(
        None, _t(BEHAVIOUR_LOG_PROB), _t(PRIOR_LOG_PROBS), _t(PRIOR_LAMBDAS), BEHAVIOUR_LAMBDA
    )
    _close(
        log_w,
        [
            1 / 8 * (0.0 - -1.0) + 3 / 8 * (-1.0 - -1.0),  # = 0.125
            1 / 8 * (-1.0 - -2.0) + 3 / 8 * (1.0 - -2.0),  # = 0.125 + 1.125 = 1.25
        ],
    )


def test_closed_form_log_weights_add_the_advantage_over_the_same_total():
    log_w = losses.closed_form_log_weights(
        _t([2.0, -4.0]), _t(BEHAVIOUR_LOG_PROB), _t(PRIOR_LOG_PROBS), _t(PRIOR_LAMBDAS), BEHAVIOUR_LAMBDA
    )
    _close(log_w, [0.125 + 2.0 / 8, 1.25 + -4.0 / 8])  # = [0.375, 0.75]


def test_closed_form_log_weights_without_priors_divide_the_advantage_by_the_behaviour_lambda():
    log_w = losses.closed_form_log_weights(_t([2.0, -4.0]), _t(BEHAVIOUR_LOG_PROB), None, None, 4.0)
    _close(log_w, [2.0 / 4, -4.0 / 4])


def test_closed_form_log_weights_without_anything_are_behaviour_cloning():
    log_w = losses.closed_form_log_weights(None, _t(BEHAVIOUR_LOG_PROB), None, None, 4.0)
    _close(log_w, [0.0, 0.0])


def test_stage_two_log_weights_give_every_auxiliary_prior_aux_lambda():
    config = AgentConfig(aux_lambda=0.5, behaviour_lambda=1.0)
    total = 1.0 + 0.5 * len(AUXILIARY)  # six priors: L = 4, each exponent 0.5 / 4 = 0.125
    behaviour = _t([-2.0, -2.0])
    priors = tf.stack([tf.fill([len(AUXILIARY)], -1.0), tf.fill([len(AUXILIARY)], -3.0)])  # +1 and -1

    log_w = stage_two_log_weights(_t([1.0, 0.0]), behaviour, priors, config)

    exponent = 0.5 / total
    _close(log_w, [len(AUXILIARY) * exponent * 1.0 + 1.0 / total, len(AUXILIARY) * exponent * -1.0])


# -- normalised weights and the weighted likelihood -----------------------------------------------


def test_normalised_weights_have_mean_one_before_the_cap():
    weights = losses.normalised_weights(_t([0.0, math.log(3.0)]), max_weight=20.0)
    _close(weights, [2 * 1 / 4, 2 * 3 / 4])  # softmax [1/4, 3/4] times the batch size 2
    _close(tf.reduce_mean(weights), 1.0)


def test_normalised_weights_are_capped_and_detached():
    log_w = tf.Variable([0.0, math.log(3.0)])
    with tf.GradientTape() as tape:
        weights = losses.normalised_weights(log_w, max_weight=1.2)
    _close(weights, [0.5, 1.2])
    assert tape.gradient(weights, log_w) is None


def test_weighted_log_likelihood_is_the_negative_weighted_mean():
    loss = losses.weighted_log_likelihood_loss(_t([-1.0, -3.0]), _t([0.5, 1.5]))
    _close(loss, -(0.5 * -1.0 + 1.5 * -3.0) / 2)  # = 2.5


@settings(max_examples=60, deadline=None)
@given(
    log_weights=st.lists(st.floats(-50.0, 50.0), min_size=1, max_size=32),
    cap=st.floats(0.1, 50.0),
    shift=st.floats(-100.0, 100.0),
)
def test_normalised_weights_never_exceed_mean_one_or_the_cap_and_ignore_a_shift(log_weights, cap, shift):
    weights = losses.normalised_weights(_t(log_weights), cap).numpy()
    shifted = losses.normalised_weights(_t([w + shift for w in log_weights]), cap).numpy()

    assert weights.mean() <= 1.0 + 1e-5
    assert weights.max() <= cap * (1.0 + 1e-6)
    assert np.all(weights >= 0.0)
    np.testing.assert_allclose(shifted, weights, rtol=1e-3, atol=1e-5)


def test_stage_two_becomes_behaviour_cloning_as_the_behaviour_lambda_grows():
    rng = np.random.default_rng(7)
    batch = 64
    advantage = _t(rng.normal(0.0, 1.0, batch))
    behaviour = _t(rng.normal(-8.0, 2.0, batch))
    priors = _t(rng.normal(-8.0, 2.0, (batch, len(AUXILIARY))))
    log_probs = _t(rng.normal(-6.0, 2.0, batch))  # the actor's log-density of the logged actions
    bc_loss = float(-tf.reduce_mean(log_probs))

    gaps = []
    for behaviour_lambda in (1.0, 10.0, 100.0, 1000.0, 10000.0):
        config = AgentConfig(behaviour_lambda=behaviour_lambda, aux_lambda=1.0, max_weight=20.0)
        total = behaviour_lambda + len(AUXILIARY)
        log_w = stage_two_log_weights(advantage, behaviour, priors, config)
        weights = losses.normalised_weights(log_w, config.max_weight)
        loss = float(losses.weighted_log_likelihood_loss(log_probs, weights))
        gaps.append(abs(loss - bc_loss))
        if behaviour_lambda >= 10.0:
            # every exponent is ~ 1 / L, so weights and loss approach behaviour cloning at that rate
            assert gaps[-1] < 1.0 / total
            assert float(tf.reduce_max(tf.abs(weights - 1.0))) < 100.0 / total

    assert gaps[0] > 0.1  # with L = 7 the weights really do reweight this batch
    assert all(later < earlier for earlier, later in itertools.pairwise(gaps))


def test_stage_two_lambdas_are_in_reward_units_whatever_the_rest_of_the_batch_holds():
    """A row's log-weight is A / L plus its priors' term: scaling the other rows' advantages (a batch
    with a larger spread) leaves it alone, as it would not if advantages were standardised per batch."""
    rng = np.random.default_rng(8)
    batch = 32
    advantage = rng.normal(0.0, 1.0, batch)
    behaviour = _t(rng.normal(-8.0, 2.0, batch))
    priors = _t(rng.normal(-8.0, 2.0, (batch, len(AUXILIARY))))
    config = AgentConfig(behaviour_lambda=0.05, aux_lambda=0.02)
    spread = advantage * 10.0
    spread[0] = advantage[0]
    narrow = stage_two_log_weights(_t(advantage), behaviour, priors, config).numpy()
    wide = stage_two_log_weights(_t(spread), behaviour, priors, config).numpy()
    assert narrow[0] == pytest.approx(wide[0], rel=1e-6)
    total = config.behaviour_lambda + len(AUXILIARY) * config.aux_lambda
    doubled = stage_two_log_weights(_t(2.0 * advantage), behaviour, priors, config).numpy()
    np.testing.assert_allclose(doubled - narrow, advantage / total, rtol=1e-4, atol=1e-4)


# -- deterministic actor update -------------------------------------------------------------------


def test_deterministic_actor_loss_on_a_hand_case_with_anchors():
    q_at_mean = tf.Variable([2.0, -4.0])  # mean -1, mean |q| 3
    mean = _t([[1.0, 0.0], [0.0, 1.0]])
    logged = _t([[0.0, 0.0], [0.0, 3.0]])  # squared gaps 1 and 4
    anchors = tf.Variable([[[1.0, 1.0], [0.0, 1.0]], [[3.0, 0.0], [0.0, 0.0]]])  # squared gaps 1, 0, 4, 1

    with tf.GradientTape(persistent=True) as tape:
        loss = losses.deterministic_actor_loss(
            q_at_mean, mean, logged, bc_weight=0.5, anchors=anchors, closeness_weight=2.0
        )
    q_term = 1.0 / 3.0  # -mean(q) / mean|q| = -(-1) / 3
    bc_term = 0.5 * (1.0 + 4.0) / 2
    closeness_term = 2.0 * (1.0 + 0.0 + 4.0 + 1.0) / 4
    _close(loss, q_term + bc_term + closeness_term, atol=1e-5)  # 1/3 + 1.25 + 3

    # the Q scale is detached, so each q gets -1 / (B * scale), and the anchors are never moved
    _close(tape.gradient(loss, q_at_mean), [-1.0 / (2 * 3.0)] * 2, atol=1e-5)
    assert tape.gradient(loss, anchors) is None


def test_deterministic_actor_loss_ignores_anchors_without_a_closeness_weight():
    q_at_mean = _t([2.0, -4.0])
    mean = _t([[1.0, 0.0], [0.0, 1.0]])
    logged = _t([[0.0, 0.0], [0.0, 3.0]])
    anchors = _t([[[9.0, 9.0], [9.0, 9.0]]])
    without = losses.deterministic_actor_loss(q_at_mean, mean, logged, bc_weight=0.5)
    ignored = losses.deterministic_actor_loss(q_at_mean, mean, logged, 0.5, anchors, closeness_weight=0.0)
    _close(without, 1.0 / 3.0 + 1.25, atol=1e-5)
    _close(ignored, without)


@pytest.mark.parametrize("bc_weight", [0.0, 1.0])
def test_deterministic_actor_loss_pulls_the_mean_toward_the_logged_action(bc_weight):
    mean = tf.Variable([[1.0, 0.0]])
    with tf.GradientTape() as tape:
        loss = losses.deterministic_actor_loss(_t([1.0]), mean, _t([[0.0, 0.0]]), bc_weight)
    # d/dmu of bc * |mu - a|^2 = 2 * bc * (mu - a); the Q term does not depend on mu here
    _close(tape.gradient(loss, mean), [[2.0 * bc_weight * 1.0, 0.0]])


@pytest.mark.parametrize(
    ("multiplier", "gap", "slack", "expected"),
    [
        pytest.param(1.0, -2.0, 0.0, 1.2, id="insertions-cost-usage"),
        pytest.param(1.0, 2.0, 0.0, 0.8, id="insertions-add-usage"),
        pytest.param(1.0, -2.0, 3.0, 0.9, id="within-the-slack"),
        pytest.param(0.05, 2.0, 0.0, 0.0, id="never-negative"),
    ],
)
def test_the_lagrange_multiplier_step(multiplier, gap, slack, expected):
    step = losses.multiplier_step(tf.constant(multiplier), tf.constant(gap), 0.1, slack)
    assert float(step) == pytest.approx(expected)


def test_slow_multipliers_step_once_per_period_on_the_averaged_gaps():
    multipliers = losses.SlowMultipliers(2, 1.0, learning_rate=0.1, slack=0.0, every=3, name="test")
    multipliers.observe(tf.constant([-3.0, 1.0]))
    multipliers.observe(tf.constant([0.0, 1.0]))
    _close(multipliers.values, [1.0, 1.0])  # the actor's timescale: unchanged within the period
    multipliers.observe(tf.constant([0.0, 1.0]))
    _close(multipliers.values, [1.1, 0.9])  # one step on the mean gaps (-1, 1)
    for _ in range(3):
        multipliers.observe(tf.constant([2.0, 0.0]))
    _close(multipliers.values, [0.9, 0.9])  # the next period's mean alone, not the first period's


def test_slow_multipliers_hold_their_values_after_every_batch_of_a_period():
    multipliers = losses.SlowMultipliers(2, 2.0, learning_rate=0.1, slack=0.0, every=3, name="test")
    for expected in ([2.0, 2.0], [2.0, 2.0], [2.1, 1.9]):
        multipliers.observe(tf.constant([-1.0, 1.0]))
        _close(multipliers.values, expected)


def test_slow_multipliers_are_never_trained_by_an_optimizer():
    """Only their own step moves them: an optimizer over the agent's trainable variables must not."""
    multipliers = losses.SlowMultipliers(3, 1.0, learning_rate=0.1, slack=0.0, every=2, name="test")
    assert multipliers.trainable_variables == ()
    assert len(multipliers.variables) == 3


def test_critic_loss_is_on_q_minus_the_target():
    q = _t([[2.0, -1.0]])
    targets = _t([[0.5, -1.2]])  # errors 1.5 and 0.2; q + target would be 2.5 and -2.2
    _close(losses.critic_loss(q, targets), [0.5 * 1.5**2, 0.5 * 0.2**2])


def test_closed_form_log_weights_take_an_integer_behaviour_lambda():
    """A YAML config gives ``behaviour_lambda: 4`` as an integer: the same weights as 4.0."""
    args = (_t([2.0, -4.0]), _t(BEHAVIOUR_LOG_PROB), _t(PRIOR_LOG_PROBS), _t(PRIOR_LAMBDAS))
    _close(losses.closed_form_log_weights(*args, 4), losses.closed_form_log_weights(*args, 4.0))


def test_deterministic_actor_loss_keeps_maximising_q_when_every_q_is_tiny():
    """The scale's epsilon keeps it positive: a batch of Q values near zero must not flip the objective."""
    q_at_mean = tf.Variable([1e-7, 1e-7])
    mean = _t([[0.0, 0.0], [0.0, 0.0]])
    with tf.GradientTape() as tape:
        loss = losses.deterministic_actor_loss(q_at_mean, mean, mean, bc_weight=0.0)
    assert float(loss) < 0.0
    assert all(g < 0.0 for g in tape.gradient(loss, q_at_mean).numpy())  # raising Q lowers the loss


def test_deterministic_actor_loss_averages_closeness_over_actors_and_rows_of_sums_over_dimensions():
    """Three rows of two dimensions, one anchor actor: the sum is over the action's dimensions."""
    mean = _t([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    anchors = _t([[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])  # squared gaps per row: 1, 0, 4
    loss = losses.deterministic_actor_loss(
        _t([1.0, 1.0, 1.0]), mean, mean, 0.0, anchors, closeness_weight=0.5
    )
    _close(loss, -1.0 + 0.5 * (1.0 + 0.0 + 4.0) / 3, atol=1e-5)


def test_deterministic_actor_loss_without_anchors_ignores_the_closeness_weight():
    mean = _t([[1.0, 0.0]])
    loss = losses.deterministic_actor_loss(_t([2.0]), mean, mean, 0.0, None, closeness_weight=3.0)
    _close(loss, -1.0)


def test_deterministic_actor_loss_has_no_closeness_unless_asked():
    mean = _t([[1.0, 0.0]])
    anchors = _t([[[5.0, 5.0]]])
    _close(losses.deterministic_actor_loss(_t([2.0]), mean, mean, 0.0, anchors), -1.0)


def test_the_largest_share_is_the_largest_weight_over_the_batchs_total():
    assert float(losses.largest_share(_t([1.0, 3.0, 0.5, 0.5]))) == pytest.approx(3.0 / 5.0)
    assert float(losses.batch_max(_t([-4.0, -2.0, -3.0]))) == -2.0  # the largest, not the largest magnitude
    assert float(losses.batch_mean(_t([1.0, -2.0, 4.0]))) == pytest.approx(1.0)


# In a fresh interpreter: two logical CPUs must be configured before TensorFlow runs anything.
_BATCH_STATISTICS_ON_TWO_REPLICAS = """
import json
import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from recsys_rl.training.agents import losses

log_w = tf.constant([0.0, 2.0, -1.0, 0.5, 3.0, 1.0], tf.float32)  # the largest in the second half
values = tf.constant([1.0, -2.0, 4.0, 3.0, -5.0, 6.0], tf.float32)


def statistics(log_w, values):
    weights = losses.normalised_weights(log_w, 100.0)
    return weights, losses.largest_share(weights), losses.batch_mean(values), losses.batch_max(values)


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
halves = strategy.experimental_distribute_values_from_function(
    lambda context: [tf.split(t, 2)[context.replica_id_in_sync_group] for t in (log_w, values)]
)
per_replica = strategy.run(lambda pair: statistics(*pair), args=(halves,))
weights, share, mean, largest = (strategy.experimental_local_results(t) for t in per_replica)
whole = statistics(log_w, values)
print(json.dumps({
    "replicas": [np.concatenate([w.numpy() for w in weights]).tolist(), [float(s) for s in share],
                 [float(m) for m in mean], [float(m) for m in largest]],
    "whole": [whole[0].numpy().tolist(), float(whole[1]), float(whole[2]), float(whole[3])],
}))
"""


def test_batch_statistics_cover_every_replicas_share_of_the_batch():
    """A step on two replicas must be the one-device step: the weights' softmax, the largest weight's
    share and the mean scale are over the whole batch, not each replica's half (``losses`` says why)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _BATCH_STATISTICS_ON_TWO_REPLICAS], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    (weights, shares, means, maxima), whole = result["replicas"], result["whole"]
    np.testing.assert_allclose(weights, whole[0], rtol=1e-6)
    assert sum(weights) == pytest.approx(6.0)  # mean one over the whole batch, not over each half
    assert shares == pytest.approx([whole[1]] * 2)
    assert means == pytest.approx([whole[2]] * 2) and whole[2] == pytest.approx(7.0 / 6.0)
    assert maxima == pytest.approx([whole[3]] * 2) and whole[3] == 6.0
