"""``recsys-rl evaluate``: argument parsing and output of the OPE gate (``recsys_rl.ope.evaluate``)."""

from __future__ import annotations

import argparse

from recsys_rl.cli.options import (
    add_config_option,
    non_negative_int,
    positive_int,
    require_dataset,
)
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger, quiet_native_imports

#: ``--fail-if-not-blessed`` and a refused candidate (any of several): distinct from 1 (the evaluation
#: itself failed) and 2 (bad usage or config), so a CI job can tell "the gate said no" from "the gate did
#: not run".
EXIT_NOT_BLESSED = 3
#: --simulator-* flags and the ``simulator:`` config keys they set.
_SIMULATOR_FLAGS = {"simulator_users": "users", "simulator_seed": "seed", "simulator_days": "days"}


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "evaluate",
        help="offline-evaluate candidate policies against the incumbent and bless them or not",
        description="Estimate, on a logged transition dataset, how a candidate policy would do on "
        "every signal compared with the incumbent policy (or the behaviour policy that logged the data), "
        "with bootstrap intervals per signal and user group and importance-weight diagnostics, and apply "
        "the rollout gate. Writes OUT/report.json, OUT/report.html and OUT/blessing.json (pass or fail "
        "with every reason). With --candidate given several times, each candidate gets that evaluation "
        "(the same bootstrap seed for all) in OUT/candidates/<version>/, and OUT/ranking.json and "
        "OUT/ranking.html rank them by the lower bound of the gating estimator's main-signal lift. The "
        "gate's rules come from --config under 'gate:' (surface: feed, live_allocation or user_author, "
        "estimator (not dm or fqe), interval, alpha, resamples, bootstrap_unit (user or session), "
        "min_main_lift, tolerances per signal, "
        "default_tolerance, min_ess, max_weight_share); settings looser than the defaults are listed as a "
        "loose gate. Where the logs were simulated, --simulator-users and --simulator-seed (and "
        "--simulator-days, or 'simulator:' in the config) name the world that wrote them, and the "
        "simulator's ground truth is shown beside every estimate: a dataset does not record where its "
        "records came from. Exit code 0 whether or not the candidates passed, unless "
        f"--fail-if-not-blessed: then {EXIT_NOT_BLESSED} when any did not.",
    )
    add_config_option(p)
    p.add_argument(
        "--candidate",
        metavar="POLICY",
        action="append",
        help="training run or exported policy directory; repeat it to rank several candidates",
    )
    p.add_argument(
        "--incumbent", metavar="POLICY", help="training run or policy directory, or 'behavior' (default)"
    )
    p.add_argument("--data", metavar="DATASET", help="transition dataset version directory")
    p.add_argument("--out", metavar="DIR", help="new directory for the report and the blessing")
    p.add_argument(
        "--seed", type=non_negative_int, help="bootstrap, reward-model and action-draw seed (default 0)"
    )
    p.add_argument(
        "--simulator-users",
        type=positive_int,
        metavar="N",
        help="the logs were simulated: users of that run (with --simulator-seed, fixes its world)",
    )
    p.add_argument(
        "--simulator-seed", type=non_negative_int, metavar="SEED", help="the logs' simulated world seed"
    )
    p.add_argument(
        "--simulator-days", type=positive_int, metavar="DAYS", help="days the simulated logs span (default 1)"
    )
    p.add_argument(
        "--fail-if-not-blessed",
        action="store_true",
        help=f"exit {EXIT_NOT_BLESSED} when the candidate (any candidate, of several) is not blessed, for "
        "CI; the outputs are written either way",
    )
    p.set_defaults(handler=run)


def _overrides(args: argparse.Namespace) -> dict:
    overrides = {k: getattr(args, k) for k in ("incumbent", "data", "out", "seed")}
    candidates = args.candidate or []
    # flags win over the config's candidate or candidates, whichever of the two it gave
    if len(candidates) == 1:
        overrides.update(candidate=candidates[0], candidates=())
    elif candidates:
        overrides.update(candidate="", candidates=tuple(candidates))
    simulator = {key: getattr(args, flag) for flag, key in _SIMULATOR_FLAGS.items()}
    if any(v is not None for v in simulator.values()):
        # the flags replace the config's simulator section: a world is named whole, never half from each
        overrides["simulator"] = {k: v for k, v in simulator.items() if v is not None}
    return overrides


def run(args: argparse.Namespace) -> int:
    with quiet_native_imports():
        # TensorFlow only for this verb
        from recsys_rl.ope.evaluate import EvaluateConfig, run_evaluation, run_ranking
        from recsys_rl.ope.report import verdict_line

    config = load_config(EvaluateConfig, args.config, _overrides(args))
    require_dataset(config.data)
    if len(config.candidate_paths) > 1:
        ranking = run_ranking(config, progress_logger("evaluate"))
        # both in rank order
        for entry, evaluation in zip(ranking.ranking["candidates"], ranking.evaluations, strict=True):
            low = entry["lower_bound"]
            bound = "n/a" if low is None else f"{low:+.2%}"
            print(
                f"{entry['rank']}. {verdict_line(evaluation.report['verdict'])}: {entry['version']} "
                f"({ranking.ranking['main_signal']} lift lower bound {bound}) vs {config.incumbent}"
            )
        print(f"wrote {ranking.out}/ranking.json, ranking.html and candidates/<version>/ for each candidate")
        if args.fail_if_not_blessed and not ranking.passed:
            return EXIT_NOT_BLESSED
        return 0

    result = run_evaluation(config, progress_logger("evaluate"))
    verdict = result.verdict
    loose = " by a LOOSE gate" if verdict.loose_settings else ""
    print(f"{verdict.headline}{loose}: {config.candidate} vs {config.incumbent}")
    if verdict.loose_settings:
        count = len(verdict.loose_settings)
        print(f"  loose gate: {count} setting{'s' if count > 1 else ''} looser than the recommended defaults")
        for setting in verdict.loose_settings:
            print(f"    {setting}")
    for check in verdict.checks:
        print(f"  {check}")
    for reason in verdict.reasons:
        if reason.startswith("hint: "):
            print(f"  {reason}")
    for warning in verdict.warnings:
        print(f"  warning: {warning}")
    for policy, key in (("candidate", "candidate"), ("incumbent", "baseline")):
        diagnostics = result.report["lift"]["diagnostics"][key] or {"warnings": []}
        for warning in diagnostics["warnings"]:
            if f"{policy}: {warning}" not in verdict.warnings:  # a level the gate's estimator does not use
                print(f"  note (not gated): {policy}: {warning}")
    truth = result.report["ground_truth"]
    if truth is not None and not truth["world_check"]["passed"]:
        print("  warning: the declared simulated world does not reproduce the logs (see the report)")
    print(f"wrote {result.out}/report.json, report.html and blessing.json")
    if args.fail_if_not_blessed and not verdict.passed:
        return EXIT_NOT_BLESSED
    return 0
