"""``recsys-rl evaluate``: argument parsing and output of the OPE gate (``recsys_rl.ope.evaluate``)."""

from __future__ import annotations

import argparse

from recsys_rl.cli.options import add_config_option, non_negative_int
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger, quiet_native_imports

#: ``--fail-if-not-blessed`` and a refused candidate: distinct from 1 (the evaluation itself failed) and
#: 2 (bad usage or config), so a CI job can tell "the gate said no" from "the gate did not run".
EXIT_NOT_BLESSED = 3


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "evaluate",
        help="offline-evaluate a candidate policy against the incumbent and bless it or not",
        description="Estimate, on a logged transition dataset, how a candidate policy would do on "
        "every signal compared with the incumbent policy (or the behaviour policy that logged the data), "
        "with bootstrap intervals per signal and user group and importance-weight diagnostics, and apply "
        "the rollout gate. Writes OUT/report.json, OUT/report.html and OUT/blessing.json (pass or fail "
        "with every reason). The gate's rules come from --config under 'gate:' (surface: feed or "
        "live_allocation, estimator (not dm or fqe), interval, alpha, resamples, min_main_lift, tolerances "
        "per signal, default_tolerance, min_ess, max_weight_share); settings looser than the defaults are "
        "listed as a loose gate. Exit code 0 whether or not the candidate passed, unless "
        f"--fail-if-not-blessed: then {EXIT_NOT_BLESSED} when it did not.",
    )
    add_config_option(p)
    p.add_argument("--candidate", metavar="POLICY", help="training run or exported policy directory")
    p.add_argument(
        "--incumbent", metavar="POLICY", help="training run or policy directory, or 'behavior' (default)"
    )
    p.add_argument("--data", metavar="DATASET", help="transition dataset version directory")
    p.add_argument("--out", metavar="DIR", help="new directory for the report and the blessing")
    p.add_argument("--seed", type=non_negative_int, help="bootstrap and reward-model seed (default 0)")
    p.add_argument(
        "--fail-if-not-blessed",
        action="store_true",
        help=f"exit {EXIT_NOT_BLESSED} when the candidate is not blessed (for CI); the outputs are written "
        "either way",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with quiet_native_imports():
        from recsys_rl.ope.evaluate import EvaluateConfig, run_evaluation  # TensorFlow only for this verb

    overrides = {k: getattr(args, k) for k in ("candidate", "incumbent", "data", "out", "seed")}
    config = load_config(EvaluateConfig, args.config, overrides)
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
    print(f"wrote {result.out}/report.json, report.html and blessing.json")
    if args.fail_if_not_blessed and not verdict.passed:
        return EXIT_NOT_BLESSED
    return 0
