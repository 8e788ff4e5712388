"""Exported policies: a TF-Agents ``PolicySaver`` SavedModel plus the functions OPE and serving call.

Feed policies (``export_policy``, ``load_feed_policy``) and live-allocation policies
(``export_allocation_policy``, ``load_allocation_policy``) share the format: the SavedModel, the
``policy.json`` manifest with every file's sha256, and the atomic rename. For a feed policy:

Besides PolicySaver's standard signatures (``action`` samples an action from a ``TimeStep``), the
SavedModel carries three functions on raw state batches:

* ``mean_action({"observation"})``: the Gaussian's mean, the greedy ranking action, and
  ``action_std({"observation"})``: its standard deviation;
* ``sample_action({"observation", "seed"})``: mean + std * noise from a stateless seed, with the
  log-density of the drawn action, so a served decision is reproducible and its propensity exact;
* ``log_probability({"observation", "action"})``: log-density of given actions, for OPE.

A user-author value (``recsys_rl.training.pair_value``) carries ``values({"observation"})``: each pair
signal's value (N, S) of pair states (N, D), in the signal's units; PolicySaver's ``action`` gives the same.

An allocation policy (a Bernoulli insert flag, ``recsys_rl.training.agents.allocation``) carries instead:

* ``insert_probability({"observation"})``: the probability of inserting the live candidate;
* ``sample_action({"observation", "seed"})``: insert iff a stateless uniform draw falls below it, with the
  log-probability of the drawn decision;
* ``log_probability({"observation", "action"})``: log-probability of given decisions, (n, 1) flags.

The directory also holds ``policy.json`` (what the policy expects and the sha256 of every file). It is
written to a temporary name and renamed, so a reader never sees a half-exported policy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf
from absl import logging as absl_logging
from tf_agents.policies import policy_saver

from recsys_rl import signals
from recsys_rl.atomic_json import read_json_file
from recsys_rl.errors import OperationalError
from recsys_rl.exploration import Exploration
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.gaussian import ScalarGaussian, log_density
from recsys_rl.pair_state import PAIR_STATE_FEATURES
from recsys_rl.registry.policy_files import POLICY_MANIFEST, file_digests, mismatched_policy_files
from recsys_rl.state import FEATURE_VERSION, FEED_STATE_FEATURES, LIVE_STATE_FEATURES
from recsys_rl.training.agents.base import FeedAgent

if TYPE_CHECKING:
    from recsys_rl.training.agents.allocation import SLMGACAgent
    from recsys_rl.training.pair_value import PairValueAgent

POLICY_SCHEMA_VERSION = 1
#: The manifest's ``kind`` of each surface's policies.
POLICY_KINDS = {"feed": "feed_policy", "live_allocation": "allocation_policy", "user_author": "pair_value"}


class PolicyLoadError(OperationalError):
    """A policy directory that cannot be served: missing, corrupt, or built for another state layout."""


def export_policy(agent: FeedAgent, directory: str | Path, metadata: dict[str, Any]) -> dict[str, Any]:
    """Save the agent's main policy into ``directory`` (replacing an older export atomically)."""
    directory = Path(directory)
    actor = agent.actor
    observation_spec = tf.TensorSpec([len(FEED_STATE_FEATURES)], tf.float32, name="observation")
    action_spec = tf.TensorSpec([len(FEED_ACTION_NAMES)], tf.float32, name="action")

    def mean_action(inputs):
        return actor.mean_and_std(inputs["observation"])[0]

    def action_std(inputs):
        return actor.mean_and_std(inputs["observation"])[1]

    def sample_action(inputs):
        mean, std = actor.mean_and_std(inputs["observation"])
        noise = tf.random.stateless_normal(tf.shape(mean), seed=inputs["seed"][0])
        action = mean + std * noise
        dist, _ = actor(inputs["observation"])
        return {"action": action, "log_probability": dist.log_prob(action)}

    def log_probability(inputs):
        dist, _ = actor(inputs["observation"])
        return dist.log_prob(inputs["action"])

    saver = policy_saver.PolicySaver(agent.policy, batch_size=None, train_step=agent.train_step_counter)
    saver.register_function("mean_action", mean_action, {"observation": observation_spec})
    saver.register_function("action_std", action_std, {"observation": observation_spec})
    seed_spec = tf.TensorSpec([2], tf.int32, name="seed")
    saver.register_function(
        "sample_action", sample_action, {"observation": observation_spec, "seed": seed_spec}
    )
    saver.register_function(
        "log_probability", log_probability, {"observation": observation_spec, "action": action_spec}
    )
    manifest = {
        "schema_version": POLICY_SCHEMA_VERSION,
        "kind": POLICY_KINDS["feed"],
        "surface": "feed",
        "feature_names": list(FEED_STATE_FEATURES),
        "feature_version": FEATURE_VERSION,
        "action_names": list(FEED_ACTION_NAMES),
        "signals": list(signals.FEED_SIGNALS),
        "train_step": int(agent.train_step_counter.numpy()),
        **metadata,
    }
    return _save(saver, directory, manifest)


def _save(saver: policy_saver.PolicySaver, directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Save into a staging directory, add ``policy.json`` with every file's sha256, rename into place."""
    staging = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    verbosity = absl_logging.get_verbosity()
    with warnings.catch_warnings():
        # PolicySaver records the actor's distribution type in the SavedModel and warns that reading that
        # record back needs TFP; our readers call the functions above and never read it. It also logs,
        # per exported function, that TF-Agents' nested argument names ("0/step_type") were sanitised.
        warnings.filterwarnings("ignore", message="Encoding a StructuredValue with type tfp")
        absl_logging.set_verbosity(absl_logging.ERROR)
        try:
            saver.save(str(staging))
        finally:
            absl_logging.set_verbosity(verbosity)
    manifest = {**manifest, "sha256": file_digests(staging)}
    (staging / POLICY_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(directory, old)
        os.rename(staging, directory)
        shutil.rmtree(old)
    else:
        os.rename(staging, directory)
    return manifest


@dataclass
class _SavedPolicy:
    """An exported SavedModel loaded with its manifest; ``sample`` picks exploring or serving the mode."""

    directory: Path
    manifest: dict[str, Any]
    model: Any
    sample: bool = False

    @property
    def version(self) -> str:
        return str(self.manifest.get("version", self.directory.name))


@dataclass
class SavedFeedPolicy(_SavedPolicy):
    """A loaded feed policy with numpy in and out; meets the simulator's ``FeedPolicy`` protocol.

    ``act`` serves the mean (``sample=False``) or mean + std * noise from the caller's generator, and
    returns the log-density of the action it returns.

    With a ``twin`` (``load_feed_policy(..., numpy=True)``) the checked numpy copy of the actor computes
    instead of the SavedModel: a simulator page is a small batch, where TensorFlow's per-call dispatch
    costs more than the network.
    """

    twin: NumpyGaussianActor | None = None

    def mean(self, states: np.ndarray) -> np.ndarray:
        if self.twin is not None:
            return self.twin.mean(states)
        return _call(self.model.mean_action, observation=states)

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        if self.twin is not None:
            return self.twin.log_prob(states, actions)
        return _call(self.model.log_probability, observation=states, action=actions)

    def std(self, states: np.ndarray) -> np.ndarray:
        if self.twin is not None:
            return np.broadcast_to(self.twin.sigma, (len(states), self.twin.sigma.size))
        return _call(self.model.action_std, observation=states)

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        actions = self.mean(states)
        if self.sample:
            actions = actions + self.std(states) * rng.standard_normal(actions.shape)
        return actions, self.log_prob(states, actions)


@dataclass(frozen=True)
class NumpyGaussianActor:
    """The exported actor as numpy arrays: the same function as the SavedModel, without TensorFlow's
    per-call dispatch, which costs more than the network itself for one state on a request path.

    Built only by ``numpy_actor``, which checks it against the SavedModel before anyone uses it.
    """

    state_mean: np.ndarray  # (D,)
    state_std: np.ndarray  # (D,)
    hidden: tuple[tuple[np.ndarray, np.ndarray], ...]  # (kernel, bias) of each ReLU layer
    output: tuple[np.ndarray, np.ndarray]  # (kernel, bias) of the mean layer
    sigma: np.ndarray  # (K,) the state-independent std

    def mean(self, states: np.ndarray) -> np.ndarray:
        x = (np.asarray(states, np.float64) - self.state_mean) / self.state_std
        for kernel, bias in self.hidden:
            x = np.maximum(x @ kernel + bias, 0.0)
        return x @ self.output[0] + self.output[1]

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return log_density(actions, self.mean(states), self.sigma)


def numpy_actor(policy: SavedFeedPolicy, *, probes: int = 64, tolerance: float = 1e-4) -> NumpyGaussianActor:
    """The policy's actor as numpy, refused (PolicyLoadError) unless it reproduces the SavedModel's mean
    and log-densities on random states and actions: a serving shortcut must never become a skew."""
    from recsys_rl.training.agents.networks import LOG_STD_RANGE  # the clip the network applies to log_std

    named, layers = _model_variables(policy.model)
    depth = sum(1 for name in layers if re.fullmatch(r"actor_\d+/kernel", name))
    actor = NumpyGaussianActor(
        state_mean=named["mean"],
        state_std=named["std"],
        hidden=tuple((layers[f"actor_{i}/kernel"], layers[f"actor_{i}/bias"]) for i in range(depth)),
        output=(layers["actor_mean/kernel"], layers["actor_mean/bias"]),
        sigma=np.exp(np.clip(named["log_std"], *LOG_STD_RANGE)),
    )
    rng = np.random.default_rng(0)
    states = actor.state_mean + actor.state_std * rng.standard_normal((probes, actor.state_mean.size))
    actions = policy.mean(states) + actor.sigma * rng.standard_normal((probes, actor.sigma.size))
    gaps = (
        np.max(np.abs(actor.mean(states) - policy.mean(states))),
        np.max(np.abs(actor.log_prob(states, actions) - policy.log_prob(states, actions))),
    )
    if not max(gaps) <= tolerance:
        raise PolicyLoadError(
            f"{policy.directory}: the numpy actor differs from the SavedModel by {max(gaps):.2e} "
            f"(mean {gaps[0]:.2e}, log-density {gaps[1]:.2e}); the export's layout is not the one expected"
        )
    return actor


@dataclass(frozen=True)
class NumpyPairValue:
    """An exported user-author value as numpy: on a Rank's few dozen pairs TensorFlow's call costs a
    millisecond (``bench/user_author_serving.py``), the arithmetic a small share of that.

    The MTCL critic has one trunk (2-D kernels) and every head in the funnel, each reading the values of
    the heads before it in signal order; the independent critic has a trunk per head (3-D kernels) and no
    funnel. Built only by ``numpy_pair_value``, which checks it against the SavedModel first.
    """

    state_mean: np.ndarray  # (D,)
    state_std: np.ndarray  # (D,)
    trunk: tuple[
        tuple[np.ndarray, np.ndarray], ...
    ]  # (kernel, bias) per depth; kernels (in, out) or (S, in, out)
    heads: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]  # per signal: hidden, output
    reward_std: np.ndarray  # (S,) the heads are in reward-std units

    def values(self, states: np.ndarray) -> np.ndarray:
        """(N, D) pair states -> (N, S) values in their signals' units, as ``SavedPairValue.values``."""
        x = (np.asarray(states, np.float64) - self.state_mean) / self.state_std
        for kernel, bias in self.trunk:
            x = np.maximum((x @ kernel if kernel.ndim == 2 else np.matmul(x, kernel)) + bias, 0.0)
        funnel = x.ndim == 2  # one shared trunk: the MTCL funnel, in signal order
        outputs: list[np.ndarray] = []
        for index, (hidden_kernel, hidden_bias, out_kernel, out_bias) in enumerate(self.heads):
            features = np.concatenate([x, *outputs], axis=-1) if funnel else x[index]
            outputs.append(np.maximum(features @ hidden_kernel + hidden_bias, 0.0) @ out_kernel + out_bias)
        return np.concatenate(outputs, axis=-1) * self.reward_std


_HEAD_PARTS = ("_hidden/kernel", "_hidden/bias", "/kernel", "/bias")


def _model_variables(model) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A loaded SavedModel's variables as float64, by full name and, for layers, by their last two name
    parts ("main_actor/actor_0/kernel:0" -> "actor_0/kernel"); the state normaliser's "mean" and "std"
    (and an actor's "log_std") are bare names."""
    named = {v.name.removesuffix(":0"): v.numpy().astype(np.float64) for v in model.model_variables}
    layers = {"/".join(name.split("/")[-2:]): value for name, value in named.items() if "/" in name}
    return named, layers


def numpy_pair_value(policy: SavedPairValue, *, probes: int = 64, tolerance: float = 1e-4) -> NumpyPairValue:
    """The policy's values as numpy, refused (PolicyLoadError) unless they reproduce the SavedModel's on
    random states, relative to each signal's reward std: a serving shortcut must never become a skew."""
    named, layers = _model_variables(policy.model)
    depth = sum(1 for name in layers if re.fullmatch(r"critic_\d+/kernel", name))
    twin = NumpyPairValue(
        state_mean=named["mean"],
        state_std=named["std"],
        trunk=tuple((layers[f"critic_{i}/kernel"], layers[f"critic_{i}/bias"]) for i in range(depth)),
        heads=tuple(
            tuple(layers[f"head_{s}{part}"] for part in _HEAD_PARTS) for s in policy.manifest["signals"]
        ),
        reward_std=np.asarray(policy.manifest["reward_std"], np.float64),
    )
    rng = np.random.default_rng(0)
    states = twin.state_mean + twin.state_std * rng.standard_normal((probes, twin.state_mean.size))
    gap = float(np.max(np.abs(twin.values(states) - policy.values(states)) / twin.reward_std))
    if not gap <= tolerance:
        raise PolicyLoadError(
            f"{policy.directory}: the numpy values differ from the SavedModel's by {gap:.2e} reward stds; "
            "the export's layout is not the one expected"
        )
    return twin


def _call(function, **inputs: np.ndarray) -> np.ndarray:
    """``function`` of a SavedModel on row batches, as float64 numpy.

    The rows are padded to the next power of two: TensorFlow's CPU kernels slow down with every new
    batch shape they meet (a simulator's pages differ in size each call). Measured on a pair value:
    2.7 s per 50 calls at first and 5.4 s after 200; padded, 0.5-1.0 s throughout (20,000 rows a
    call on average). The rows do not interact, so the padding's answers are dropped."""
    n = len(next(iter(inputs.values())))
    size = 1 << max(n - 1, 0).bit_length()
    padded = {}
    for name, values in inputs.items():
        rows = np.zeros((size, *np.shape(values)[1:]), np.float32)
        rows[:n] = values
        padded[name] = tf.constant(rows)
    return function(padded).numpy()[:n].astype(np.float64)


def _open_policy(directory: Path, kind: str, features: tuple[str, ...], verify: bool) -> tuple[dict, Any]:
    """The manifest and the loaded SavedModel of an exported policy of ``kind``, checked first."""
    manifest_path = directory / POLICY_MANIFEST
    manifest = read_json_file(manifest_path, PolicyLoadError, "not an exported policy")
    if manifest.get("schema_version") != POLICY_SCHEMA_VERSION or manifest.get("kind") != kind:
        raise PolicyLoadError(
            f"{manifest_path} is not a {kind} of schema {POLICY_SCHEMA_VERSION} "
            f"(kind {manifest.get('kind')!r}, schema {manifest.get('schema_version')!r})"
        )
    if tuple(manifest.get("feature_names", ())) != features:
        raise PolicyLoadError(f"{directory} expects state features {manifest.get('feature_names')}")
    if verify and (changed := mismatched_policy_files(directory, manifest)):
        raise PolicyLoadError(f"{directory} does not match its manifest: {changed[:5]}")
    try:
        model = tf.saved_model.load(str(directory))
    except (OSError, ValueError, tf.errors.OpError) as err:
        raise PolicyLoadError(f"cannot load the SavedModel in {directory}: {err}") from None
    return manifest, model


def load_feed_policy(
    directory: str | Path, *, sample: bool = False, verify: bool = True, numpy: bool = False
) -> SavedFeedPolicy:
    """The exported feed policy; ``numpy``: computed by its numpy twin, checked against it first."""
    directory = Path(directory)
    manifest, model = _open_policy(directory, POLICY_KINDS["feed"], FEED_STATE_FEATURES, verify)
    policy = SavedFeedPolicy(directory, manifest, model, sample)
    return dataclasses.replace(policy, twin=numpy_actor(policy)) if numpy else policy


# -- live allocation ----------------------------------------------------------------------------------------


def export_allocation_policy(
    agent: SLMGACAgent, directory: str | Path, metadata: dict[str, Any]
) -> dict[str, Any]:
    """Save an allocation agent's actor into ``directory`` (replacing an older export atomically)."""
    directory = Path(directory)
    actor = agent.actor
    observation_spec = tf.TensorSpec([len(LIVE_STATE_FEATURES)], tf.float32, name="observation")

    def log_prob(observations, inserts):
        p = actor.insert_probability(observations)
        return tf.where(inserts > 0.5, tf.math.log(p), tf.math.log1p(-p))

    def insert_probability(inputs):
        return actor.insert_probability(inputs["observation"])

    def sample_action(inputs):
        p = actor.insert_probability(inputs["observation"])
        uniform = tf.random.stateless_uniform(tf.shape(p), seed=inputs["seed"][0])
        action = tf.cast(uniform < p, tf.float32)
        return {"action": action, "log_probability": log_prob(inputs["observation"], action)}

    def log_probability(inputs):
        return log_prob(inputs["observation"], tf.reshape(inputs["action"], [-1]))

    saver = policy_saver.PolicySaver(agent.policy, batch_size=None, train_step=agent.train_step_counter)
    saver.register_function("insert_probability", insert_probability, {"observation": observation_spec})
    seed_spec = tf.TensorSpec([2], tf.int32, name="seed")
    saver.register_function(
        "sample_action", sample_action, {"observation": observation_spec, "seed": seed_spec}
    )
    action_spec = tf.TensorSpec([1], tf.float32, name="action")
    saver.register_function(
        "log_probability", log_probability, {"observation": observation_spec, "action": action_spec}
    )
    manifest = {
        "schema_version": POLICY_SCHEMA_VERSION,
        "kind": POLICY_KINDS["live_allocation"],
        "surface": "live_allocation",
        "feature_names": list(LIVE_STATE_FEATURES),
        "feature_version": FEATURE_VERSION,
        "action_names": ["insert"],
        "signals": list(signals.LIVE_SIGNALS),
        "epsilon": agent.config.epsilon,
        "train_step": int(agent.train_step_counter.numpy()),
        **metadata,
    }
    return _save(saver, directory, manifest)


@dataclass
class SavedAllocationPolicy(_SavedPolicy):
    """A loaded allocation policy with numpy in and out; meets the simulator's ``AllocationPolicy``.

    ``act`` inserts with the policy's probability (``sample=True``) or serves its mode (insert iff the
    probability is at least one half) and returns the log-probability of the decision it returns.
    """

    def insert_probability(self, states: np.ndarray) -> np.ndarray:
        return _call(self.model.insert_probability, observation=states)

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Log-probability of decisions given as (n,) or (n, 1) insert flags."""
        flags = np.asarray(actions, np.float32).reshape(-1, 1)
        return _call(self.model.log_probability, observation=states, action=flags)

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        p = self.insert_probability(states)
        inserts = (rng.random(p.shape) < p) if self.sample else (p >= 0.5)
        actions = inserts.astype(np.int64)
        return actions, np.where(inserts, np.log(p), np.log1p(-p))

    def for_ope(self) -> ColumnActions:
        """This policy with (n, 1) actions, the layout of the logged allocation steps OPE reads."""
        return ColumnActions(self)


@dataclass(frozen=True)
class ColumnActions:
    """An allocation policy whose ``act`` returns its (n,) decisions as an (n, 1) float column."""

    policy: Any

    @property
    def version(self) -> str:
        return self.policy.version

    def log_prob(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return self.policy.log_prob(states, np.asarray(actions).reshape(-1))

    def act(self, states: np.ndarray, rng: Exploration) -> tuple[np.ndarray, np.ndarray]:
        actions, log_prob = self.policy.act(states, rng)
        return np.asarray(actions, np.float32)[:, None], log_prob


def load_allocation_policy(
    directory: str | Path, *, sample: bool = False, verify: bool = True
) -> SavedAllocationPolicy:
    directory = Path(directory)
    manifest, model = _open_policy(directory, POLICY_KINDS["live_allocation"], LIVE_STATE_FEATURES, verify)
    return SavedAllocationPolicy(directory, manifest, model, sample)


# -- user-author values ---------------------------------------------------------------------------------


def export_pair_value_policy(
    agent: PairValueAgent, directory: str | Path, metadata: dict[str, Any]
) -> dict[str, Any]:
    """Save a user-author critic's values into ``directory`` (replacing an older export atomically)."""
    policy = agent.policy
    observation_spec = tf.TensorSpec([len(PAIR_STATE_FEATURES)], tf.float32, name="observation")
    saver = policy_saver.PolicySaver(policy, batch_size=None, train_step=agent.train_step_counter)
    saver.register_function(
        "values", lambda inputs: policy.values(inputs["observation"]), {"observation": observation_spec}
    )
    manifest = {
        "schema_version": POLICY_SCHEMA_VERSION,
        "kind": POLICY_KINDS["user_author"],
        "surface": "user_author",
        "feature_names": list(PAIR_STATE_FEATURES),
        "signals": list(signals.PAIR_SIGNALS),
        "discounts": list(agent.config.discounts),
        "reward_std": agent.reward_std.tolist(),  # a ranking term combines the values in these units
        "term": {  # the ranking term serving builds (PairValueConfig)
            "coefficients": list(agent.config.term_coefficients),
            "weight_logit_mean": math.log(agent.config.term_weight),
            "weight_logit_std": agent.config.term_weight_std,
        },
        "train_step": int(agent.train_step_counter.numpy()),
        **metadata,
    }
    return _save(saver, Path(directory), manifest)


@dataclass(frozen=True)
class RankingTerm:
    """The ranking term an exported user-author value makes (``PairValueConfig``'s term settings): what
    serving adds to a candidate's score and what the OPE gate re-weights."""

    coefficients: tuple[float, ...]  # per signal, on the values in reward-std units
    weight_logit_mean: float
    weight_logit_std: float
    term_id: str  # which term function (``term_id``)

    def weight(self, version: str) -> ScalarGaussian:
        """The weight logit's Gaussian: what serving draws each Rank's weight from and the gate scores."""
        return ScalarGaussian(self.weight_logit_mean, self.weight_logit_std, version)


def ranking_term(manifest: dict[str, Any], where: str | Path) -> RankingTerm:
    """The ranking term of a user-author value's manifest; PolicyLoadError naming ``where`` when it has
    none (an export from before serving built the term, or another kind of policy)."""
    term = manifest.get("term")
    keys = ("coefficients", "weight_logit_mean", "weight_logit_std")
    if (
        manifest.get("kind") != POLICY_KINDS["user_author"]
        or not isinstance(term, dict)
        or not set(keys) <= set(term)
    ):
        raise PolicyLoadError(
            f"{where}: no user-author value with a ranking term ({', '.join(keys)}; kind "
            f"{POLICY_KINDS['user_author']}); export it again with this version of recsys-rl"
        )
    return RankingTerm(
        tuple(term["coefficients"]),
        float(term["weight_logit_mean"]),
        float(term["weight_logit_std"]),
        term_id(manifest),
    )


def term_id(manifest: dict[str, Any]) -> str:
    """Which ranking term an exported user-author value makes: a digest of its weights' files, reward
    stds and term coefficients, but not of the weight's distribution.

    Two versions with the same term id rank every page alike for the same weight, so logs served with
    one re-weight to the other by the weight's density alone (the OPE gate's ``user_author`` surface);
    any other difference needs logs of its own."""
    digests = manifest["sha256"]
    identity = {
        "variables": {name: digests[name] for name in sorted(digests) if name.startswith("variables/")},
        "reward_std": manifest["reward_std"],
        "coefficients": manifest["term"]["coefficients"],
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class SavedPairValue(_SavedPolicy):
    """A loaded user-author value with numpy in and out."""

    def values(self, states: np.ndarray) -> np.ndarray:
        """(N, D) pair states -> (N, S) values in ``manifest["signals"]`` order, in their units."""
        return _call(self.model.values, observation=states)


def load_pair_value_policy(directory: str | Path, *, verify: bool = True) -> SavedPairValue:
    directory = Path(directory)
    manifest, model = _open_policy(directory, POLICY_KINDS["user_author"], PAIR_STATE_FEATURES, verify)
    return SavedPairValue(directory, manifest, model)
