"""The losses of the feed agents as plain functions of tensors, so each is checked on hand-built batches.

Two actor updates cover every algorithm:

* weighted log-likelihood of the logged actions (TSCAC's stage two, its stage one, behaviour cloning):
  the closed-form optimum of a KL-regularised objective, fitted on data drawn from the behaviour policy;
* a deterministic update (TSCAC's deterministic variant, RCPO, the watch-time actor-critic): maximise
  a weighted sum of critic heads at the actor's mean, plus behaviour cloning, plus closeness to other
  actors' means.
"""

from __future__ import annotations

import tensorflow as tf


def td_targets(rewards: tf.Tensor, continues: tf.Tensor, gammas: tf.Tensor, next_q: tf.Tensor) -> tf.Tensor:
    """r_i + gamma_i * (1 - done) * Q_i'(s', a'), per signal: rewards and next_q (B, S), continues (B,)."""
    return rewards + gammas[None, :] * continues[:, None] * next_q


def critic_loss(q: tf.Tensor, targets: tf.Tensor, row_weights: tf.Tensor | None = None) -> tf.Tensor:
    """Squared TD loss per head (S,): each head learns on its own error, whatever the others' scale.

    Squared, not Huber: a value is an expectation, and past Huber's delta the gradient is the error's
    sign only, which fits the targets' median where they spread wider. A sparse signal's reward, in units
    of its standard deviation, is many units on the rare rows that have it and 0 on the rest, so Huber
    fitted its heads near 0: on a simulated day, behaviour-policy TD with Huber put the mean Q of follow,
    comment, share and hate at 7-15% of their Monte-Carlo returns (like 36%) and watch time and click at
    131-135%; with the squared error 91-133% for all but follow (25%), 103-104% for the dense two.

    ``row_weights`` (B,) make it the rows' weighted mean (0 for a batch of no weight), for samples that
    stand for unequal shares of what the value averages over.
    """
    squared = 0.5 * tf.square(q - tf.stop_gradient(targets))
    if row_weights is None:
        return tf.reduce_mean(squared, axis=0)
    return tf.math.divide_no_nan(tf.reduce_sum(row_weights[:, None] * squared, 0), tf.reduce_sum(row_weights))


def closed_form_log_weights(
    advantage: tf.Tensor | None,
    behaviour_log_prob: tf.Tensor,
    prior_log_probs: tf.Tensor | None,
    prior_lambdas: tf.Tensor | None,
    behaviour_lambda: float,
) -> tf.Tensor:
    """Log of the weights that fit pi* by likelihood on actions logged by the behaviour policy beta.

    pi*(a|s) is proportional to beta^(l_b/L) * prod_i pi_i^(l_i/L) * exp(A/L) with L = l_b + sum_i l_i
    (DESIGN 3.1, with the offline behaviour term as one more prior). Samples come from beta, so each is
    weighted by pi*/beta = prod_i (pi_i / beta)^(l_i/L) * exp(A/L). As l_b grows every exponent goes to
    zero and the fit becomes behaviour cloning. ``advantage`` (B,) should already be in the units the
    lambdas are calibrated in; ``prior_log_probs`` is (B, M) with ``prior_lambdas`` (M,).
    """
    total = tf.constant(behaviour_lambda, tf.float32)
    log_w = tf.zeros_like(behaviour_log_prob)
    if prior_log_probs is not None:
        total += tf.reduce_sum(prior_lambdas)
        log_w += tf.reduce_sum(
            (prior_lambdas / total)[None, :] * (prior_log_probs - behaviour_log_prob[:, None]), axis=1
        )
    if advantage is not None:
        log_w += advantage / total
    return log_w


# Batch statistics over the whole batch. Under a distribution strategy each replica holds a share of the
# batch, and a statistic of its share alone (a softmax's normaliser, a mean scale) would make a step
# depend on how many replicas there are; these combine the shares, so a step on N replicas (devices or
# workers) is the one-device step. Outside a strategy the default replica context makes them local.


def _replicas() -> tf.distribute.ReplicaContext:
    return tf.distribute.get_replica_context()


def batch_mean(values: tf.Tensor) -> tf.Tensor:
    """The mean of ``values`` over the whole batch, every replica's share."""
    total = _replicas().all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(values))
    count = _replicas().all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.size(values), tf.float32))
    return total / count


def batch_max(values: tf.Tensor) -> tf.Tensor:
    return tf.reduce_max(_replicas().all_gather(tf.reduce_max(values)[None], axis=0))


def normalised_weights(log_weights: tf.Tensor, max_weight: float) -> tf.Tensor:
    """Weights with mean one over the batch (softmax times batch size), capped to bound the variance."""
    log_normaliser = tf.reduce_logsumexp(
        _replicas().all_gather(tf.reduce_logsumexp(log_weights)[None], axis=0)
    )
    batch = _replicas().all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.shape(log_weights)[0], tf.float32))
    weights = tf.exp(log_weights - log_normaliser) * batch
    return tf.stop_gradient(tf.minimum(weights, max_weight))


def largest_share(weights: tf.Tensor) -> tf.Tensor:
    """The largest weight's share of the batch's total: how much one sample steers the fit."""
    return batch_max(weights) / _replicas().all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(weights))


def weighted_log_likelihood_loss(log_probs: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    return -tf.reduce_mean(weights * log_probs)


def multiplier_step(multiplier: tf.Tensor, gap: tf.Tensor, learning_rate: float, slack: float) -> tf.Tensor:
    """lambda <- max(0, lambda - lr * (gap + slack)): up while the policy falls short of its constraint
    by more than the slack (a negative gap), down (never below zero) while it does better."""
    return tf.nn.relu(multiplier - learning_rate * (gap + slack))


class SlowMultipliers(tf.Module):
    """Lagrange multipliers on the slow timescale of RCPO's two (Tessler, Mankowitz & Mannor, ICLR 2019).

    The critic and actor step on every batch; the multipliers step once every ``every`` batches, on the
    constraint gaps averaged over those batches, so the actor sees nearly fixed multipliers (the faster
    process has converged for them) and the multipliers see a less noisy gap.
    """

    def __init__(
        self, size: int, initial: float, learning_rate: float, slack: float, every: int, name: str
    ) -> None:
        super().__init__(name=name)
        self.values = tf.Variable(tf.fill([size], float(initial)), trainable=False, name="multipliers")
        self._gap_sum = tf.Variable(tf.zeros([size]), trainable=False, name="gap_sum")
        self._count = tf.Variable(0.0, trainable=False, name="gap_count")
        self._learning_rate, self._slack, self._every = learning_rate, slack, float(every)

    def observe(self, gaps: tf.Tensor) -> None:
        """Add one batch's gaps (+: the policy does better than the constraint's level)."""
        total = self._gap_sum + gaps
        count = self._count + 1.0
        due = tf.cast(count >= self._every, tf.float32)  # arithmetic, not control flow: any tf.function
        stepped = multiplier_step(self.values, total / count, self._learning_rate, self._slack)
        self.values.assign(due * stepped + (1.0 - due) * self.values)
        self._gap_sum.assign((1.0 - due) * total)
        self._count.assign((1.0 - due) * count)


def deterministic_actor_loss(
    q_at_mean: tf.Tensor,
    mean: tf.Tensor,
    logged_action: tf.Tensor,
    bc_weight: float,
    anchors: tf.Tensor | None = None,
    closeness_weight: float = 0.0,
) -> tf.Tensor:
    """-Q(s, mu(s)) / mean|Q| + bc * |mu - a|^2 + closeness * mean_m |mu - anchor_m|^2.

    Dividing Q by its (detached) batch mean magnitude keeps the behaviour-cloning weight meaningful on
    any reward scale. ``q_at_mean`` (B,) is the critic's combined value at the actor's mean; ``anchors``
    (M, B, K) are the actions the actor should stay close to (TSCAC's stage-one actors).
    """
    scale = tf.stop_gradient(batch_mean(tf.abs(q_at_mean))) + 1e-6
    loss = -tf.reduce_mean(q_at_mean) / scale
    loss += bc_weight * tf.reduce_mean(tf.reduce_sum(tf.square(mean - logged_action), axis=-1))
    if anchors is not None and closeness_weight > 0.0:
        gaps = tf.reduce_sum(tf.square(mean[None] - tf.stop_gradient(anchors)), axis=-1)
        loss += closeness_weight * tf.reduce_mean(gaps)
    return loss
