"""The rollout gate: rules that bless or refuse a candidate policy from its offline evaluation (DESIGN 8).

The gate sees, per signal, the candidate's lift over the incumbent as a relative change with a
confidence interval of that difference, plus the importance-weight diagnostics. It blesses only when

* the lower bound of the main signal's lift is at least ``min_main_lift``;
* for every constraint signal, the bound on the bad side (the lower bound of a higher-is-better
  signal's lift, the upper bound of a lower-is-better one's) stays within its tolerance;
* for the candidate, and for the incumbent when there is one, the effective sample size is at least
  ``min_ess`` and no single unit carries more than ``max_weight_share`` of the total weight: an estimate
  that rests on a handful of rows is no evidence. The unit is the one the gating estimator weights by:
  a decision for the single-decision estimators, a session (its product of weights) for the sequential
  ones. These two lines are also the diagnostics' warning lines (``diagnostic_thresholds``): one set
  of numbers.

Every rule that fails adds a reason; all of them are reported, not just the first, so a data scientist
sees at once everything that stands between the candidate and a rollout. A support failure of the
candidate adds a hint naming the training settings that keep a policy near the logging policy.

GateConfig's defaults are the recommended gate. A config is *loose* when any rule setting lets through
what the defaults would refuse: a lower ``min_main_lift``, a wider tolerance for some constraint signal,
a smaller ``min_ess``, a larger ``max_weight_share``, a larger ``alpha`` (narrower intervals) or sessions
as the bootstrap unit (narrower intervals on multi-day logs).
``loose_settings`` lists each, and the verdict carries them so the report can say so: a blessing by a
loose gate is weaker evidence than its word suggests.

DM and FQE cannot gate: their bootstrap intervals resample sessions with the fitted model held fixed,
so they leave out the model's own error (measured coverage of nominal 95% intervals: 0.08-0.40 for DM,
0.815 for FQE).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recsys_rl import signals
from recsys_rl.ope.diagnostics import MAX_WEIGHT_SHARE, MIN_ESS, DiagnosticThresholds
from recsys_rl.ope.offline_evaluation import BOOTSTRAP_UNITS, ESTIMATORS, MODEL_ONLY, kind_of

GATE_ESTIMATORS = tuple(name for name in ESTIMATORS if name not in MODEL_ONLY)

#: What moves a candidate's weights back onto the logged data, per surface: the training config's
#: settings that pull the policy towards the logging policy (``recsys_rl.training.agents``).
SUPPORT_HINTS = {
    "feed": "hint: the logs barely cover the candidate: it strays too far from the logging policy. "
    "Retrain it closer: a larger agent.behaviour_lambda (tscac: weight of the behaviour term) or a smaller "
    "agent.max_weight (tscac: cap on a likelihood weight); for tscac-dpg, rcpo, rcpo-mc and ac-main a "
    "larger agent.bc_weight, with agent.initial_std (their fixed serving std) near the logging policy's. "
    "Or evaluate on more logged data.",
    "live_allocation": "hint: the logs barely cover the candidate: it strays too far from the logging "
    "policy. Retrain it closer: a larger allocation.actor_supervised_weight (the actor's cross-entropy "
    "with the logged allocation). Or evaluate on more logged data.",
    "user_author": "hint: the logs barely cover the candidate's term weight: its pair.term_weight is far "
    "from the served one, in units of the served pair.term_weight_std, or its term_weight_std is much "
    "smaller. Export it with a weight nearer the served one, or serve a wider term_weight_std first.",
}
#: The rows each gate surface weighs: a user_author version is judged on the feed's rankings (its term
#: moves which items a Rank shows).
DATA_SURFACES = {"feed": "feed", "live_allocation": "live_allocation", "user_author": "feed"}
#: The pair signals a user_author version is judged on besides the feed's, from the request rows' pair
#: rewards: the pairs' return is what the term is for, and nothing in the feed's vector counts it. (The
#: pairs' click and follow are the feed's own; their gifts come only from live insertions, which the
#: term does not rank.)
USER_AUTHOR_PAIR_SIGNALS: tuple[str, ...] = ("author_return",)
#: The signals each gate surface judges, main signal first.
GATE_SIGNALS: dict[str, tuple[str, ...]] = {
    "feed": signals.FEED_SIGNALS,
    "live_allocation": signals.LIVE_SIGNALS,
    "user_author": (*signals.FEED_SIGNALS, *USER_AUTHOR_PAIR_SIGNALS),
}
INCUMBENT_SUPPORT_HINT = (
    "hint: the logs barely cover the incumbent, so its value here is no yardstick: compare with the "
    "behaviour policy (--incumbent behavior), or evaluate on logs the incumbent served"
)


@dataclass(frozen=True)
class GateConfig:
    """The gate's rules; the defaults are the recommended gate, against which a config is loose."""

    surface: str = "feed"
    estimator: str = "snips"  # which estimator's intervals the rules read; not dm or fqe
    interval: str = "bca"  # bootstrap interval method: bca or percentile
    alpha: float = 0.05  # two-sided: 95% intervals
    resamples: int = 200
    # what the bootstrap resamples: ``user`` (a user's sessions together) or ``session`` (each on its own,
    # which understates the spread of multi-day logs, so it is a looser setting)
    bootstrap_unit: str = "user"
    min_main_lift: float = 0.0  # lower bound of the main signal's relative lift must reach this
    # allowed relative loss per constraint signal (hate: allowed relative increase); signals not named get
    # ``default_tolerance``
    tolerances: dict[str, float] = field(default_factory=dict)
    default_tolerance: float = 0.02
    min_ess: float = MIN_ESS  # effective decisions, or sessions for a sequential estimator
    max_weight_share: float = MAX_WEIGHT_SHARE  # of one decision, or one session for a sequential estimator

    def __post_init__(self) -> None:
        if self.surface not in DATA_SURFACES:
            raise ValueError(f"surface should be one of {list(DATA_SURFACES)}, but is {self.surface!r}")
        if self.estimator in MODEL_ONLY:
            raise ValueError(
                f"estimator {self.estimator!r} cannot gate: {MODEL_ONLY[self.estimator]}; "
                f"choose one of {list(GATE_ESTIMATORS)}"
            )
        if self.estimator not in GATE_ESTIMATORS:
            raise ValueError(f"estimator should be one of {list(GATE_ESTIMATORS)}, but is {self.estimator!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha should be in (0, 1), but is {self.alpha}")
        if self.interval not in ("bca", "percentile"):
            raise ValueError(f"interval should be bca or percentile, but is {self.interval!r}")
        if self.resamples < 10:
            raise ValueError(f"resamples should be at least 10, but is {self.resamples}")
        if self.bootstrap_unit not in BOOTSTRAP_UNITS:
            raise ValueError(
                f"bootstrap_unit should be one of {BOOTSTRAP_UNITS}, but is {self.bootstrap_unit!r}"
            )
        unknown = sorted(set(self.tolerances) - set(self.constraint_signals))
        if unknown:
            raise ValueError(f"tolerances name {unknown}, which are not constraint signals of {self.surface}")
        for name, value in {**self.tolerances, "default_tolerance": self.default_tolerance}.items():
            if value < 0:
                raise ValueError(f"tolerance of {name} should be >= 0, but is {value}")
        if self.min_ess < 0 or not 0.0 < self.max_weight_share <= 1.0:
            raise ValueError("min_ess should be >= 0 and max_weight_share in (0, 1]")

    @property
    def data_surface(self) -> str:
        """The dataset surface whose rows this gate weighs (``DATA_SURFACES``)."""
        return DATA_SURFACES[self.surface]

    @property
    def main_signal(self) -> str:
        return GATE_SIGNALS[self.surface][0]

    @property
    def constraint_signals(self) -> tuple[str, ...]:
        return GATE_SIGNALS[self.surface][1:]

    @property
    def support_level(self) -> str:
        """``decision`` or ``session``: the diagnostics' level whose weights the gating estimator uses."""
        return "decision" if kind_of(self.estimator) == "single_decision" else "session"

    def tolerance(self, name: str) -> float:
        return self.tolerances.get(name, self.default_tolerance)

    def diagnostic_thresholds(self, base: DiagnosticThresholds | None = None) -> DiagnosticThresholds:
        """``base`` (default thresholds) with the gate's ESS and weight-share lines: warn where it gates."""
        base = base or DiagnosticThresholds()
        return dataclasses.replace(base, min_ess=self.min_ess, max_weight_share=self.max_weight_share)

    def settings(self) -> tuple[GateSetting, ...]:
        """Every setting with the recommended value beside it and whether it is looser (module docstring)."""
        recommended = GateConfig(surface=self.surface)
        rows = [
            GateSetting("surface", self.surface),
            GateSetting("estimator", self.estimator),
            GateSetting("interval", self.interval),
            GateSetting("resamples", f"{self.resamples}"),
            GateSetting(
                "bootstrap_unit",
                self.bootstrap_unit,
                recommended.bootstrap_unit,
                self.bootstrap_unit != recommended.bootstrap_unit,
            ),
            GateSetting(
                "alpha", f"{self.alpha:g}", f"<= {recommended.alpha:g}", self.alpha > recommended.alpha
            ),
            GateSetting(
                "min_main_lift",
                f"{self.min_main_lift:g}",
                f">= {recommended.min_main_lift:g}",
                self.min_main_lift < recommended.min_main_lift,
            ),
        ]
        for name in self.constraint_signals:
            mine, usual = self.tolerance(name), recommended.tolerance(name)
            rows.append(GateSetting(f"tolerance of {name}", f"{mine:g}", f"<= {usual:g}", mine > usual))
        rows += [
            GateSetting(
                "min_ess",
                f"{self.min_ess:g}",
                f">= {recommended.min_ess:g}",
                self.min_ess < recommended.min_ess,
            ),
            GateSetting(
                "max_weight_share",
                f"{self.max_weight_share:g}",
                f"<= {recommended.max_weight_share:g}",
                self.max_weight_share > recommended.max_weight_share,
            ),
        ]
        return tuple(rows)

    def loose_settings(self) -> tuple[str, ...]:
        """Each setting looser than the recommended gate, as "name value (recommended ...)"; () if none."""
        return tuple(f"{s.name} {s.value} (recommended {s.recommended})" for s in self.settings() if s.looser)


@dataclass(frozen=True)
class GateSetting:
    """One row of the gate's configuration as the report shows it."""

    name: str
    value: str
    recommended: str = ""  # the recommended bound, for the rule settings
    looser: bool = False  # lets through what the recommended gate would refuse


@dataclass(frozen=True)
class Lift:
    """The candidate's relative lift on one signal, with the interval of that lift."""

    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class Support:
    """One policy's importance-weight diagnostics at the gating estimator's level."""

    policy: str  # candidate or incumbent
    level: str  # decision or session
    ess: float
    max_weight_share: float
    warnings: tuple[str, ...] = ()  # its diagnostics' warnings, all levels


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]  # why it failed; empty when it passed
    checks: tuple[str, ...]  # every rule evaluated, passed or not, for the record
    warnings: tuple[str, ...] = ()  # the policies' diagnostic warnings, each prefixed with its policy
    loose_settings: tuple[str, ...] = ()  # the gate's settings looser than the recommended ones

    @property
    def headline(self) -> str:
        """BLESSED, BLESSED with N warnings, or NOT BLESSED: a blessing never hides its warnings."""
        if not self.passed:
            return "NOT BLESSED"
        if not self.warnings:
            return "BLESSED"
        count = len(self.warnings)
        return f"BLESSED with {count} warning{'s' if count > 1 else ''}"

    def to_dict(self) -> dict[str, Any]:
        """The report's ``verdict``: the fields as JSON lists, and the headline."""
        return {
            "passed": self.passed,
            "headline": self.headline,
            "reasons": list(self.reasons),
            "checks": list(self.checks),
            "warnings": list(self.warnings),
            "loose_settings": list(self.loose_settings),
        }


def decide(config: GateConfig, lifts: Mapping[str, Lift], support: Sequence[Support]) -> Verdict:
    """Apply every rule; ``support`` holds the candidate's diagnostics and the incumbent's, if any."""
    reasons: list[str] = []
    checks: list[str] = []
    level = f"{100 * (1 - config.alpha):.0f}%"

    def check(ok: bool, text: str) -> bool:
        checks.append(("pass: " if ok else "FAIL: ") + text)
        if not ok:
            reasons.append(text)
        return ok

    no_interval = (
        "has no {level} interval: too few bootstrap resamples gave a finite value (the signal is too rare "
        "in these logs, or its baseline is 0), so the rule cannot be shown to hold"
    )
    main = lifts[config.main_signal]
    if np.isnan(main.low):
        check(False, f"{config.main_signal}: the lift {no_interval.format(level=level)}")
    else:
        check(
            main.low >= config.min_main_lift,
            f"{config.main_signal}: {level} lower bound of the lift {main.low:+.2%} "
            f"{'>=' if main.low >= config.min_main_lift else '<'} required {config.min_main_lift:+.2%}",
        )
    for name in config.constraint_signals:
        lift = lifts[name]
        sign = signals.get(name).direction.sign
        worst = lift.low if sign > 0 else lift.high
        if np.isnan(worst):
            check(False, f"{name}: the lift {no_interval.format(level=level)}")
            continue
        loss = -sign * worst  # how far the bad-side bound goes in the bad direction
        tolerance = config.tolerance(name)
        bound = "lower" if sign > 0 else "upper"
        check(
            loss <= tolerance,
            f"{name}: {level} {bound} bound of the lift {worst:+.2%} is "
            f"{'within' if loss <= tolerance else 'beyond'} the tolerance of {tolerance:.2%} "
            f"{'loss' if sign > 0 else 'increase'}",
        )
    hints = []
    for s in support:
        where = f"{s.policy}, {s.level} level"
        ess_ok = check(
            s.ess >= config.min_ess,
            f"{where}: effective sample size {s.ess:,.0f} vs required {config.min_ess:,.0f}",
        )
        share_ok = check(
            s.max_weight_share <= config.max_weight_share,
            f"{where}: largest weight share {s.max_weight_share:.4f} "
            f"vs allowed {config.max_weight_share:.4f}",
        )
        if not (ess_ok and share_ok):
            hints.append(SUPPORT_HINTS[config.surface] if s.policy == "candidate" else INCUMBENT_SUPPORT_HINT)
    reasons.extend(dict.fromkeys(hints))  # after the failures they explain, each once
    warnings = tuple(f"{s.policy}: {w}" for s in support for w in s.warnings)
    return Verdict(not reasons, tuple(reasons), tuple(checks), warnings, config.loose_settings())
