"""``recsys-rl evaluate``: the OPE gate on candidate policies, written as reports and blessing records.

Its command-line side is ``recsys_rl.cli.evaluate``; this module does the work.

The gate's ``surface`` picks the decisions: ``feed`` (rankings, Gaussian fusion-weight densities),
``live_allocation`` (insert decisions, Bernoulli probabilities) or ``user_author`` (the weight of a Rank's
user-author term: the feed's rankings, weighted by the density of the term's weight logit, on the
sessions whose every ranking had the candidate's term function, ``policy_io.term_id``, judged also on
the pairs' return its views brought, ``gate.USER_AUTHOR_PAIR_SIGNALS``); the estimators and the gate are
the same.

With one candidate (``run_evaluation``) the output directory holds

    OUT/report.json    inputs (policies with sha256, dataset), the gate's config, its verdict
                       (``Verdict.to_dict``: passed, headline, reasons, checks, the policies' diagnostic
                       warnings and the gate's loose_settings), the full paired lift evaluation of
                       ``recsys_rl.ope.offline_evaluation.evaluate_lift`` (whose diagnostics warn at the
                       gate's own ESS and weight-share lines), ``actions`` (``action_distributions``: the
                       logged actions against actions drawn from the candidate at the logged states) and
                       ``ground_truth`` (``recsys_rl.ope.simulated_truth``; null unless a simulated world
                       was declared)
    OUT/report.html    the same, self-contained, with plots (``recsys_rl.ope.report``), rendered from
                       report.json alone
    OUT/blessing.json  pass or fail with every reason, the estimator, the interval method, the data
                       manifest and the candidate's sha256 (``recsys_rl.ope.blessing``); the registry reads it
    OUT/tensorboard/   the candidate as a run of TensorBoard's HParams tab, with its lifts as metrics
                       (``recsys_rl.ope.tensorboard``)

With several (``run_ranking``), each candidate gets that same evaluation, with the same bootstrap seed so
their intervals are comparable, in OUT/candidates/<candidate version>/ (each attachable to the registry on
its own), and OUT/ranking.json and OUT/ranking.html rank them by the lower bound of the gating estimator's
main-signal lift, each with its verdict.

Everything is written into a staging directory and renamed into place, so a reader sees all of OUT or
none. An existing OUT is never overwritten: evaluations are records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recsys_rl import signals as signal_registry
from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.config import ConfigError
from recsys_rl.dataset_contract import MANIFEST, PAIR_REWARDS_SINCE, USER_AUTHOR
from recsys_rl.errors import OperationalError
from recsys_rl.fusion import FEED_ACTION_NAMES
from recsys_rl.ope import report as ope_report
from recsys_rl.ope import simulated_truth
from recsys_rl.ope.blessing import Blessing, PolicyRef, utc_now, write_blessing
from recsys_rl.ope.diagnostics import weight_summary
from recsys_rl.ope.estimators import log_importance_ratio
from recsys_rl.ope.gate import USER_AUTHOR_PAIR_SIGNALS, GateConfig, Lift, Support, Verdict, decide
from recsys_rl.ope.logged import LOG_PROB_CHUNK_ROWS, LoggedSteps, ScoredPolicy, target_log_prob
from recsys_rl.ope.offline_evaluation import OPESettings, evaluate_lift
from recsys_rl.ope.simulated_truth import SimulatorWorld
from recsys_rl.ope.tensorboard import write_evaluation as write_tensorboard
from recsys_rl.registry.policy_files import POLICY_MANIFEST, policy_digest
from recsys_rl.sim.behaviour import behaviour_allocation_policy, behaviour_feed_policy
from recsys_rl.sim.sim_eval import policy_directory
from recsys_rl.training.agents.data import DatasetMismatchError, TransitionDataset, open_dataset
from recsys_rl.training.agents.policy_io import (
    POLICY_KINDS,
    PolicyLoadError,
    load_allocation_policy,
    load_feed_policy,
    ranking_term,
)

BEHAVIOUR = ("behavior", "behaviour")
REPORT_JSON, REPORT_HTML, BLESSING_JSON = "report.json", "report.html", "blessing.json"
RANKING_JSON, RANKING_HTML, CANDIDATES_DIR = "ranking.json", "ranking.html", "candidates"
#: A surface's action dimensions, and what they are in the report's words.
ACTION_NAMES = {
    "feed": FEED_ACTION_NAMES,
    "live_allocation": ("insert",),
    "user_author": ("user_author_weight_logit",),
}
ACTION_MEANINGS = {
    "feed": "fusion-weight logit per signal",
    "live_allocation": "insert decision (1: a live stream inserted)",
    "user_author": "logit of the user-author term's weight",
}
#: Quantiles of each action dimension in the report, and the histogram's bin count.
ACTION_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
ACTION_BINS = 30

Progress = Callable[[str, dict[str, Any]], None]


class EvaluationExistsError(OperationalError):
    """The output directory already holds an evaluation."""


@dataclass(frozen=True)
class EvaluateConfig:
    candidate: str = ""  # training run or exported policy directory
    # several of them, ranked in one output (OUT/candidates/<version>/ each); instead of ``candidate``
    candidates: tuple[str, ...] = ()
    incumbent: str = "behavior"  # training run or policy directory, or "behavior" (the logging policy)
    data: str = ""  # transition dataset version directory
    out: str = ""  # new directory for report.json, report.html and blessing.json
    seed: int = 0  # bootstrap, reward-model and action-draw seed, the same for every candidate
    gate: GateConfig = field(default_factory=GateConfig)
    # the simulated world that wrote the logs, for ground truth beside the estimates; None: not simulated
    # (or not known), no ground truth
    simulator: SimulatorWorld | None = None

    def __post_init__(self) -> None:
        if self.candidate and self.candidates:
            raise ValueError("give candidate or candidates, not both")
        if not self.candidate and not self.candidates:
            raise ValueError("candidate is required")
        if len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"a candidate is given more than once in {list(self.candidates)}")
        for name in ("incumbent", "data", "out"):
            if not getattr(self, name):
                raise ValueError(f"{name} is required")

    @property
    def candidate_paths(self) -> tuple[str, ...]:
        return (self.candidate,) if self.candidate else self.candidates


@dataclass(frozen=True)
class EvaluationResult:
    out: Path
    verdict: Verdict
    report: dict[str, Any]


@dataclass(frozen=True)
class RankingResult:
    """Several candidates' evaluations, best first by the gating estimator's main-signal lower bound."""

    out: Path
    ranking: dict[str, Any]
    evaluations: tuple[EvaluationResult, ...]  # in rank order; ``out`` of each is its candidates/ directory

    @property
    def passed(self) -> bool:
        return all(e.verdict.passed for e in self.evaluations)


@dataclass(frozen=True)
class _Evaluation:
    """One candidate's outputs before they are published."""

    directory_name: str
    report: dict[str, Any]
    page: str
    blessing: Blessing
    verdict: Verdict


@dataclass
class _Inputs:
    """What every candidate of one run is evaluated on: read once."""

    config: EvaluateConfig
    dataset: TransitionDataset
    logged: LoggedSteps
    data_manifest: dict[str, Any]
    incumbent_dir: Path | None
    incumbent: ScoredPolicy | None
    incumbent_ref: PolicyRef | None
    # simulator runs of the baseline and of the behaviour policy (the world check), once per run
    truth_cache: dict[str, Any] = field(default_factory=dict)


def run_evaluation(
    config: EvaluateConfig, progress: Progress = lambda event, fields: None
) -> EvaluationResult:
    """One candidate: OUT/report.json, report.html and blessing.json (the module docstring)."""
    if len(config.candidate_paths) != 1:
        raise ValueError(
            f"run_evaluation takes one candidate, not {len(config.candidate_paths)}: use run_ranking"
        )
    out = _fresh(config.out)
    inputs = _read_inputs(config, progress)
    evaluation = _evaluate(inputs, config.candidate_paths[0], progress)
    _publish(out, {"": evaluation})
    progress("written", {"out": str(out), "passed": evaluation.verdict.passed})
    return EvaluationResult(out, evaluation.verdict, evaluation.report)


def run_ranking(config: EvaluateConfig, progress: Progress = lambda event, fields: None) -> RankingResult:
    """Several candidates: one evaluation each under OUT/candidates/, and OUT/ranking.json and .html."""
    paths = config.candidate_paths
    if len(paths) < 2:
        raise ValueError(f"run_ranking ranks two or more candidates, not {len(paths)}: use run_evaluation")
    resolved = [policy_directory(p).resolve() for p in paths]
    repeated = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if repeated:
        # a run and its policy directory, say: one policy twice would only repeat a line of the ranking
        raise ConfigError(f"candidate {repeated[0]} is given more than once")
    out = _fresh(config.out)
    inputs = _read_inputs(config, progress)
    evaluations: list[_Evaluation] = []
    for path in paths:
        evaluations.append(_evaluate(inputs, path, progress))
    names = _directory_names([e.report["inputs"]["candidate"] for e in evaluations])
    evaluations = [dataclasses.replace(e, directory_name=n) for e, n in zip(evaluations, names, strict=True)]
    ranking = rank(evaluations, config, inputs)
    order = {entry["directory"]: i for i, entry in enumerate(ranking["candidates"])}
    evaluations.sort(key=lambda e: order[f"{CANDIDATES_DIR}/{e.directory_name}"])
    _publish(
        out,
        {f"{CANDIDATES_DIR}/{e.directory_name}": e for e in evaluations},
        ranking=(ranking, ope_report.render_ranking(ranking)),
    )
    progress("written", {"out": str(out), "candidates": len(evaluations)})
    results = tuple(
        EvaluationResult(out / CANDIDATES_DIR / e.directory_name, e.verdict, e.report) for e in evaluations
    )
    return RankingResult(out, ranking, results)


def _fresh(path: str) -> Path:
    out = Path(path)
    if out.exists():
        raise EvaluationExistsError(f"{out} already exists; evaluations are records: choose a new --out")
    return out


def _read_inputs(config: EvaluateConfig, progress: Progress) -> _Inputs:
    surface = config.gate.surface
    dataset = open_dataset(config.data, config.gate.data_surface)
    if surface == "user_author":
        _check_pair_rewards(dataset)
        logged = LoggedSteps.from_dataset(dataset, _evaluated_term(config), USER_AUTHOR_PAIR_SIGNALS)
    else:
        logged = LoggedSteps.from_dataset(dataset)
    progress("loaded", {"decisions": logged.rows, "dataset": dataset.manifest["version"], "surface": surface})
    incumbent_dir = None if config.incumbent in BEHAVIOUR else policy_directory(config.incumbent)
    incumbent = None if incumbent_dir is None else scored_policy(incumbent_dir, surface)
    incumbent_ref = None if incumbent is None else PolicyRef(incumbent.version, policy_digest(incumbent_dir))
    data_manifest = {
        "path": str(dataset.directory.resolve()),
        "version": dataset.manifest["version"],
        "sha256": hashlib.sha256((dataset.directory / MANIFEST).read_bytes()).hexdigest(),
    }
    return _Inputs(config, dataset, logged, data_manifest, incumbent_dir, incumbent, incumbent_ref)


def _evaluate(inputs: _Inputs, candidate_path: str, progress: Progress) -> _Evaluation:
    config, logged = inputs.config, inputs.logged
    gate, surface = config.gate, config.gate.surface
    candidate_dir = policy_directory(candidate_path)
    candidate = scored_policy(candidate_dir, surface)
    lift = evaluate_lift(
        logged,
        candidate,
        inputs.incumbent,
        interval=gate.interval,
        resamples=gate.resamples,
        alpha=gate.alpha,
        seed=config.seed,
        unit=gate.bootstrap_unit,
        # the diagnostics warn at the gate's own ESS and weight-share lines: one set of numbers
        settings=OPESettings(thresholds=gate.diagnostic_thresholds()),
    )
    progress("evaluated", {"candidate": candidate.version, "estimators": len(lift["estimators"])})
    verdict = gate_verdict(gate, lift)
    candidate_ref = PolicyRef(candidate.version, policy_digest(candidate_dir))
    incumbent_ref = inputs.incumbent_ref
    policies: dict[str, ScoredPolicy] = {"candidate": candidate}
    if inputs.incumbent is not None:
        policies["incumbent"] = inputs.incumbent
    created_at = utc_now()
    report = {
        "schema_version": 1,
        "kind": "ope_report",
        "created_at": created_at,
        "inputs": {
            "candidate": {**candidate_ref.to_dict(), "path": str(candidate_dir.resolve())},
            "baseline": "behaviour" if incumbent_ref is None else incumbent_ref.version,
            "incumbent": None if incumbent_ref is None else incumbent_ref.to_dict(),
            "dataset": inputs.data_manifest,
        },
        "gate": dataclasses.asdict(gate),
        "verdict": verdict.to_dict(),
        "lift": lift,
        "importance_weights": weight_histogram(
            log_importance_ratio(
                target_log_prob(candidate, logged.states, logged.actions), logged.behaviour_log_prob
            )
        ),
        "actions": action_distributions(logged, policies, surface, config.seed),
        "ground_truth": None if config.simulator is None else _ground_truth(inputs, candidate_dir, progress),
    }
    blessing = Blessing(
        passed=verdict.passed,
        reasons=verdict.reasons,
        candidate=candidate_ref,
        incumbent=incumbent_ref,
        estimator=gate.estimator,
        interval_method=gate.interval,
        data_manifest=inputs.data_manifest,
        created_at=created_at,
    )
    return _Evaluation("", report, ope_report.render(report), blessing, verdict)


def _check_pair_rewards(dataset: TransitionDataset) -> None:
    """Refuse a dataset whose request rows cannot say what a user-author term did to the pairs' return:
    their pair rewards are zeros unless the user-author surface was built beside them."""
    version = dataset.manifest["schema_version"]
    if version < PAIR_REWARDS_SINCE:
        raise DatasetMismatchError(
            f"{dataset.directory} has schema_version {version}, whose request rows have no pair rewards "
            f"(they came in version {PAIR_REWARDS_SINCE}), so a user_author version cannot be judged on "
            "the pairs' return: rebuild it with build-transitions --user-author-surface"
        )
    if USER_AUTHOR not in dataset.manifest["surfaces"]:
        raise DatasetMismatchError(
            f"{dataset.directory} was built without the user-author surface, so its request rows' pair "
            "rewards are zeros and a user_author version cannot be judged on the pairs' return: rebuild "
            "it with build-transitions --user-author-surface"
        )


def _evaluated_term(config: EvaluateConfig) -> str:
    """The term function the user_author candidates (and incumbent) all rank with, whose logged rankings
    their weights re-weight; ConfigError unless there is exactly one."""
    if config.simulator is not None:
        raise ConfigError(
            "a user_author evaluation has no simulated ground truth yet (the simulator does not serve a "
            "registry term): leave out the simulator settings"
        )
    paths = [*config.candidate_paths, *(() if config.incumbent in BEHAVIOUR else (config.incumbent,))]
    terms = {}
    for path in paths:
        directory = policy_directory(path)
        manifest = read_json_file(directory / POLICY_MANIFEST, PolicyLoadError, "not an exported policy")
        terms[path] = ranking_term(manifest, directory).term_id
    if len(set(terms.values())) != 1:
        raise ConfigError(
            f"the policies rank with different user-author terms ({terms}): logs re-weight only the term "
            "function that served them, so evaluate each term on its own"
        )
    return next(iter(terms.values()))


def support_on_data(policy_dir: Path, data: str | Path, surface: str) -> dict[str, Any]:
    """How well a dataset covers a policy: ESS and largest weight share of its importance weights on
    the logged decisions, as the gate's support rules read them (``diagnostics.weight_summary``).

    ``recsys-rl train`` asks this of each new policy on its own training data: a policy the data it
    was trained on barely covers cannot pass the default gate on that data either, and saying so at
    the end of training, with the settings that move it, beats finding out at evaluation."""
    logged = LoggedSteps.from_dataset(open_dataset(data, surface, check_sha256=False))
    policy = scored_policy(policy_dir, surface)
    log_weights = log_importance_ratio(
        target_log_prob(policy, logged.states, logged.actions), logged.behaviour_log_prob
    )
    return weight_summary(log_weights)


def scored_policy(directory: Path, surface: str):
    """An exported policy of ``surface`` as OPE scores it: sampling the distribution it weighs by.

    A policy of the other surface is a usage error naming the setting to change: the gate's surface
    defaults to feed, so evaluating a live-allocation run without it is the common slip."""
    manifest = read_json_file(directory / POLICY_MANIFEST, PolicyLoadError, "not an exported policy")
    kind = manifest.get("kind")
    if (other := next((s for s, k in POLICY_KINDS.items() if k == kind), surface)) != surface:
        raise ConfigError(
            f"{directory} holds a {other} policy, but gate.surface is {surface}: "
            f"set gate: {{surface: {other}}} in --config (examples/gate-live.yaml is one for live_allocation)"
        )
    if surface == "feed":
        return load_feed_policy(directory, sample=True)
    if surface == "user_author":  # the term's weight logit: its Gaussian needs no SavedModel
        return ranking_term(manifest, directory).weight(manifest["version"])
    return load_allocation_policy(directory, sample=True).for_ope()


def simulator_policies(directory: Path | None, surface: str) -> tuple[Any, Any]:
    """(feed policy, allocation policy) to run in the simulator: the exported policy (sampling, as OPE
    values it) on its surface, the behaviour policy on the other; ``None``: the behaviour policy on both."""
    feed, allocation = behaviour_feed_policy(), behaviour_allocation_policy()
    if directory is None:
        return feed, allocation
    if surface == "feed":
        # the numpy twin: a simulator page is a small batch, where TensorFlow's dispatch costs the most
        return load_feed_policy(directory, sample=True, numpy=True), allocation
    return feed, load_allocation_policy(directory, sample=True)


def _ground_truth(inputs: _Inputs, candidate_dir: Path, progress: Progress) -> dict[str, Any]:
    """The candidate's truth against the baseline's in the declared world, and the world check."""
    world, surface, cache = inputs.config.simulator, inputs.config.gate.surface, inputs.truth_cache

    def truth(directory: Path | None) -> simulated_truth.PolicyTruth:
        progress(
            "simulating",
            {"policy": "behaviour" if directory is None else str(directory), "users": world.users},
        )
        return simulated_truth.simulate_truth(world, surface, *simulator_policies(directory, surface))

    if "behaviour" not in cache:
        cache["behaviour"] = truth(None)
        cache["world_check"] = simulated_truth.world_check(inputs.logged, cache["behaviour"])
    if "baseline" not in cache:
        cache["baseline"] = (
            cache["behaviour"] if inputs.incumbent_dir is None else truth(inputs.incumbent_dir)
        )
    return simulated_truth.ground_truth(
        world, inputs.logged.signals, truth(candidate_dir), cache["baseline"], cache["world_check"]
    )


def weight_histogram(log_ratio: np.ndarray, bins: int = 60) -> dict[str, Any]:
    """The candidate's log10 importance weights as a histogram, so the page needs only report.json."""
    log10 = log_ratio / np.log(10.0)
    finite = log10[np.isfinite(log10)]
    counts, edges = np.histogram(finite, bins=bins) if finite.size else (np.zeros(0), np.zeros(0))
    return {
        "log10_edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
        "non_finite": int(log10.size - finite.size),
    }


def action_distributions(
    logged: LoggedSteps, policies: Mapping[str, ScoredPolicy], surface: str, seed: int
) -> dict[str, Any]:
    """Per action dimension: the logged actions against one action drawn from each policy at every logged
    state, as shared-bin histograms, quantiles, mean and standard deviation.

    The importance weights say how far a candidate moved from the logging policy in likelihood; this says
    where: which fusion weights it turned up (feed: K fusion-weight logits) or how much more often it inserts
    a live stream (live allocation: a 0/1 insert, whose mean is the insert rate). Draws are seeded (one
    child of ``seed`` per policy), so the same evaluation draws the same actions.
    """
    names = ACTION_NAMES[surface]
    binary = surface == "live_allocation"
    series = {"logged": np.asarray(logged.actions, np.float64).reshape(logged.rows, len(names))}
    generators = np.random.SeedSequence(seed).spawn(len(policies))
    for (name, policy), child in zip(policies.items(), generators, strict=True):
        rng = np.random.default_rng(child)
        chunks = [
            np.asarray(policy.act(logged.states[start : start + LOG_PROB_CHUNK_ROWS], rng)[0], np.float64)
            for start in range(0, logged.rows, LOG_PROB_CHUNK_ROWS)
        ]
        series[name] = np.concatenate(chunks).reshape(logged.rows, len(names))
    dimensions = {}
    for i, name in enumerate(names):
        columns = {key: values[:, i] for key, values in series.items()}
        if binary:
            edges = np.array([-0.5, 0.5, 1.5])
        else:
            pooled = np.concatenate(list(columns.values()))
            low, high = np.quantile(pooled, [0.005, 0.995])  # a stray draw should not flatten the rest
            edges = np.linspace(low, high if high > low else low + 1.0, ACTION_BINS + 1)
        dimensions[name] = {
            "edges": [float(e) for e in edges],
            "counts": {k: [int(c) for c in np.histogram(v, bins=edges)[0]] for k, v in columns.items()},
            "outside": {k: int(np.sum((v < edges[0]) | (v > edges[-1]))) for k, v in columns.items()},
            "mean": {k: float(v.mean()) for k, v in columns.items()},
            "std": {k: float(v.std()) for k, v in columns.items()},
            "quantiles": {
                k: [float(q) for q in np.quantile(v, ACTION_QUANTILES)] for k, v in columns.items()
            },
        }
    return {
        "surface": surface,
        "kind": "binary" if binary else "continuous",
        "what": ACTION_MEANINGS[surface],
        "seed": seed,
        "states": logged.rows,
        "names": list(names),  # the dimensions' order (the file sorts ``dimensions`` by name)
        "series": list(series),
        "quantile_levels": list(ACTION_QUANTILES),
        "dimensions": dimensions,
    }


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


def rank(evaluations: list[_Evaluation], config: EvaluateConfig, inputs: _Inputs) -> dict[str, Any]:
    """``ranking.json``: the candidates by the lower bound of the gating estimator's main-signal relative
    lift, the figure the gate's first rule reads, best first; a candidate without one (an undefined or
    refused interval) goes last. Ties keep the order the candidates were given in."""
    gate = config.gate
    main = gate.main_signal
    entries = []
    for given, evaluation in enumerate(evaluations):
        report = evaluation.report
        overall = report["lift"]["estimators"][gate.estimator]["overall"][main]
        truth = report["ground_truth"]
        scale = report["lift"]["estimators"][gate.estimator]["scale"]
        entries.append(
            {
                "given": given,
                "version": report["inputs"]["candidate"]["version"],
                "policy_sha256": report["inputs"]["candidate"]["policy_sha256"],
                "path": report["inputs"]["candidate"]["path"],
                "directory": f"{CANDIDATES_DIR}/{evaluation.directory_name}",
                "passed": evaluation.verdict.passed,
                "headline": evaluation.verdict.headline,
                "warnings": len(evaluation.verdict.warnings),
                "reasons": list(evaluation.verdict.reasons),
                "lower_bound": overall["relative"]["interval"][0],
                "main": {part: overall[part] for part in ("candidate", "baseline", "difference", "relative")},
                "truth": None if truth is None else truth["scales"][scale][main],
            }
        )
    entries.sort(key=lambda e: (e["lower_bound"] is None, -(e["lower_bound"] or 0.0), e["given"]))
    for position, entry in enumerate(entries, start=1):
        entry["rank"] = position
    first = evaluations[0].report
    return {
        "schema_version": 1,
        "kind": "ope_ranking",
        "created_at": utc_now(),
        "ranked_by": f"lower bound of the {gate.estimator} relative lift of {main} over the baseline",
        "estimator": gate.estimator,
        "main_signal": main,
        "unit": signal_registry.get(main).unit,
        "scale": first["lift"]["estimators"][gate.estimator]["scale"],
        "seed": config.seed,
        "baseline": first["inputs"]["baseline"],
        "dataset": inputs.data_manifest,
        "gate": dataclasses.asdict(gate),
        "loose_settings": first["verdict"]["loose_settings"],
        "world_check": None if first["ground_truth"] is None else first["ground_truth"]["world_check"],
        "candidates": entries,
    }


def _directory_names(candidates: list[dict[str, Any]]) -> list[str]:
    """A directory name per candidate: its version, made safe for a path, and with the start of its
    digest where two candidates share a version (two runs of one algorithm on one dataset do)."""
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "_", c["version"]).strip(".") or "policy" for c in candidates]
    return [
        name if safe.count(name) == 1 else f"{name}-{c['policy_sha256'][:12]}"
        for name, c in zip(safe, candidates, strict=True)
    ]


def _publish(
    out: Path, evaluations: dict[str, _Evaluation], ranking: tuple[dict[str, Any], str] | None = None
) -> None:
    """Every file into a staging directory beside ``out``, then one rename: all of it or nothing."""
    staging = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for relative, evaluation in evaluations.items():
        directory = staging / relative if relative else staging
        directory.mkdir(parents=True, exist_ok=True)
        write_json_atomic(directory / REPORT_JSON, evaluation.report)
        (directory / REPORT_HTML).write_text(evaluation.page)
        write_blessing(directory / BLESSING_JSON, evaluation.blessing)
        write_tensorboard(directory, evaluation.report)
    if ranking is not None:
        write_json_atomic(staging / RANKING_JSON, ranking[0])
        (staging / RANKING_HTML).write_text(ranking[1])
    os.rename(staging, out)
