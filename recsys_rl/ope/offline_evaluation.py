"""Offline evaluation of a target policy on logged decisions: every estimator, every signal, with intervals.

``evaluate_policy_offline`` values one policy; ``evaluate_lift`` compares a candidate with an incumbent
policy or with the behaviour policy that logged the data. Both return plain JSON-able dicts (floats,
ints, strings, lists, dicts; a non-finite number is ``None``) that the rollout gate and the HTML report
read, so their layout below is a contract: add keys, never rename or remove them without bumping
``SCHEMA_VERSION``.

Common pieces
-------------
``entry``: ``{"value": float, "interval": [low, high], "method": "bca" | "percentile",
  "dropped_resamples": int}``, the estimate and its two-sided 1 - alpha bootstrap interval; resamples
  whose estimate was not finite are left out and counted, and past 1% of them the interval is
  ``[null, null]`` (``recsys_rl.ope.intervals.bootstrap_interval``), which no gate rule can pass.
``block``: ``{"overall": {signal: X}, "groups": {group name: {signal: X}}}`` for some X; ``groups`` holds
  the user groups present in the logs (names from ``recsys_rl.state.ACTIVITY_GROUPS``) and is ``{}`` when
  called with ``groups=False``.
Estimator names: single-decision ``ips``, ``clipped_ips``, ``ncis``, ``snips``, ``dm``, ``dr``, ``sndr``,
  ``switch_dr`` (scale ``per_decision``: mean reward per logged decision, comparable with
  ``monte_carlo_values(...).per_request``); sequential ``pdis``, ``wpdis``, ``sequential_dr``, ``fqe``
  (scale ``per_session_discounted``: mean discounted session return, comparable with
  ``monte_carlo_values(...).feed``).

``evaluate_policy_offline`` returns::

    {
      "schema_version": 1, "kind": "ope_evaluation",
      "signals": [signal, ...], "rows": int, "sessions": int,
      "group_sizes": {group name: {"rows": int, "sessions": int}},
      "excluded": {reason: {"decisions": int, "sessions": int}},
      "interval": {"method", "alpha", "resamples", "seed", "unit": "user" | "session", "users": int,
                   "jackknife_blocks"},
      "settings": {OPESettings fields but thresholds},
      "estimators": {name: {"kind": "single_decision" | "sequential",
                            "scale": "per_decision" | "per_session_discounted",
                            "model_error_included": bool, **block of entry}},
      "behaviour": {"per_decision": block of entry, "per_session_discounted": block of entry},
      "concentration": {"estimator": "clipped_ips", "cap": float, "range_source": str, "assumes": str,
                        "signals": {signal: {"value", "range": [lo, hi], "hoeffding": [lo, hi],
                                             "bernstein": [lo, hi]}}},
      "diagnostics": recsys_rl.ope.diagnostics.diagnose(...),
      "reward_model_fit": {"out_of_fold": true,
                           "signals": {signal: {"r2", "rmse", "mean_reward"}}} | None,
      "risk": {"target" | "behaviour": recsys_rl.ope.risk.return_distribution(...)}
    }

``behaviour`` is the logged data's own (on-policy) value on both scales, from the same resamples.
``excluded`` is what the reader left out of the logs before any of this, by reason (``LoggedSteps.excluded``,
``recsys_rl.ope.logged.EXCLUSION_REASONS``: sessions holding a decision served as the policy's mode), and
``{}`` when nothing was; ``rows`` and ``sessions`` count what is left.

``evaluate_lift`` returns::

    {
      "schema_version": 1, "kind": "ope_lift",
      "baseline": "behaviour" | "incumbent",
      "signals": [...], "directions": {signal: +1 | -1}, "rows", "sessions", "group_sizes", "excluded",
      "interval",
      "settings",
      "estimators": {name: {"kind", "scale", "model_error_included",
                            **block of {"candidate": entry, "baseline": entry,
                                        "difference": entry, "relative": entry}}},
      "reward_model_fit": as above,
      "risk": {"candidate" | "baseline": recsys_rl.ope.risk.return_distribution(...)},
      "diagnostics": {"candidate": diagnose(...), "baseline": diagnose(...) | None}
    }

What the intervals cover: ``unit`` is what the bootstrap resampled: ``user`` (the default: a user's
sessions are drawn together, since they share the user's tastes and history) or ``session`` (each
session on its own, which understates the spread of multi-day logs). Units are resampled with the fitted
reward model and FQE held fixed. For the importance-weighted and doubly robust estimators the weighted
residuals carry the model's error into the interval; DM and FQE intervals only reflect which states
happened to be logged, not how wrong the model is (their measured coverage was 0.08-0.40 and 0.82), so
each estimator's entry says ``"model_error_included": false`` for them and the gate refuses them.

``difference`` is candidate - baseline and ``relative`` is (candidate - baseline) / |baseline|, each with
the interval of that quantity computed on the same resamples as both values (paired), which is far
tighter than combining two separate intervals. With the behaviour policy as baseline, ``baseline`` is
the logged data's on-policy value on the estimator's scale; ``directions`` says which way is better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from recsys_rl import signals as signal_registry
from recsys_rl.ope import estimators as single
from recsys_rl.ope import sequential
from recsys_rl.ope.diagnostics import DiagnosticThresholds, diagnose
from recsys_rl.ope.intervals import (
    INTERVAL_METHODS,
    JACKKNIFE_BLOCKS,
    GroupedResamples,
    Statistic,
    bootstrap_interval,
    empirical_bernstein_interval,
    hoeffding_interval,
    resample_sums,
)
from recsys_rl.ope.logged import LoggedSteps, ScoredPolicy, group_label, target_log_prob
from recsys_rl.ope.reward_model import QPredictions, fit_reward_model
from recsys_rl.ope.risk import return_distribution
from recsys_rl.ope.terms import RatioTerms, ratio_value

SCHEMA_VERSION = 1
#: What the bootstrap resamples: a user's sessions together, or each session on its own.
BOOTSTRAP_UNITS = ("user", "session")
SINGLE_DECISION = ("ips", "clipped_ips", "ncis", "snips", "dm", "dr", "sndr", "switch_dr")
SEQUENTIAL = ("pdis", "wpdis", "sequential_dr", "fqe")
ESTIMATORS = SINGLE_DECISION + SEQUENTIAL
#: Estimators that are a fitted model's prediction alone, and why their intervals fall short: the
#: bootstrap holds the model fixed, so it leaves the model's error out (see the module docstring). No gate
#: may read them (``recsys_rl.ope.gate``), and every result marks them.
MODEL_ONLY = {
    "dm": "its bootstrap interval holds the fitted reward model fixed and so does not include the "
    "model's error (measured coverage 0.08-0.40 for DM)",
    "fqe": "its bootstrap interval holds the fitted FQE model fixed and so does not include the "
    "model's error (measured coverage 0.815 for FQE)",
}
_REWARD_MODEL = {"dm", "dr", "sndr", "switch_dr"}
_FQE_MODEL = {"sequential_dr", "fqe"}
_SCALES = {"single_decision": "per_decision", "sequential": "per_session_discounted"}


@dataclass(frozen=True)
class OPESettings:
    """Knobs of the estimators and models; the defaults are what the gate uses."""

    cap: float = 10.0  # importance-weight cap of clipped IPS and NCIS
    switch_tau: float = 10.0  # Switch-DR uses the DR correction where the weight is at most this
    folds: int = 5  # cross-fitting folds (by session) of the reward model and FQE
    ridge: float = 1e-3  # ridge penalty on standardised features
    samples: int = 4  # target actions drawn per state for v = E_pi q
    fqe_iterations: int = sequential.FQE_ITERATIONS
    jackknife_blocks: int = JACKKNIFE_BLOCKS
    thresholds: DiagnosticThresholds = field(default_factory=DiagnosticThresholds)

    def __post_init__(self) -> None:
        if self.cap <= 0 or self.switch_tau <= 0:
            raise ValueError(f"cap and switch_tau should be positive, but are {self.cap}, {self.switch_tau}")
        if self.folds < 2:
            raise ValueError(f"folds should be at least 2 (cross-fitting), but is {self.folds}")
        if self.ridge <= 0 or self.samples < 1 or self.fqe_iterations < 0 or self.jackknife_blocks < 2:
            raise ValueError(
                "ridge should be > 0, samples >= 1, fqe_iterations >= 0 and jackknife_blocks >= 2; got "
                f"{self.ridge}, {self.samples}, {self.fqe_iterations}, {self.jackknife_blocks}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "thresholds"}


def kind_of(estimator: str) -> str:
    return "single_decision" if estimator in SINGLE_DECISION else "sequential"


@dataclass(frozen=True)
class PolicyTerms:
    """Per-session terms of each requested estimator for one policy, and its log importance ratios."""

    terms: dict[str, RatioTerms]
    log_ratio: np.ndarray
    reward: QPredictions | None  # the cross-fitted reward model, when an estimator needed one


def estimator_terms(
    logged: LoggedSteps, policy: ScoredPolicy, estimators: Sequence[str], settings: OPESettings, seed: int
) -> PolicyTerms:
    """Fit what the estimators need (reward model, FQE) and return their per-session terms."""
    log_ratio = single.log_importance_ratio(
        target_log_prob(policy, logged.states, logged.actions), logged.behaviour_log_prob
    )
    w, r = single.importance_weights(log_ratio), logged.rewards
    gammas = sequential.default_gammas(logged)
    model_args = {"folds": settings.folds, "ridge": settings.ridge, "samples": settings.samples, "seed": seed}
    reward: QPredictions | None = None
    if _REWARD_MODEL & set(estimators):
        reward = fit_reward_model(logged, policy, **model_args)
    fqe: QPredictions | None = None
    if _FQE_MODEL & set(estimators):
        fqe = sequential.fit_fqe(
            logged, policy, gammas=gammas, iterations=settings.fqe_iterations, **model_args
        )
    builders = {
        "ips": lambda: single.ips(r, w),
        "clipped_ips": lambda: single.clipped_ips(r, w, settings.cap),
        "ncis": lambda: single.ncis(r, w, settings.cap),
        "snips": lambda: single.snips(r, w),
        "dm": lambda: single.dm(reward.v_target),
        "dr": lambda: single.dr(r, w, reward.q_logged, reward.v_target),
        "sndr": lambda: single.sndr(r, w, reward.q_logged, reward.v_target),
        "switch_dr": lambda: single.switch_dr(r, w, reward.q_logged, reward.v_target, settings.switch_tau),
        "pdis": lambda: sequential.pdis(logged, log_ratio, gammas),
        "wpdis": lambda: sequential.wpdis(logged, log_ratio, gammas),
        "sequential_dr": lambda: sequential.sequential_dr(logged, log_ratio, gammas, fqe),
        "fqe": lambda: sequential.fqe(logged, fqe),
    }
    terms = {}
    for name in estimators:
        built = builders[name]()
        terms[name] = built.sum_by(logged.session_starts) if name in SINGLE_DECISION else built
    return PolicyTerms(terms, log_ratio, reward)


def behaviour_terms(logged: LoggedSteps) -> dict[str, RatioTerms]:
    """The logged data's own value per scale: mean reward per decision, mean discounted session return."""
    return {
        "per_decision": RatioTerms.mean(logged.rewards).sum_by(logged.session_starts),
        "per_session_discounted": sequential.on_policy_return(logged, sequential.default_gammas(logged)),
    }


def evaluate_policy_offline(
    logged: LoggedSteps,
    target: ScoredPolicy,
    *,
    estimators: Sequence[str] = ESTIMATORS,
    interval: str = "bca",
    resamples: int = 200,
    alpha: float = 0.05,
    seed: int = 0,
    groups: bool = True,
    settings: OPESettings | None = None,
    unit: str = "user",
) -> dict[str, Any]:
    """Every requested estimator of ``target``'s value, per signal, overall and per group (schema above)."""
    settings = settings or OPESettings()
    _check(estimators, interval, alpha, unit)
    candidate = estimator_terms(logged, target, estimators, settings, seed)
    behaviour = behaviour_terms(logged)
    layout = _Layout({**{f"target/{k}": v for k, v in candidate.terms.items()}, **behaviour})
    draws = layout.resample(
        logged, resamples=resamples, seed=seed, blocks=settings.jackknife_blocks, unit=unit
    )
    report = _Reporter(draws, interval, alpha, logged.signals, groups)
    return {
        **_header(logged, "ope_evaluation", interval, alpha, resamples, seed, settings, unit),
        "estimators": {
            name: {**_estimator_header(name), **report(layout.statistic(f"target/{name}"))}
            for name in estimators
        },
        "behaviour": {scale: report(layout.statistic(scale)) for scale in behaviour},
        "concentration": _concentration(logged, candidate.log_ratio, settings.cap, alpha),
        "diagnostics": diagnose(logged, candidate.log_ratio, settings.thresholds),
        "reward_model_fit": reward_model_fit(logged, candidate.reward),
        "risk": {
            "target": return_distribution(logged, candidate.log_ratio),
            "behaviour": return_distribution(logged, None),
        },
    }


def evaluate_lift(
    logged: LoggedSteps,
    candidate: ScoredPolicy,
    baseline: ScoredPolicy | None = None,
    *,
    estimators: Sequence[str] = ESTIMATORS,
    interval: str = "bca",
    resamples: int = 200,
    alpha: float = 0.05,
    seed: int = 0,
    groups: bool = True,
    settings: OPESettings | None = None,
    unit: str = "user",
) -> dict[str, Any]:
    """Candidate vs ``baseline`` (an incumbent policy, or None for the behaviour policy), paired."""
    settings = settings or OPESettings()
    _check(estimators, interval, alpha, unit)
    new = estimator_terms(logged, candidate, estimators, settings, seed)
    blocks = {f"candidate/{k}": v for k, v in new.terms.items()}
    old = None
    if baseline is None:
        blocks.update(behaviour_terms(logged))
    else:
        old = estimator_terms(logged, baseline, estimators, settings, seed)
        blocks.update({f"baseline/{k}": v for k, v in old.terms.items()})
    layout = _Layout(blocks)
    draws = layout.resample(
        logged, resamples=resamples, seed=seed, blocks=settings.jackknife_blocks, unit=unit
    )
    report = _Reporter(draws, interval, alpha, logged.signals, groups)

    def lift(name: str) -> dict[str, Any]:
        new_value = layout.statistic(f"candidate/{name}")
        old_value = layout.statistic(_SCALES[kind_of(name)] if old is None else f"baseline/{name}")

        def difference(sums: np.ndarray) -> np.ndarray:
            return new_value(sums) - old_value(sums)

        def relative(sums: np.ndarray) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                return difference(sums) / np.abs(old_value(sums))

        parts = {
            "candidate": new_value,
            "baseline": old_value,
            "difference": difference,
            "relative": relative,
        }
        return report.combined(parts)

    return {
        **_header(logged, "ope_lift", interval, alpha, resamples, seed, settings, unit),
        "baseline": "behaviour" if baseline is None else "incumbent",
        "directions": dict(zip(logged.signals, signal_registry.directions(logged.signals), strict=True)),
        "estimators": {name: {**_estimator_header(name), **lift(name)} for name in estimators},
        "reward_model_fit": reward_model_fit(logged, new.reward),
        "risk": {
            "candidate": return_distribution(logged, new.log_ratio),
            "baseline": return_distribution(logged, None if old is None else old.log_ratio),
        },
        "diagnostics": {
            "candidate": diagnose(logged, new.log_ratio, settings.thresholds),
            "baseline": None if old is None else diagnose(logged, old.log_ratio, settings.thresholds),
        },
    }


def reward_model_fit(logged: LoggedSteps, model: QPredictions | None) -> dict[str, Any] | None:
    """How well the cross-fitted reward model predicts each signal on rows it was not fitted to.

    R^2 = 1 - SSE / SST and the RMSE of q(s, a) against the logged reward, out of fold. DR's correction
    makes its estimate unbiased whatever the model, but its variance shrinks with the model's error, and
    DM is only as good as this fit. ``None`` when no estimator fitted a reward model. The model is fitted
    to logged actions, so it is the same for every target and this is shown once per report.
    """
    if model is None:
        return None
    residual = logged.rewards - model.q_logged
    sse = np.square(residual).sum(axis=0)
    sst = np.square(logged.rewards - logged.rewards.mean(axis=0)).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - sse / sst
    rmse = np.sqrt(sse / logged.rows)
    return {
        "out_of_fold": True,
        "signals": {
            signal: {
                "r2": _number(r2[i]),
                "rmse": _number(rmse[i]),
                "mean_reward": _number(logged.rewards[:, i].mean()),
            }
            for i, signal in enumerate(logged.signals)
        },
    }


def _estimator_header(name: str) -> dict[str, Any]:
    return {
        "kind": kind_of(name),
        "scale": _SCALES[kind_of(name)],
        "model_error_included": name not in MODEL_ONLY,
    }


def _check(estimators: Sequence[str], interval: str, alpha: float, unit: str) -> None:
    unknown = sorted(set(estimators) - set(ESTIMATORS))
    if unknown or not estimators:
        raise ValueError(f"unknown or no estimators {unknown}; choose from {list(ESTIMATORS)}")
    if interval not in INTERVAL_METHODS:
        raise ValueError(f"interval should be one of {INTERVAL_METHODS}, but is {interval!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha should be in (0, 1), but is {alpha}")
    if unit not in BOOTSTRAP_UNITS:
        raise ValueError(f"the bootstrap unit should be one of {BOOTSTRAP_UNITS}, but is {unit!r}")


def _header(
    logged: LoggedSteps,
    kind: str,
    interval: str,
    alpha: float,
    resamples: int,
    seed: int,
    settings: OPESettings,
    unit: str,
) -> dict[str, Any]:
    session_groups = logged.session_groups
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "signals": list(logged.signals),
        "rows": logged.rows,
        "sessions": logged.sessions,
        "group_sizes": {
            group_label(int(code)): {
                "rows": int(np.sum(logged.groups == code)),
                "sessions": int(np.sum(session_groups == code)),
            }
            for code in np.unique(session_groups)
        },
        "excluded": {reason: dict(counts) for reason, counts in logged.excluded.items()},
        "interval": {
            "method": interval,
            "alpha": alpha,
            "resamples": resamples,
            "seed": seed,
            "unit": unit,
            "users": int(np.unique(logged.user).size),
            "jackknife_blocks": settings.jackknife_blocks,
        },
        "settings": settings.to_dict(),
    }


class _Layout:
    """Named blocks of per-session terms side by side in one matrix, resampled together."""

    def __init__(self, blocks: dict[str, RatioTerms]) -> None:
        self.blocks = blocks
        self.offsets: dict[str, int] = {}
        start = 0
        for key, terms in blocks.items():
            self.offsets[key] = start
            start += terms.width

    def resample(
        self, logged: LoggedSteps, *, resamples: int, seed: int, blocks: int, unit: str
    ) -> GroupedResamples:
        matrix = np.concatenate([terms.flat() for terms in self.blocks.values()], axis=1)
        clusters = logged.session_users if unit == "user" else None
        return resample_sums(
            matrix, logged.session_groups, resamples=resamples, seed=seed, clusters=clusters, blocks=blocks
        )

    def statistic(self, key: str) -> Statistic:
        terms, start = self.blocks[key], self.offsets[key]
        stop = start + terms.width

        def value(sums: np.ndarray) -> np.ndarray:
            return ratio_value(sums[..., start:stop], terms.parts, terms.signals)

        return value


class _Reporter:
    """Turns statistics into ``block``s of ``entry``s over the overall and per-group resamples."""

    def __init__(
        self, draws: GroupedResamples, method: str, alpha: float, signals: tuple[str, ...], groups: bool
    ) -> None:
        self.scopes = [("overall", draws.overall())]
        if groups:
            self.scopes += [(group_label(int(code)), draws.group(int(code))) for code in draws.groups]
        self.method, self.alpha, self.signals = method, alpha, signals

    def __call__(self, statistic: Statistic) -> dict[str, Any]:
        return self.combined({"": statistic})

    def combined(self, statistics: dict[str, Statistic]) -> dict[str, Any]:
        """One block whose leaves are ``{name: entry}`` (or the entry itself for a single unnamed one)."""
        out: dict[str, Any] = {"overall": {}, "groups": {}}
        for scope, sums in self.scopes:
            per_signal: dict[str, Any] = {s: {} for s in self.signals}
            for name, statistic in statistics.items():
                result = bootstrap_interval(statistic, sums, self.method, self.alpha)
                for i, signal in enumerate(self.signals):
                    entry = {
                        "value": _number(result.value[i]),
                        "interval": [_number(result.low[i]), _number(result.high[i])],
                        "method": result.method,
                        "dropped_resamples": int(result.dropped[i]),
                    }
                    if name:
                        per_signal[signal][name] = entry
                    else:
                        per_signal[signal] = entry
            if scope == "overall":
                out["overall"] = per_signal
            else:
                out["groups"][scope] = per_signal
        return out


def _concentration(logged: LoggedSteps, log_ratio: np.ndarray, cap: float, alpha: float) -> dict[str, Any]:
    """Hoeffding and empirical-Bernstein intervals of clipped IPS, the one estimator with bounded terms."""
    capped = np.minimum(single.importance_weights(log_ratio), cap)
    terms = capped[:, None] * logged.rewards
    low = cap * np.minimum(logged.rewards.min(axis=0), 0.0)
    high = cap * np.maximum(logged.rewards.max(axis=0), 0.0)
    hoeffding = hoeffding_interval(terms, low, high, alpha)
    bernstein = empirical_bernstein_interval(terms, low, high, alpha)
    mean = terms.mean(axis=0)
    return {
        "estimator": "clipped_ips",
        "cap": cap,
        "range_source": "cap x the observed reward range (widened to include 0) of the logged rows",
        "assumes": "decisions are independent and the observed reward range bounds every reward",
        "signals": {
            signal: {
                "value": _number(mean[i]),
                "range": [_number(low[i]), _number(high[i])],
                "hoeffding": [_number(hoeffding[0][i]), _number(hoeffding[1][i])],
                "bernstein": [_number(bernstein[0][i]), _number(bernstein[1][i])],
            }
            for i, signal in enumerate(logged.signals)
        },
    }


def _number(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
