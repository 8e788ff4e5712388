"""``recsys-rl evaluate``: the OPE gate on one candidate policy, written as a report and a blessing record.

Its command-line side is ``recsys_rl.cli.evaluate``; this module does the work.

The gate's ``surface`` picks the decisions: ``feed`` (rankings, Gaussian fusion-weight densities) or
``live_allocation`` (insert decisions, Bernoulli probabilities); the estimators and the gate are the same.

The output directory holds

    OUT/report.json    inputs (policies with sha256, dataset), the gate's config, its verdict
                       (``Verdict.to_dict``: passed, headline, reasons, checks, the policies' diagnostic
                       warnings and the gate's loose_settings), and the full paired lift evaluation of
                       ``recsys_rl.ope.offline_evaluation.evaluate_lift``, whose diagnostics warn at the
                       gate's own ESS and weight-share lines
    OUT/report.html    the same, self-contained, with plots (``recsys_rl.ope.report``)
    OUT/blessing.json  pass or fail with every reason, the estimator, the interval method, the data
                       manifest and the candidate's sha256 (``recsys_rl.ope.blessing``); the registry reads it

It is written into a staging directory and renamed into place, so a reader sees all three or none.
An existing OUT is never overwritten: evaluations are records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recsys_rl.atomic_json import write_json_atomic
from recsys_rl.dataset_contract import MANIFEST
from recsys_rl.errors import OperationalError
from recsys_rl.ope import report as ope_report
from recsys_rl.ope.blessing import Blessing, PolicyRef, utc_now, write_blessing
from recsys_rl.ope.estimators import log_importance_ratio
from recsys_rl.ope.gate import GateConfig, Lift, Support, Verdict, decide
from recsys_rl.ope.logged import LoggedSteps, target_log_prob
from recsys_rl.ope.offline_evaluation import OPESettings, evaluate_lift
from recsys_rl.registry.policy_files import policy_digest
from recsys_rl.sim.sim_eval import policy_directory
from recsys_rl.training.agents.data import open_dataset
from recsys_rl.training.agents.policy_io import load_allocation_policy, load_feed_policy

BEHAVIOUR = ("behavior", "behaviour")
REPORT_JSON, REPORT_HTML, BLESSING_JSON = "report.json", "report.html", "blessing.json"


class EvaluationExistsError(OperationalError):
    """The output directory already holds an evaluation."""


@dataclass(frozen=True)
class EvaluateConfig:
    candidate: str = ""  # training run or exported policy directory
    incumbent: str = "behavior"  # training run or policy directory, or "behavior" (the logging policy)
    data: str = ""  # transition dataset version directory
    out: str = ""  # new directory for report.json, report.html and blessing.json
    seed: int = 0  # bootstrap and reward-model seed
    gate: GateConfig = field(default_factory=GateConfig)

    def __post_init__(self) -> None:
        for name in ("candidate", "incumbent", "data", "out"):
            if not getattr(self, name):
                raise ValueError(f"{name} is required")


@dataclass(frozen=True)
class EvaluationResult:
    out: Path
    verdict: Verdict
    report: dict[str, Any]


def run_evaluation(
    config: EvaluateConfig, progress: Callable[[str, dict[str, Any]], None] = lambda event, fields: None
) -> EvaluationResult:
    out = Path(config.out)
    if out.exists():
        raise EvaluationExistsError(f"{out} already exists; evaluations are records: choose a new --out")
    surface = config.gate.surface
    dataset = open_dataset(config.data, surface)
    logged = LoggedSteps.from_dataset(dataset)
    progress("loaded", {"decisions": logged.rows, "dataset": dataset.manifest["version"], "surface": surface})
    candidate_dir = policy_directory(config.candidate)
    candidate = scored_policy(candidate_dir, surface)
    incumbent_dir = None if config.incumbent in BEHAVIOUR else policy_directory(config.incumbent)
    incumbent = None if incumbent_dir is None else scored_policy(incumbent_dir, surface)

    gate = config.gate
    lift = evaluate_lift(
        logged,
        candidate,
        incumbent,
        interval=gate.interval,
        resamples=gate.resamples,
        alpha=gate.alpha,
        seed=config.seed,
        # the diagnostics warn at the gate's own ESS and weight-share lines: one set of numbers
        settings=OPESettings(thresholds=gate.diagnostic_thresholds()),
    )
    progress("evaluated", {"estimators": len(lift["estimators"]), "resamples": gate.resamples})
    verdict = gate_verdict(gate, lift)

    candidate_ref = PolicyRef(candidate.version, policy_digest(candidate_dir))
    incumbent_ref = None if incumbent is None else PolicyRef(incumbent.version, policy_digest(incumbent_dir))
    data_manifest = {
        "path": str(dataset.directory.resolve()),
        "version": dataset.manifest["version"],
        "sha256": hashlib.sha256((dataset.directory / MANIFEST).read_bytes()).hexdigest(),
    }
    created_at = utc_now()
    report = {
        "schema_version": 1,
        "kind": "ope_report",
        "created_at": created_at,
        "inputs": {
            "candidate": {**candidate_ref.to_dict(), "path": str(candidate_dir.resolve())},
            "baseline": "behaviour" if incumbent_ref is None else incumbent_ref.version,
            "incumbent": None if incumbent_ref is None else incumbent_ref.to_dict(),
            "dataset": data_manifest,
        },
        "gate": dataclasses.asdict(gate),
        "verdict": verdict.to_dict(),
        "lift": lift,
    }
    blessing = Blessing(
        passed=verdict.passed,
        reasons=verdict.reasons,
        candidate=candidate_ref,
        incumbent=incumbent_ref,
        estimator=gate.estimator,
        interval_method=gate.interval,
        data_manifest=data_manifest,
        created_at=created_at,
    )
    log_ratio = log_importance_ratio(
        target_log_prob(candidate, logged.states, logged.actions), logged.behaviour_log_prob
    )
    _publish(out, report, ope_report.render(report, log_ratio), blessing)
    progress("written", {"out": str(out), "passed": verdict.passed})
    return EvaluationResult(out, verdict, report)


def scored_policy(directory: Path, surface: str):
    """An exported policy of ``surface`` as OPE scores it: sampling the distribution it weighs by."""
    if surface == "feed":
        return load_feed_policy(directory, sample=True)
    return load_allocation_policy(directory, sample=True).for_ope()


def gate_verdict(gate: GateConfig, lift: dict[str, Any]) -> Verdict:
    """Apply the gate's rules to an ``evaluate_lift`` result (its chosen estimator, overall).

    The support rules read the diagnostics at the estimator's own level (``GateConfig.support_level``:
    per-decision weights for single-decision estimators, per-session products for sequential ones), for
    the candidate and, against an incumbent, for the incumbent too: a lift is only as good as the worse
    supported of its two values.
    """
    overall = lift["estimators"][gate.estimator]["overall"]

    def relative(signal: str) -> Lift:
        entry = overall[signal]["relative"]
        low, high = entry["interval"]
        # an undefined figure (a zero baseline, say) can never satisfy a bound
        return Lift(*(np.nan if v is None else v for v in (entry["value"], low, high)))

    level = gate.support_level
    support = []
    for policy, key in (("candidate", "candidate"), ("incumbent", "baseline")):
        diagnostics = lift["diagnostics"][key]
        if diagnostics is None:  # the behaviour policy as baseline: its weights are all one
            continue
        summary = diagnostics[level]
        support.append(
            Support(
                policy, level, summary["ess"], summary["max_weight_share"], gate_warnings(gate, diagnostics)
            )
        )
    return decide(gate, {s: relative(s) for s in lift["signals"]}, support)


def gate_warnings(gate: GateConfig, diagnostics: dict[str, Any]) -> tuple[str, ...]:
    """The warnings of ``diagnostics`` about the evidence the gate's estimator rests on.

    A sequential estimator weights by session products built from the decisions' weights, so every
    warning bears on it; a single-decision estimator never uses the session products, and their warnings
    (which nearly every log raises: products of weights are heavy-tailed) would only bury the ones that
    matter under a headline that always reads "with warnings".
    """
    by_level = diagnostics["warnings_by_level"]
    levels = ("decision", "groups") if gate.support_level == "decision" else ("decision", "session", "groups")
    return tuple(w for level in levels for w in by_level[level])


def _publish(out: Path, report: dict[str, Any], page: str, blessing: Blessing) -> None:
    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write_json_atomic(staging / REPORT_JSON, report)
    (staging / REPORT_HTML).write_text(page)
    write_blessing(staging / BLESSING_JSON, blessing)
    os.rename(staging, out)
