"""The rollout gate: rules that bless or refuse a candidate policy from its offline evaluation (DESIGN 8).

The gate sees, per signal, the candidate's lift over the incumbent as a relative change with a
confidence interval of that difference, plus the importance-weight diagnostics. It blesses only when

* the lower bound of the main signal's lift is at least ``min_main_lift``;
* for every constraint signal, the bound on the bad side (the lower bound of a higher-is-better
  signal's lift, the upper bound of a lower-is-better one's) stays within its tolerance;
* the effective sample size is at least ``min_ess`` and no single logged decision carries more than
  ``max_weight_share`` of the total weight: an estimate that rests on a handful of rows is no evidence.

Every rule that fails adds a reason; all of them are reported, not just the first, so a data scientist
sees at once everything that stands between the candidate and a rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from recsys_rl import signals


@dataclass(frozen=True)
class GateConfig:
    surface: str = "feed"
    estimator: str = "snips"  # which estimator's intervals the rules read
    interval: str = "bca"  # bootstrap interval method: bca or percentile
    alpha: float = 0.05  # two-sided: 95% intervals
    resamples: int = 200
    min_main_lift: float = 0.0  # lower bound of the main signal's relative lift must reach this
    # allowed relative loss per constraint signal (hate: allowed relative increase); signals not named get
    # ``default_tolerance``
    tolerances: dict[str, float] = field(default_factory=dict)
    default_tolerance: float = 0.02
    min_ess: float = 1000.0
    max_weight_share: float = 0.01

    def __post_init__(self) -> None:
        if self.surface not in ("feed", "live_allocation"):
            raise ValueError(f"surface should be feed or live_allocation, but is {self.surface!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha should be in (0, 1), but is {self.alpha}")
        if self.interval not in ("bca", "percentile"):
            raise ValueError(f"interval should be bca or percentile, but is {self.interval!r}")
        if self.resamples < 10:
            raise ValueError(f"resamples should be at least 10, but is {self.resamples}")
        unknown = sorted(set(self.tolerances) - set(self.constraint_signals))
        if unknown:
            raise ValueError(f"tolerances name {unknown}, which are not constraint signals of {self.surface}")
        for name, value in {**self.tolerances, "default_tolerance": self.default_tolerance}.items():
            if value < 0:
                raise ValueError(f"tolerance of {name} should be >= 0, but is {value}")
        if self.min_ess < 0 or not 0.0 < self.max_weight_share <= 1.0:
            raise ValueError("min_ess should be >= 0 and max_weight_share in (0, 1]")

    @property
    def main_signal(self) -> str:
        return signals.FEED_MAIN_SIGNAL if self.surface == "feed" else signals.LIVE_MAIN_SIGNAL

    @property
    def constraint_signals(self) -> tuple[str, ...]:
        names = signals.FEED_SIGNALS if self.surface == "feed" else signals.LIVE_SIGNALS
        return tuple(n for n in names if n != self.main_signal)

    def tolerance(self, name: str) -> float:
        return self.tolerances.get(name, self.default_tolerance)


@dataclass(frozen=True)
class Lift:
    """The candidate's relative lift on one signal, with the interval of that lift."""

    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]  # why it failed; empty when it passed
    checks: tuple[str, ...]  # every rule evaluated, passed or not, for the record


def decide(config: GateConfig, lifts: Mapping[str, Lift], ess: float, max_weight_share: float) -> Verdict:
    reasons: list[str] = []
    checks: list[str] = []
    level = f"{100 * (1 - config.alpha):.0f}%"

    def check(ok: bool, text: str) -> None:
        checks.append(("pass: " if ok else "FAIL: ") + text)
        if not ok:
            reasons.append(text)

    main = lifts[config.main_signal]
    check(
        main.low >= config.min_main_lift,
        f"{config.main_signal}: {level} lower bound of the lift {main.low:+.2%} "
        f"{'>=' if main.low >= config.min_main_lift else '<'} required {config.min_main_lift:+.2%}",
    )
    for name in config.constraint_signals:
        lift = lifts[name]
        sign = signals.get(name).direction.sign
        worst = lift.low if sign > 0 else lift.high
        loss = -sign * worst  # how far the bad-side bound goes in the bad direction
        tolerance = config.tolerance(name)
        bound = "lower" if sign > 0 else "upper"
        check(
            loss <= tolerance,
            f"{name}: {level} {bound} bound of the lift {worst:+.2%} is "
            f"{'within' if loss <= tolerance else 'beyond'} the tolerance of {tolerance:.2%} "
            f"{'loss' if sign > 0 else 'increase'}",
        )
    check(ess >= config.min_ess, f"effective sample size {ess:,.0f} vs required {config.min_ess:,.0f}")
    check(
        max_weight_share <= config.max_weight_share,
        f"largest weight share {max_weight_share:.4f} vs allowed {config.max_weight_share:.4f}",
    )
    return Verdict(not reasons, tuple(reasons), tuple(checks))
