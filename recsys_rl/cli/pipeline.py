"""``recsys-rl pipeline run``: the scheduled training pipeline (``recsys_rl.pipelines.training_pipeline``)."""

from __future__ import annotations

import argparse

from recsys_rl.cli.options import OneLineParser, add_config_option
from recsys_rl.logs import progress_logger, quiet_native_imports


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "pipeline",
        help="the training pipeline: ingest, features, train, evaluate, register, promote",
        description="The scheduled training pipeline, one command for a cron job or an Airflow task.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=OneLineParser)
    run = actions.add_parser(
        "run",
        help="run (or resume) the pipeline once",
        description="Ingest the new Kafka records into a transition dataset, materialise its feature "
        "aggregates into the online store, train, evaluate the candidate against the registry's stable "
        "version (or the logging policy) with the OPE gate, register it with its blessing and, when "
        "blessed, promote it to canary (to stable on a surface with none yet). Every step records its "
        "inputs and outputs under WORK/runs/<run id>/run.json and is skipped when its outputs for the "
        "same inputs exist, so running the command again after a crash resumes the unfinished run. One "
        "run at a time per registry. Flags Beam does not know are not accepted here: put Beam options "
        "under 'beam_args:' in the config.",
    )
    add_config_option(run)
    run.add_argument("--work-dir", metavar="DIR", help="run records and step outputs")
    run.add_argument("--registry", metavar="DIR", help="model registry to evaluate against and promote in")
    run.set_defaults(handler=run_pipeline_command)


def run_pipeline_command(args: argparse.Namespace) -> int:
    with quiet_native_imports():
        from recsys_rl.pipelines.training_pipeline import load_pipeline_config, run_pipeline

    config = load_pipeline_config(args.config, {"work_dir": args.work_dir, "registry": args.registry})
    result = run_pipeline(config, progress_logger("pipeline"))
    print(result.text())
    return 0
