"""The networks every feed agent is built from: a Gaussian actor and a multi-task critic (DESIGN 3.1, 3.3).

Both normalise the state with the training data's moments inside the network, as fixed weights: the
exported policy then takes the raw logged state vector, and serving cannot apply a different scaling.
"""

from __future__ import annotations

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


class _StateNormalizer(tf.Module):
    """(state - mean) / std with the moments fixed at construction and saved with the model."""

    def __init__(self, mean: np.ndarray, std: np.ndarray, name: str = "state_normalizer") -> None:
        super().__init__(name=name)
        self.mean = tf.Variable(np.asarray(mean, np.float32), trainable=False, name="mean")
        self.std = tf.Variable(np.asarray(std, np.float32), trainable=False, name="std")

    def __call__(self, states: tf.Tensor) -> tf.Tensor:
        return (tf.cast(states, tf.float32) - self.mean) / self.std


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
    ) -> None:
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

    def call(self, observations, step_type=None, network_state=(), training=False):
        mean, std = self.mean_and_std(observations)
        return tfd.MultivariateNormalDiag(loc=mean, scale_diag=std), network_state


class MultiTaskCriticNetwork(network.Network):
    """(s, a) -> one Q-value per signal (B, S), in units of each signal's reward standard deviation.

    A shared torso feeds one small head per signal, so every signal gets its own TD loss and discount
    (a single head on a summed reward lets dense watch time drown the sparse interactions). With a
    ``funnel`` (signal names, dense first), each head in it also sees the Q-values of the heads before
    it, detached so that a sparse head's TD error cannot distort the denser head it reads: the
    progressive multi-task critic of DESIGN 3.3.
    """

    def __init__(
        self,
        input_spec: tuple[tf.TensorSpec, tf.TensorSpec],
        signal_names: Sequence[str],
        *,
        state_mean: np.ndarray,
        state_std: np.ndarray,
        hidden: Sequence[int] = (128, 128),
        head_hidden: int = 32,
        funnel: Sequence[str] = (),
        name: str = "MultiTaskCriticNetwork",
    ) -> None:
        super().__init__(input_tensor_spec=input_spec, state_spec=(), name=name)
        unknown = [s for s in funnel if s not in signal_names]
        if unknown:
            raise ValueError(
                f"funnel signals {unknown} are not among the critic's signals {list(signal_names)}"
            )
        self._signal_names = tuple(signal_names)
        self._funnel = tuple(signal_names.index(s) for s in funnel)
        self._normalizer = _StateNormalizer(state_mean, state_std)
        self._torso = _mlp(hidden, "critic")
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

    def call(self, inputs, step_type=None, network_state=(), training=False):
        observations, actions = inputs
        x = tf.concat([self._normalizer(observations), tf.cast(actions, tf.float32)], axis=-1)
        for layer in self._torso:
            x = layer(x)
        values: list[tf.Tensor | None] = [None] * len(self._heads)
        upstream: list[tf.Tensor] = []
        for index in self._funnel:  # funnel heads in order, each reading the ones before it
            values[index] = self._head(index, tf.concat([x, *upstream], axis=-1))
            upstream.append(tf.stop_gradient(values[index]))
        for index in range(len(self._heads)):
            if values[index] is None:
                values[index] = self._head(index, x)
        return tf.concat(values, axis=-1), network_state

    def _head(self, index: int, features: tf.Tensor) -> tf.Tensor:
        hidden, out = self._heads[index]
        return out(hidden(features))
