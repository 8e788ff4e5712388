"""``recsys-rl evaluate``: argument parsing and output of the OPE gate (``recsys_rl.ope.evaluate``)."""

from __future__ import annotations

import argparse

from recsys_rl.cli.options import add_config_option, non_negative_int
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger, quiet_native_imports


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "evaluate",
        help="offline-evaluate a candidate policy against the incumbent and bless it or not",
        description="Estimate, on a logged transition dataset, how a candidate policy would do on "
        "every signal compared with the incumbent policy (or the behaviour policy that logged the data), "
        "with bootstrap intervals per signal and user group and importance-weight diagnostics, and apply "
        "the rollout gate. Writes OUT/report.json, OUT/report.html and OUT/blessing.json (pass or fail "
        "with every reason). The gate's rules come from --config under 'gate:' (surface: feed or "
        "live_allocation, estimator, interval, alpha, resamples, min_main_lift, tolerances per signal, "
        "default_tolerance, min_ess, max_weight_share). Exit code 0 whether or not the candidate passed; "
        "read the blessing.",
    )
    add_config_option(p)
    p.add_argument("--candidate", metavar="POLICY", help="training run or exported policy directory")
    p.add_argument(
        "--incumbent", metavar="POLICY", help="training run or policy directory, or 'behavior' (default)"
    )
    p.add_argument("--data", metavar="DATASET", help="transition dataset version directory")
    p.add_argument("--out", metavar="DIR", help="new directory for the report and the blessing")
    p.add_argument("--seed", type=non_negative_int, help="bootstrap and reward-model seed (default 0)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with quiet_native_imports():
        from recsys_rl.ope.evaluate import EvaluateConfig, run_evaluation  # TensorFlow only for this verb

    overrides = {k: getattr(args, k) for k in ("candidate", "incumbent", "data", "out", "seed")}
    config = load_config(EvaluateConfig, args.config, overrides)
    result = run_evaluation(config, progress_logger("evaluate"))
    verdict = result.verdict
    print(f"{'BLESSED' if verdict.passed else 'NOT BLESSED'}: {config.candidate} vs {config.incumbent}")
    for check in verdict.checks:
        print(f"  {check}")
    warnings = result.report["lift"]["diagnostics"]["candidate"]["warnings"]
    for warning in warnings:
        print(f"  warning: {warning}")
    print(f"wrote {result.out}/report.json, report.html and blessing.json")
    return 0
