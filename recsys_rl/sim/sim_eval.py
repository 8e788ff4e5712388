"""``recsys-rl sim-eval``: a trained feed policy against the behaviour policy, in the simulator.

Its command-line side is ``recsys_rl.cli.sim_eval``; this module does the work.

Off-policy estimates are only as good as their assumptions; the simulator can run the policy itself. Both
feed policies run on the same world with the same episode seed (and the behaviour allocation policy), so
the comparison is paired: what differs between the two is the ranking, not the users drawn. The world is
fixed by ``users`` and ``seed`` together, so to evaluate on the world the policy learnt from, give those
of the simulated logs it was trained on.

The verdict per auxiliary signal is the TSCAC constraint: no worse than the behaviour policy, which is at
least its level for a signal to raise and at most for one to lower (``recsys_rl.signals`` directions).
It is read off a paired 95% interval of the per-user difference, not off point estimates: on sparse
signals two identical policies differ by several percent from noise alone, so a point estimate makes
"met" a coin flip. ``held``: the interval lies at or above zero; ``broken``: below zero; ``inconclusive``:
it covers zero. A constraint is satisfied unless broken.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recsys_rl import signals
from recsys_rl.sim.behaviour import (
    AllocationPolicy,
    FeedPolicy,
    behaviour_allocation_policy,
    behaviour_feed_policy,
)
from recsys_rl.sim.ground_truth import Estimate, PolicyValues, monte_carlo_values, run_days
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.training.agents.policy_io import POLICY_MANIFEST, PolicyLoadError, load_feed_policy
from recsys_rl.training.train import RUN_MANIFEST

AUXILIARY_SIGNALS = tuple(s for s in signals.FEED_SIGNALS if s != signals.FEED_MAIN_SIGNAL)


@dataclass(frozen=True)
class SimEvalConfig:
    """A simulator evaluation of one exported feed policy against the behaviour policy."""

    policy: str = ""  # a training run directory (its exported policy is used) or a policy directory
    users: int = 2_000  # users in the world; with seed it fixes the world, more users give more episodes
    days: int = 2  # days to run; return_rate needs at least 2
    seed: int = 0  # world seed: that of the simulated logs the policy was trained on
    episode_seed: int = 1  # users' draws on that world; the logs used 0, so 1 keeps them independent
    sample: bool = False  # serve the policy's mean (False) or sample its Gaussian

    def __post_init__(self) -> None:
        if not self.policy:
            raise ValueError("policy is required")
        for name in ("users", "days"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be at least 1, but is {getattr(self, name)}")
        for name in ("seed", "episode_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} should be non-negative, but is {getattr(self, name)}")


def policy_directory(path: str | Path) -> Path:
    """The exported policy of a finished training run, or ``path`` itself when it is a policy directory."""
    path = Path(path)
    if (path / POLICY_MANIFEST).is_file():
        return path
    if (path / RUN_MANIFEST).is_file():
        run_manifest = json.loads((path / RUN_MANIFEST).read_text())
        return path / run_manifest["policy"]["path"]
    if (path / "config.yaml").is_file():
        raise PolicyLoadError(
            f"{path} is a training run that has not finished: it has no exported policy yet"
        )
    raise PolicyLoadError(f"{path} is neither a policy directory (with {POLICY_MANIFEST}) nor a training run")


def evaluate_policy(
    config: SimEvalConfig,
    progress: Callable[[str, dict[str, Any]], None] = lambda event, fields: None,
) -> dict[str, Any]:
    """Run the behaviour policy and the exported policy on the same world; a JSON-able comparison."""
    policy = load_feed_policy(policy_directory(config.policy), sample=config.sample, numpy=True)
    behaviour = behaviour_feed_policy()

    def values(feed_policy: FeedPolicy) -> PolicyValues:
        progress("evaluating", {"policy": feed_policy.version, "users": config.users, "days": config.days})
        started = time.perf_counter()
        result = monte_carlo_values(
            SimConfig(n_users=config.users),
            feed_policy,
            behaviour_allocation_policy(),
            seed=config.seed,
            episode_seed=config.episode_seed,
            days=config.days,
        )
        elapsed = round(time.perf_counter() - started, 2)
        progress(
            "evaluated", {"policy": feed_policy.version, "episodes": result.episodes, "seconds": elapsed}
        )
        return result

    report = compare_values(values(behaviour), values(policy))
    report["config"] = asdict(config)
    report["policy"] = {
        "directory": str(policy.directory.resolve()),
        "version": policy.version,
        "algo": policy.manifest.get("algo"),
        "train_step": policy.manifest.get("train_step"),
    }
    report["behaviour"] = {
        "feed_policy": behaviour.version,
        "allocation_policy": behaviour_allocation_policy().version,
    }
    return report


def compare_values(behaviour: PolicyValues, policy: PolicyValues) -> dict[str, Any]:
    """Per feed signal: both per-user values, the policy's lift and the paired difference with its 95%
    interval; per auxiliary signal: the constraint verdict read off that interval.

    Every figure is per user over the evaluated days, from expected responses (``PolicyValues.per_user``):
    the multi-day objective, in which a user kept away a day counts as nothing that day.
    """
    if behaviour.per_user.shape != policy.per_user.shape:
        raise ValueError(
            f"paired values should have the same users, but have {behaviour.per_user.shape[0]} and "
            f"{policy.per_user.shape[0]}"
        )
    feed_signals = {name: _paired(name, behaviour, policy) for name in signals.FEED_SIGNALS}
    constraints = {name: _constraint(name, feed_signals[name]) for name in AUXILIARY_SIGNALS}
    return {
        "kind": "sim_eval",
        "signals": feed_signals,
        "return_rate": {"behaviour": _finite(behaviour.return_rate), "policy": _finite(policy.return_rate)},
        "episodes": {"behaviour": behaviour.episodes, "policy": policy.episodes},
        "constraints": constraints,
        "constraints_satisfied": all(c["satisfied"] for c in constraints.values()),
    }


def broken_signals(report: dict[str, Any]) -> list[str]:
    """What a policy broke against its reference in ``report`` (``compare_values``): watch time when its
    interval lies below the reference's, then each auxiliary constraint whose interval lies on its wrong
    side. Empty: the policy holds every signal, what a term or weight added to a policy must do."""
    watch_high = report["signals"][signals.FEED_MAIN_SIGNAL]["interval"][1]
    watch_lower = watch_high is not None and watch_high < 0.0
    constraints = [name for name, verdict in report["constraints"].items() if not verdict["satisfied"]]
    return [signals.FEED_MAIN_SIGNAL] * watch_lower + constraints


#: Two-sided 95% normal quantile of the paired intervals.
_Z = 1.959963984540054


def _paired(name: str, behaviour: PolicyValues, policy: PolicyValues) -> dict[str, Any]:
    """One feed signal: each side's per-user mean and the per-user difference (policy - behaviour)."""
    column = signals.FEED_SIGNALS.index(name)
    return paired_per_user(name, behaviour.per_user[:, column], policy.per_user[:, column])


def paired_per_user(name: str, before: np.ndarray, after: np.ndarray) -> dict[str, Any]:
    """Signal ``name``'s per-user totals under the reference (``before``) and the policy (``after``), the
    same users in the same order: each side's mean, the policy's lift and the paired difference with its
    95% interval."""
    difference = _mean_and_stderr(after - before)
    low, high = difference.mean - _Z * difference.stderr, difference.mean + _Z * difference.stderr
    return {
        "direction": signals.get(name).direction.value,
        "behaviour": _estimate(_mean_and_stderr(before)),
        "policy": _estimate(_mean_and_stderr(after)),
        "lift": _relative(float(after.mean()), float(before.mean())) if after.size else None,
        "difference": _finite(difference.mean),
        "difference_stderr": _finite(difference.stderr),
        "interval": [_finite(low), _finite(high)],
    }


def _constraint(name: str, paired: dict[str, Any]) -> dict[str, Any]:
    """The policy against the behaviour on ``name``, from its paired figures: the margin in the good
    direction, its interval and the verdict (see the module docstring)."""
    direction = signals.get(name).direction
    low, high = (math.nan if v is None else direction.sign * v for v in paired["interval"])
    low, high = min(low, high), max(low, high)
    verdict = "held" if low >= 0.0 else "broken" if high < 0.0 else "inconclusive"  # NaN: inconclusive
    margin = paired["difference"]
    return {
        "bound": "at least" if direction is signals.Direction.HIGHER_IS_BETTER else "at most",
        "verdict": verdict,
        "satisfied": verdict != "broken",
        "margin": None if margin is None else direction.sign * margin,  # per user over the days, paired
        "margin_stderr": paired["difference_stderr"],
        "interval": [_finite(low), _finite(high)],
    }


def _mean_and_stderr(values: np.ndarray) -> Estimate:
    mean = float(values.mean()) if values.size else math.nan
    stderr = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else math.nan
    return Estimate(mean, stderr, int(values.size))


def _estimate(estimate: Estimate) -> dict[str, float | None]:
    return {"mean": _finite(estimate.mean), "stderr": _finite(estimate.stderr)}


def _relative(value: float, reference: float) -> float | None:
    return _finite((value - reference) / abs(reference)) if reference else None


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity: a figure that does not exist (one day has no return rate) is null."""
    return float(value) if math.isfinite(value) else None


# -- live allocation --------------------------------------------------------------------------------------

#: Per-user figures of an allocation run, summed over its days (seconds).
ALLOCATION_USER_METRICS = ("live_watch_s", "video_watch_s", "total_usage_s")


@dataclass(frozen=True)
class AllocationOutcome:
    """What an allocation policy did in the simulator: per-user totals and the run's rates."""

    per_user: dict[str, np.ndarray]  # ALLOCATION_USER_METRICS, (users,) each, over all days
    return_rate: float  # share of users active on the days after the first (nan for one day)
    allocation_rate: float  # share of live candidates inserted
    decisions: int  # allocation decisions taken

    @classmethod
    def pooled(cls, outcomes: Sequence[AllocationOutcome]) -> AllocationOutcome:
        """Several worlds' outcomes as one population: their users side by side (independent worlds, so
        a paired comparison pairs each world's users with themselves), rates weighted by what they count."""
        users = np.array([next(iter(o.per_user.values())).size for o in outcomes], float)
        decisions = np.array([o.decisions for o in outcomes], float)
        return cls(
            per_user={
                name: np.concatenate([o.per_user[name] for o in outcomes]) for name in outcomes[0].per_user
            },
            return_rate=float(np.average([o.return_rate for o in outcomes], weights=users)),
            allocation_rate=float(np.average([o.allocation_rate for o in outcomes], weights=decisions))
            if decisions.sum()
            else float("nan"),
            decisions=int(decisions.sum()),
        )

    def summary(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {name: float(v.mean()) for name, v in self.per_user.items()}
        out.update(
            return_rate=_finite(self.return_rate),
            allocation_rate=_finite(self.allocation_rate),
            decisions=self.decisions,
        )
        return out


def allocation_outcome(
    config: SimConfig,
    allocation_policy: AllocationPolicy,
    *,
    seed: int,
    episode_seed: int = 1,
    days: int = 2,
    feed_policy: FeedPolicy | None = None,
) -> AllocationOutcome:
    """Run ``allocation_policy`` (with the behaviour ranking unless ``feed_policy``) for ``days`` days.

    Live watch, short-video watch and their sum, the total usage the platform constraint protects, are
    per user over all days, so an allocation that shortens sessions or keeps users away the next day
    shows in them. Both watches are the viewed items' expected watch (``FeedLog.expected_reward``,
    ``LiveLog.expected_reward``), not the draws. Runs of different policies on the same (config, seed,
    episode_seed) are paired.
    """
    feed = feed_policy or behaviour_feed_policy()
    logs = run_days(config, feed, allocation_policy, seed=seed, episode_seed=episode_seed, days=days)
    users = config.n_users
    live = sum(np.bincount(d.live.user, weights=d.live.expected_reward[:, 0], minlength=users) for d in logs)
    video = sum(np.bincount(d.feed.user, weights=d.feed.expected_reward[:, 0], minlength=users) for d in logs)
    actions = np.concatenate([d.live.action for d in logs])
    later = logs[1:]
    return AllocationOutcome(
        per_user={"live_watch_s": live, "video_watch_s": video, "total_usage_s": live + video},
        return_rate=float(np.mean([d.returning_users for d in later]) / users) if later else float("nan"),
        allocation_rate=float(actions.mean()) if actions.size else float("nan"),
        decisions=int(actions.size),
    )


def compare_allocation(reference: AllocationOutcome, outcome: AllocationOutcome) -> dict[str, Any]:
    """Per-user metric: both means and the paired difference (outcome - reference) with its stderr."""
    out: dict[str, Any] = {}
    for name in ALLOCATION_USER_METRICS:
        difference = _mean_and_stderr(outcome.per_user[name] - reference.per_user[name])
        out[name] = {
            "reference": float(reference.per_user[name].mean()),
            "policy": float(outcome.per_user[name].mean()),
            "difference": difference.mean,
            "difference_stderr": _finite(difference.stderr),
            "lift": _relative(float(outcome.per_user[name].mean()), float(reference.per_user[name].mean())),
        }
    return out
