"""The networks every feed agent is built from: a Gaussian actor and a multi-task critic (DESIGN 3.1, 3.3).

Both normalise the state with the training data's moments inside the network, as fixed weights: the
exported policy then takes the raw logged state vector, and serving cannot apply a different scaling.

The methods TensorFlow inspects (a network's ``__init__``, a layer's ``call``) only wire layers or hand
over to a method or function beside them, and carry ``# pragma: no mutate block``: mutation testing
(``make mutation``) wraps every function it mutates in one taking ``*args, **kwargs``, and TF-Agents'
``Network`` refuses an ``__init__`` taking ``*args`` (it records the arguments to copy networks) while
Keras would pass ``call`` its keyword arguments under the wrong names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from tf_agents.networks import network

tfd = tfp.distributions

#: Keeps an actor's standard deviation in a range where log-densities stay finite and exploration useful.
LOG_STD_RANGE = (-5.0, 1.0)


def _mlp(sizes: Sequence[int], name: str) -> list[tf.keras.layers.Layer]:
    return [tf.keras.layers.Dense(n, activation="relu", name=f"{name}_{i}") for i, n in enumerate(sizes)]


class _StackedDense(tf.keras.layers.Layer):
    """``stacks`` independent ReLU layers in one op: (B, in) or (S, B, in) -> (S, B, units).

    The critic's independent trunks: one einsum per depth instead of one small matmul per signal, each
    stack initialised as its own Glorot-uniform layer would be.
    """

    def __init__(self, stacks: int, units: int, name: str) -> None:
        super().__init__(name=name)
        self._stacks, self._units = stacks, units

    def build(self, input_shape) -> None:
        fan_in = int(input_shape[-1])
        limit = math.sqrt(6.0 / (fan_in + self._units))
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self._stacks, fan_in, self._units),
            initializer=tf.keras.initializers.RandomUniform(-limit, limit),
        )
        self.bias = self.add_weight(name="bias", shape=(self._stacks, 1, self._units), initializer="zeros")

    def call(self, x: tf.Tensor) -> tf.Tensor:  # pragma: no mutate block
        return _stacked_relu(x, self.kernel, self.bias)


def _stacked_relu(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """relu(x @ kernel[s] + bias[s]) for every stack s; ``x`` is one input for all stacks (B, in) or one
    per stack (S, B, in)."""
    equation = "bi,siu->sbu" if x.shape.rank == 2 else "sbi,siu->sbu"
    return tf.nn.relu(tf.einsum(equation, x, kernel) + bias)


class _StateNormalizer(tf.Module):
    """(state - mean) / std with the moments fixed at construction and saved with the model."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, name: str = "state_normalizer") -> None:
        super().__init__(name=name)
        self.mean = tf.Variable(np.asarray(mean, np.float32), trainable=False, name="mean")
        self.std = tf.Variable(np.asarray(std, np.float32), trainable=False, name="std")

    def __call__(self, states: tf.Tensor) -> tf.Tensor:
        return (tf.cast(states, tf.float32) - self.mean) / self.std


class _LoggedActionFit(tf.Module):
    """The logged actions' linear fit on the state, [1, normalised state] @ coef, fixed at construction."""

    def __init__(self, coef: np.ndarray, name: str = "logged_action_fit") -> None:
        super().__init__(name=name)
        self.coef = tf.Variable(np.asarray(coef, np.float32), trainable=False, name="coef")

    def departure(self, normalised_states: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        """The actions less the fit; a critic without actions (the pair critic's) has nothing to fit,
        and TensorFlow's compiled matmul aborts the process on a zero-width operand."""
        actions = tf.cast(actions, tf.float32)
        if self.coef.shape[1] == 0:
            return actions
        return actions - self.coef[0] - tf.matmul(normalised_states, self.coef[1:])


class GaussianActorNetwork(network.Network):
    """s -> N(mean(s), diag(std^2)) over fusion-weight logits, with a state-independent std.

    The mean starts at the logged actions' average (``initial_mean``), so an untrained actor already
    behaves like the behaviour policy on average instead of ranking at random. With ``learn_std=False``
    the std stays at ``initial_std``: the deterministic-update agents fit only the mean, and the std is
    the exploration the policy is served with.
    """

    def __init__(
        self,
        observation_spec: tf.TensorSpec,
        action_spec: tf.TensorSpec,
        *,
        state_mean: np.ndarray,
        state_std: np.ndarray,
        initial_mean: np.ndarray,
        initial_std: float,
        hidden: Sequence[int] = (64, 64),
        learn_std: bool = True,
        name: str = "GaussianActorNetwork",
    ) -> None:  # pragma: no mutate block
        super().__init__(input_tensor_spec=observation_spec, state_spec=(), name=name)
        action_size = action_spec.shape[0]
        self._normalizer = _StateNormalizer(state_mean, state_std)
        self._hidden = _mlp(hidden, "actor")
        self._mean = tf.keras.layers.Dense(
            action_size,
            kernel_initializer=tf.keras.initializers.RandomUniform(-1e-3, 1e-3),
            bias_initializer=tf.keras.initializers.Constant(np.asarray(initial_mean, np.float32)),
            name="actor_mean",
        )
        self._log_std = tf.Variable(
            np.full(action_size, np.log(initial_std), np.float32), trainable=learn_std, name="log_std"
        )

    def mean_and_std(self, observations: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = self._normalizer(observations)
        for layer in self._hidden:
            x = layer(x)
        log_std = tf.clip_by_value(self._log_std, *LOG_STD_RANGE)
        return self._mean(x), tf.exp(log_std) * tf.ones_like(x[:, :1])

    def call(self, observations, step_type=None, network_state=(), training=False):  # pragma: no mutate block
        mean, std = self.mean_and_std(observations)
        return tfd.MultivariateNormalDiag(loc=mean, scale_diag=std), network_state


def _funnel_indices(signal_names: Sequence[str], funnel: Sequence[str]) -> tuple[int, ...]:
    """The funnel's signals as indices into ``signal_names``, in the funnel's order."""
    unknown = [s for s in funnel if s not in signal_names]
    if unknown:
        raise ValueError(f"funnel signals {unknown} are not among the critic's signals {list(signal_names)}")
    return tuple(signal_names.index(s) for s in funnel)


def _critic_torso(hidden: Sequence[int], signals: int, shared_trunk: bool) -> list[tf.keras.layers.Layer]:
    """One torso every head reads, or ``signals`` independent trunks stacked in each layer."""
    if shared_trunk:
        return _mlp(hidden, "critic")
    return [_StackedDense(signals, n, f"critic_{i}") for i, n in enumerate(hidden)]


class MultiTaskCriticNetwork(network.Network):
    """(s, a) -> one Q-value per signal (B, S), in units of each signal's reward standard deviation.

    Every signal has its own head, TD loss and discount (a single head on a summed reward lets dense
    watch time drown the sparse interactions). By default each head also has its own trunk, as in the
    TSCAC paper's critics: a sparse signal's TD errors then cannot reshape the features the others
    read. ``shared_trunk=True`` gives one torso for every head instead (cheaper, benchmarked). With a
    ``funnel`` (signal names, dense first), each head in it also sees the Q-values of the heads before
    it, detached so that a sparse head's TD error cannot distort the denser head it reads: the
    progressive multi-task critic of DESIGN 3.3.

    The critic reads an action as its departure from ``logged_action_coef``'s linear fit of the logged
    actions on the state. A logging policy whose mean follows the state makes the raw action a proxy
    for the state: the behaviour policy's click logit varies 0.43 over the states against its 0.3 of
    exploration, mostly down with the session's watch so far, which also foretells more clicks. Given
    raw actions, TSCAC's click head priced +1 watch logit at +1.9% to +5% of its value and +1 click
    logit at -0.3% to -3% while it trained, where the logs' discounted Monte-Carlo click returns,
    regressed on the exploration, say -0.9% and +0.8%; so the click actor raised watch time and lowered
    clicks (bench/stage_one_actors.py). The departure is the exploration, independent of the state by
    construction, so the action's effect is learnt apart from the state's (the same head: -0.3% and
    +0.5%): the residualised treatment of double machine learning (Robinson 1988; Chernozhukov et al.
    2018). Given the state it is a change of variables, so no function of (s, a) is lost.
    """

    def __init__(
        self,
        input_spec: tuple[tf.TensorSpec, tf.TensorSpec],
        signal_names: Sequence[str],
        *,
        state_mean: np.ndarray,
        state_std: np.ndarray,
        logged_action_coef: np.ndarray,
        hidden: Sequence[int] = (64, 64),
        head_hidden: int = 32,
        funnel: Sequence[str] = (),
        shared_trunk: bool = False,
        name: str = "MultiTaskCriticNetwork",
    ) -> None:  # pragma: no mutate block
        super().__init__(input_tensor_spec=input_spec, state_spec=(), name=name)
        self._signal_names = tuple(signal_names)
        self._funnel = _funnel_indices(signal_names, funnel)
        self._normalizer = _StateNormalizer(state_mean, state_std)
        self._logged_action = _LoggedActionFit(logged_action_coef)
        self._shared_trunk = shared_trunk
        self._torso = _critic_torso(hidden, len(signal_names), shared_trunk)
        self._heads = [
            (
                tf.keras.layers.Dense(head_hidden, activation="relu", name=f"head_{s}_hidden"),
                tf.keras.layers.Dense(1, name=f"head_{s}"),
            )
            for s in signal_names
        ]

    @property
    def signal_names(self) -> tuple[str, ...]:
        return self._signal_names

    def call(self, inputs, step_type=None, network_state=(), training=False):  # pragma: no mutate block
        return self.q_values(*inputs), network_state

    def q_values(self, observations: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
        """(B, S) one value per signal."""
        states = self._normalizer(observations)
        x = tf.concat([states, self._logged_action.departure(states, actions)], axis=-1)
        for layer in self._torso:
            x = layer(x)
        # each head's features: the one torso's output, or its own trunk's (S, B, units) slice
        features = [x] * len(self._heads) if self._shared_trunk else tf.unstack(x, len(self._heads))
        values: list[tf.Tensor | None] = [None] * len(self._heads)
        upstream: list[tf.Tensor] = []
        for index in self._funnel:  # funnel heads in order, each reading the ones before it
            values[index] = self._head(index, tf.concat([features[index], *upstream], axis=-1))
            upstream.append(tf.stop_gradient(values[index]))
        for index in range(len(self._heads)):
            if values[index] is None:
                values[index] = self._head(index, features[index])
        return tf.concat(values, axis=-1)

    def _head(self, index: int, features: tf.Tensor) -> tf.Tensor:
        hidden, out = self._heads[index]
        return out(hidden(features))


# -- live allocation (DESIGN 3.2): group-routed towers, a Bernoulli actor, a supervised distributional critic


def group_onehot(observations: tf.Tensor, groups: int) -> tf.Tensor:
    """(B, groups) routing weights from the raw state: its leading ``group_*`` one-hot columns, or a
    column of ones when ``groups`` is 1 (no routing: every user goes through the one tower)."""
    if groups == 1:
        return tf.ones_like(observations[:, :1], dtype=tf.float32)
    return tf.cast(observations[:, :groups], tf.float32)


class _NormedMLP(tf.Module):
    """Dense -> LayerNorm -> ReLU per layer: layer normalisation throughout keeps the critic's targets and
    the towers' activations on one scale whatever the group's reward level (SL-MGAC's stabiliser)."""

    def __init__(self, sizes: Sequence[int], name: str) -> None:
        super().__init__(name=name)
        self.layers = [
            (
                tf.keras.layers.Dense(n, name=f"{name}_{i}"),
                tf.keras.layers.LayerNormalization(name=f"{name}_{i}_norm"),
            )
            for i, n in enumerate(sizes)
        ]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for dense, norm in self.layers:
            x = tf.nn.relu(norm(dense(x)))
        return x


class GroupRoutedEncoder(tf.Module):
    """Multi-group state decomposition: a shared encoder, then one tower per user group, routed by group id.

    Every tower runs on the whole batch and each row keeps its own group's output (a one-hot mix), so a
    row's loss reaches only its group's tower and the shared encoder: the other towers' outputs are
    multiplied by zero for it. With ``groups=1`` it is the same network without routing.
    """

    def __init__(self, shared: Sequence[int], tower: Sequence[int], groups: int, name: str) -> None:
        super().__init__(name=name)
        if groups < 1:
            raise ValueError(f"groups should be at least 1, but is {groups}")
        self.groups = groups
        self.shared = _NormedMLP(shared, f"{name}_shared")
        self.towers = [_NormedMLP(tower, f"{name}_tower{g}") for g in range(groups)]

    def __call__(self, normalised: tf.Tensor, routing: tf.Tensor) -> tf.Tensor:
        x = self.shared(normalised)
        outputs = tf.stack([tower(x) for tower in self.towers], axis=1)  # (B, G, H)
        return tf.einsum("bgh,bg->bh", outputs, routing)


def _initial_insert_logit(initial_rate: float, epsilon: float) -> float:
    """The logit whose floored probability ``epsilon + (1 - 2 epsilon) sigmoid(logit)`` is ``initial_rate``,
    the rate inside the floor kept within [0.02, 0.98] so that the logit stays finite and trainable."""
    if not 0.0 < epsilon < 0.5:
        raise ValueError(f"epsilon should be in (0, 0.5), but is {epsilon}")
    rate = float(np.clip((initial_rate - epsilon) / (1.0 - 2.0 * epsilon), 0.02, 0.98))
    return float(np.log(rate / (1.0 - rate)))


class BernoulliActorNetwork(network.Network):
    """s -> Bernoulli(p(s)) over the insert flag, p = eps + (1 - 2 eps) sigmoid(logit(s)).

    The floor ``epsilon`` keeps every decision's propensity away from 0 and 1 (as the behaviour policy's
    does), so served decisions stay usable for importance-weighted OPE. The logit's bias starts at the
    logged insert rate, so an untrained actor allocates as often as the data did.
    """

    def __init__(
        self,
        observation_spec: tf.TensorSpec,
        *,
        state_mean: np.ndarray,
        state_std: np.ndarray,
        initial_rate: float,
        epsilon: float,
        shared: Sequence[int],
        tower: Sequence[int],
        groups: int,
        name: str = "BernoulliActorNetwork",
    ) -> None:  # pragma: no mutate block
        super().__init__(input_tensor_spec=observation_spec, state_spec=(), name=name)
        self._epsilon = epsilon
        self._groups = groups
        self._normalizer = _StateNormalizer(state_mean, state_std)
        self._encoder = GroupRoutedEncoder(shared, tower, groups, "actor")
        self._logit = tf.keras.layers.Dense(
            1,
            kernel_initializer=tf.keras.initializers.RandomUniform(-1e-3, 1e-3),
            bias_initializer=tf.keras.initializers.Constant(_initial_insert_logit(initial_rate, epsilon)),
            name="actor_logit",
        )

    @property
    def encoder(self) -> GroupRoutedEncoder:
        return self._encoder

    def insert_probability(self, observations: tf.Tensor) -> tf.Tensor:
        """(B,) probability of inserting the live stream."""
        x = self._encoder(self._normalizer(observations), group_onehot(observations, self._groups))
        p = tf.sigmoid(self._logit(x)[:, 0])
        return self._epsilon + (1.0 - 2.0 * self._epsilon) * p

    def call(self, observations, step_type=None, network_state=(), training=False):  # pragma: no mutate block
        p = self.insert_probability(observations)
        bernoulli = tfd.Bernoulli(probs=p[:, None], dtype=tf.float32)
        return tfd.Independent(bernoulli, reinterpreted_batch_ndims=1), network_state


#: Columns of the allocation critic's supervised heads, per action (DESIGN 3.2): immediate live watch,
#: displaced video watch and gift in reward-scale units, and the logit of the session ending.
SUPERVISED_TARGETS: tuple[str, ...] = ("live_watch_time", "video_watch_displaced", "gift", "exit")


class AllocationCriticNetwork(network.Network):
    """s -> per action (don't insert, insert): supervised predictions and a return distribution per value.

    Outputs ``(logits, supervised)``: ``logits`` (B, 2, V, atoms) are the categorical return distributions
    of the V values (the main, penalised live-watch return and the usage return) for each action;
    ``supervised`` (B, 2, 4) predicts the immediate ``SUPERVISED_TARGETS`` for each action; without
    supervised heads it is empty, (B, 2, 0). The value head reads the tower's features together with the
    supervised predictions, detached so that bootstrapped TD errors cannot bend the supervised fits (the
    progressive multi-task idea of DESIGN 3.3: the dense, directly observed signals inform the value).
    """

    def __init__(
        self,
        observation_spec: tf.TensorSpec,
        *,
        state_mean: np.ndarray,
        state_std: np.ndarray,
        values: int,
        atoms: int,
        shared: Sequence[int],
        tower: Sequence[int],
        head_hidden: int,
        groups: int,
        supervised: bool,
        name: str = "AllocationCriticNetwork",
    ) -> None:  # pragma: no mutate block
        super().__init__(input_tensor_spec=observation_spec, state_spec=(), name=name)
        self._groups, self._values, self._atoms, self._supervised = groups, values, atoms, supervised
        self._normalizer = _StateNormalizer(state_mean, state_std)
        self._encoder = GroupRoutedEncoder(shared, tower, groups, "critic")
        self._supervised_head = (
            tf.keras.layers.Dense(2 * len(SUPERVISED_TARGETS), name="supervised_heads")
            if supervised
            else None
        )
        self._value_hidden = _NormedMLP((head_hidden,), "value_hidden")
        self._value_out = tf.keras.layers.Dense(2 * values * atoms, name="value_logits")

    @property
    def encoder(self) -> GroupRoutedEncoder:
        return self._encoder

    @property
    def supervised(self) -> bool:
        return self._supervised

    def call(self, observations, step_type=None, network_state=(), training=False):  # pragma: no mutate block
        return self.outputs(observations), network_state

    def outputs(self, observations: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(logits, supervised)``, as the class says."""
        x = self._encoder(self._normalizer(observations), group_onehot(observations, self._groups))
        supervised = tf.zeros_like(x[:, :2])[:, :, None][:, :, :0]  # (B, 2, 0)
        features = x
        if self._supervised_head is not None:
            flat = self._supervised_head(x)
            supervised = tf.reshape(flat, [-1, 2, len(SUPERVISED_TARGETS)])
            features = tf.concat([x, tf.stop_gradient(flat)], axis=-1)
        logits = self._value_out(self._value_hidden(features))
        return tf.reshape(logits, [-1, 2, self._values, self._atoms]), supervised
