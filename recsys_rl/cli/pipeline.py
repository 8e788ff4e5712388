"""``recsys-rl pipeline``: ``run`` the scheduled training pipeline
(``recsys_rl.pipelines.training_pipeline``), and ``list`` and ``status`` to look at its run records
(``recsys_rl.pipelines.pipeline_runs``)."""

from __future__ import annotations

import argparse
import json

from recsys_rl.cli.options import OneLineParser, add_config_option, table_lines
from recsys_rl.config import ConfigError, read_config_file
from recsys_rl.logs import progress_logger, quiet_native_imports
from recsys_rl.pipelines.pipeline_runs import STEPS, PipelineRun, get_run, list_runs  # no Beam: quick


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

    where = argparse.ArgumentParser(add_help=False)
    add_config_option(where)
    where.add_argument("--work-dir", metavar="DIR", help="the runs' work dir (else the config's work_dir)")
    where.add_argument("--json", action="store_true", help="print JSON instead of text")
    listing = actions.add_parser(
        "list",
        parents=[where],
        help="the runs, newest first: state, steps, time, algorithm, dataset, verdict, promotion",
        description="One line per run recorded under WORK/runs, newest first: its id, start time, state "
        "(finished, failed, or unfinished: still running or killed without a word), the steps it got "
        "through, the seconds spent in them, the algorithm and dataset version it trained on, the gate's "
        "verdict and the version it promoted. --json prints a list of objects.",
    )
    listing.set_defaults(handler=list_command)
    status = actions.add_parser(
        "status",
        parents=[where],
        help="one run step by step (default: the newest)",
        description="Each step of one run with its status, seconds and main outputs (dataset version, "
        "training run, verdict, registered and promoted version), and why an unfinished run stopped. "
        "--json prints the run as one object, with every step's outputs in full.",
    )
    status.add_argument(
        "run_id", nargs="?", metavar="RUN_ID", help="a run id, as listed (default: the newest)"
    )
    status.set_defaults(handler=status_command)


def run_pipeline_command(args: argparse.Namespace) -> int:
    with quiet_native_imports():
        from recsys_rl.pipelines.training_pipeline import load_pipeline_config, run_pipeline

    config = load_pipeline_config(args.config, {"work_dir": args.work_dir, "registry": args.registry})
    result = run_pipeline(config, progress_logger("pipeline"))
    print(result.text())
    return 0


#: The outputs ``pipeline status`` shows per step; the rest (offset plans, accounting, metrics) is in --json.
_MAIN_OUTPUTS = {
    "ingest": ("version", "records"),
    "commit": ("group", "partitions"),
    "features": ("online_store",),
    "train": ("algo", "policy_version", "run"),
    "evaluate": ("verdict", "incumbent", "report"),
    "register": ("version", "blessed"),
    "promote": ("version", "role"),
}


def list_command(args: argparse.Namespace) -> int:
    work_dir = _work_dir(args)
    runs = list_runs(work_dir)
    if args.json:
        print(json.dumps([run.to_dict() for run in runs], indent=2))
    elif not runs:
        print(f"no pipeline runs in {work_dir}")
    else:
        header = ("RUN", "STARTED", "STATE", "STEPS", "SECONDS", "ALGO", "DATASET", "VERDICT", "PROMOTED")
        for line in table_lines([header, *(_run_row(run) for run in runs)]):
            print(line)
    return 0


def status_command(args: argparse.Namespace) -> int:
    work_dir = _work_dir(args)
    run = get_run(work_dir, args.run_id)
    if args.json:
        print(json.dumps(None if run is None else run.to_dict(with_steps=True), indent=2))
    elif run is None:
        print(f"no pipeline runs in {work_dir}")
    else:
        print("\n".join(_status_lines(run)))
    return 0


def _work_dir(args: argparse.Namespace) -> str:
    """--work-dir, else the work_dir of the --config that ``pipeline run`` takes. Only that key is read:
    looking at runs needs no Kafka, training or gate settings to be valid."""
    work_dir = args.work_dir or (read_config_file(args.config).get("work_dir") if args.config else None)
    if not work_dir:
        raise ConfigError("work_dir is required: --work-dir DIR, or 'work_dir:' in --config")
    if not isinstance(work_dir, str):
        raise ConfigError(f"work_dir should be a directory name, but is {work_dir!r}")
    return work_dir


def _run_row(run: PipelineRun) -> tuple[str, ...]:
    promoted = "-" if run.promoted is None else f"{run.promoted[0]} ({run.promoted[1]})"
    return (
        run.run_id,
        run.started_at,
        run.state,
        f"{len(run.steps)}/{len(STEPS)}",
        f"{run.seconds:.1f}",
        run.algo or "-",
        run.dataset_version or "-",
        _verdict_word(run),
        promoted,
    )


def _verdict_word(run: PipelineRun) -> str:
    if run.idle:
        return "nothing new"
    blessed = run.output("evaluate", "blessed")
    return "-" if blessed is None else "blessed" if blessed else "refused"


def _status_lines(run: PipelineRun) -> list[str]:
    trained = (("algo", run.algo), ("dataset", run.dataset_version))
    what = ", ".join([run.surface, *(f"{name} {value}" for name, value in trained if value is not None)])
    lines = [
        f"pipeline run {run.run_id}: {run.state} ({what})",
        f"  started {run.started_at}, finished {run.finished_at or '-'}, {run.seconds:.1f} s in its steps",
    ]
    for step in run.steps:
        shown = [
            f"{key}={step.outputs[key]}" for key in _MAIN_OUTPUTS.get(step.name, ()) if key in step.outputs
        ]
        if "reason" in step.outputs:
            shown.append(f"reason: {step.outputs['reason']}")
        lines.append(
            f"  {step.name:<9} {step.status:<10} {step.seconds:>8.1f} s  {', '.join(shown)}".rstrip()
        )
    if run.stopped_in is not None:
        lines.append(f"  {run.state} in {run.stopped_in}" + (f": {run.error}" if run.error else ""))
    lines.append(f"run record: {run.record}")
    return lines
