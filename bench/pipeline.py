"""Benchmark: Kafka -> transitions with the DirectRunner, in events per second (target: at least 20,000).

Baseline, timed in the same run on the same topics: a plain kafka-python loop that only consumes the
records (manual assignment, no decoding), kafka-python being the client the rest of the project uses.
The ratio events_per_s / raw_consume_events_per_s says how much the transition building costs on top.
The pipeline's own source reads with librdkafka (confluent-kafka), which parses records in C: on the
embedded broker it reads faster than this baseline, so the ratio is not a bound on the reading.

The default configuration is the embedded one: the DirectRunner's in-process engine, the FnApiRunner
(recsys_rl.pipelines.build_transitions.EMBEDDED_RUNNER), in memory with one worker, and
BuildTransitionsConfig's defaults.
Beam flags after the bench's own are passed on (e.g. --runner=DirectRunner, or --direct_num_workers=2
--direct_running_mode=multi_processing) and recorded in the result's config.
The machine's load average is recorded beside the rates: on a shared 2-core machine other work takes
cores from both the pipeline and the broker it reads, and the ratio to the raw rate holds better.

``--runner flink`` (the bench's own flag; any other --runner value is Beam's and passes on) runs the
same build on Apache Flink as well: a `LocalFlink` (Beam's 2.62.0 Flink job server with its Flink in
the JVM, and a Python worker pool; jars from `make flink-jars`) at parallelism 2, with as many SDK
workers, on the same topics. Each repeat times the in-process runner (the default configuration above,
with the Beam flags given) and then Flink, so both see the same load; events_per_s is then Flink's
median, ratio_to_in_process that over the in-process median of the same run, and there is no target.
A Flink run is the whole job: submission, a Flink mini cluster that the job server starts and stops
for each job (its master is [local]), two fresh SDK worker processes (each imports Beam and the
package), and the pipeline's fused stages as dozens of Flink tasks per subtask, the Python ones each a
bundle over the Fn API and every grouping an exchange in the JVM. At quick sizes these fixed costs
are most of the time, and the first job also warms the JVM; on two shared cores the JVM, the workers
and the broker compete for them. config.flink records each Flink build's seconds and the SDK workers
started. Each Flink build runs in a child process whose own
clock times build_transitions alone, as the in-process one is timed; the child is killed past
flink_timeout_s, and Flink is stopped whatever happens, so a hung job cannot hang the bench. The
result goes to bench/results/pipeline_flink.json unless --out says otherwise.

Every build writes a fresh dataset root (a new directory under a temporary one): the dataset version
is a digest of the offsets and settings, so a second build into the same root would find its dataset
already there and reuse it instead of building; a reused build is refused.

    python bench/pipeline.py --quick --out bench/results/pipeline.json
    python bench/pipeline.py --runner flink --quick --out bench/results/pipeline_flink.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, StandardOptions
from common import bench_parser, repeat_rate, write_result
from kafka import KafkaConsumer, TopicPartition

from recsys_rl.kafka import open_broker
from recsys_rl.kafka.broker import log_excerpt
from recsys_rl.kafka.connection import quiet_kafka_logging
from recsys_rl.kafka.reader import high_watermarks
from recsys_rl.pipelines.build_transitions import BuildTransitionsConfig, build_transitions, pipeline_options
from recsys_rl.pipelines.flink_service import BEAM_FLINK_VERSION, FLINK_VERSION, LocalFlink
from recsys_rl.sim.simulate import SimulateConfig, run_simulation

TARGET_EVENTS_PER_S = 20_000
# full is large enough (about 210k events) that the ~3 s fixed cost of a pipeline run (graph
# construction, runner start, finalising) no longer dominates; quick mostly measures that fixed cost.
# flink_timeout_s bounds one Flink build (a job whose workers never come up would otherwise wait for
# many minutes): 60 simulated users took 30-60 s on two busy cores, so these leave room many times over.
MODES = {
    "quick": {"users": 300, "repeats": 2, "flink_timeout_s": 600},
    "full": {"users": 6_000, "repeats": 3, "flink_timeout_s": 3_600},
}
FLINK = "flink"
FLINK_PARALLELISM = 2  # subtasks, and SDK worker processes: one per core of the 2-core machines
FLINK_DEFAULT_OUT = "bench/results/pipeline_flink.json"


def raw_consume(bootstrap_servers: str, topics: list[str]) -> int:
    """Read every record of the topics once with a bare consumer; the floor for any reader."""
    ends = {
        TopicPartition(topic, partition): end
        for topic in topics
        for partition, end in high_watermarks(bootstrap_servers, topic).items()
    }
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    consumer.assign(list(ends))
    consumer.seek_to_beginning()
    remaining = {tp for tp, end in ends.items() if end > 0}
    count = 0
    while remaining:
        for tp, batch in consumer.poll(timeout_ms=1000).items():
            count += len(batch)
            if batch[-1].offset + 1 >= ends[tp]:
                remaining.discard(tp)
    with quiet_kafka_logging():  # closing mid-refresh logs a harmless 'Cancelled' error
        consumer.close()
    return count


def split_bench_runner(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take ``--runner flink`` (or ``--runner=flink``) out of ``argv``; every other ``--runner`` is Beam's.

    The bench documents ``--runner=DirectRunner`` as a Beam flag it passes on, so an argparse option
    named --runner would swallow it; only the value ``flink`` belongs to the bench (Beam's own FlinkRunner,
    which downloads a job server, is not something this bench runs).
    """
    rest: list[str] = []
    runner = None
    i = 0
    while i < len(argv):
        if argv[i] == f"--runner={FLINK}":
            runner = FLINK
        elif argv[i] == "--runner" and i + 1 < len(argv) and argv[i + 1] == FLINK:
            runner, i = FLINK, i + 1
        else:
            rest.append(argv[i])
        i += 1
    return runner, rest


def build_config(
    bootstrap_servers: str, sim: SimulateConfig, root: str, user_author_surface: bool = False
) -> BuildTransitionsConfig:
    """The bench's build, into a new dataset root under ``root``: the version is a digest of the inputs,
    so the same root would already hold this dataset from the previous repeat and be reused, not built."""
    return BuildTransitionsConfig(
        user_author_surface=user_author_surface,
        bootstrap_servers=bootstrap_servers,
        group="bench",
        out=f"{root}/{uuid.uuid4().hex}",
        decisions_topic=sim.decisions_topic,
        feedback_topic=sim.feedback_topic,
        dead_letter_topic="",
        start="earliest",
        commit=False,
    )


def timed_build(config: BuildTransitionsConfig, beam_args: list[str]) -> tuple[int, float]:
    """Build once: the events read, and the seconds build_transitions took (each runner's same clock)."""
    start = time.perf_counter()
    result = build_transitions(config, beam_args)
    seconds = time.perf_counter() - start
    if result.reused:  # nothing was built: the rate would be that of finding a finished dataset
        raise RuntimeError(f"the build reused the dataset at {result.dataset_dir} instead of building it")
    return result.manifest["accounting"]["read"], seconds


def _flink_child(config: BuildTransitionsConfig, beam_args: list[str], results: Connection) -> None:
    """The child process's work: one timed build, whose (events, seconds) go back through ``results``."""
    results.send(timed_build(config, beam_args))
    results.close()


def flink_build(config: BuildTransitionsConfig, flink: LocalFlink, timeout_s: float) -> tuple[int, float]:
    """One timed build on ``flink`` in a child process, killed past ``timeout_s``.

    A PortableRunner job has no deadline of its own and waits minutes for workers that never start, and
    a thread cannot be stopped: a process can. The child is started fresh ("spawn", not a fork of this
    process with its Kafka client threads) and times only the build, not its own start and imports.
    """
    context = multiprocessing.get_context("spawn")
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(
        target=_flink_child,
        args=(config, flink.pipeline_args(parallelism=FLINK_PARALLELISM), sending),
        name="flink-build",
    )
    child.start()
    sending.close()  # only the child's copy stays open, so its death reads as an end of file
    try:
        child.join(timeout_s)
        if child.is_alive():
            child.kill()
            child.join()
            raise RuntimeError(
                f"a Flink build ran over {timeout_s:g} s and was killed; job server log: "
                f"{log_excerpt(flink.job_server_log)}"
            )
        if child.exitcode != 0 or not receiving.poll():
            raise RuntimeError(
                f"a Flink build failed (exit code {child.exitcode}; its traceback is above); job server "
                f"log: {log_excerpt(flink.job_server_log)}"
            )
        return receiving.recv()
    finally:
        receiving.close()


def rate_summary(rates: list[float]) -> dict[str, Any]:
    """The rates as `repeat_rate` reports them: median value, min, max and every run."""
    return {"value": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": rates}


def workers_started(flink: LocalFlink) -> int:
    """SDK worker processes the pool started so far: one line each in its log (Beam's worker_pool_main)."""
    log = Path(flink.job_server_log).with_name("worker-pool.log")
    return log.read_text(errors="replace").count("Starting worker with command") if log.exists() else 0


def compare_with_flink(
    bootstrap_servers: str, sim: SimulateConfig, beam_args: list[str], repeats: int, timeout_s: float
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Time the in-process runner and Flink on the same topics, alternately, ``repeats`` times each.

    Alternating spreads the machine's changing load over both. Returns the in-process and the Flink
    rates, and what the Flink runs were (its flags, workers started, seconds per run).
    """
    in_process: list[float] = []
    on_flink: list[float] = []
    flink_seconds: list[float] = []
    flink = LocalFlink()
    try:
        flink.start()
        with tempfile.TemporaryDirectory() as root:
            for _ in range(repeats):
                events, seconds = timed_build(build_config(bootstrap_servers, sim, root), beam_args)
                in_process.append(events / seconds)
                events, seconds = flink_build(build_config(bootstrap_servers, sim, root), flink, timeout_s)
                on_flink.append(events / seconds)
                flink_seconds.append(seconds)
        details = {
            "parallelism": FLINK_PARALLELISM,
            "job_server_beam": BEAM_FLINK_VERSION,
            "flink": FLINK_VERSION,
            "pipeline_args": flink.pipeline_args(parallelism=FLINK_PARALLELISM),
            "timeout_s": timeout_s,
            "run_seconds": flink_seconds,
            "sdk_workers_started": workers_started(flink),
        }
    finally:
        flink.stop()
    return rate_summary(in_process), rate_summary(on_flink), details


def main(argv: list[str] | None = None) -> int:
    runner, argv = split_bench_runner(sys.argv[1:] if argv is None else list(argv))
    parser = bench_parser(__doc__, "pipeline")
    parser.add_argument("--broker", choices=("embedded", "local-kafka"), default="embedded")
    parser.add_argument(
        "--user-author-surface",
        action="store_true",
        help="build the user-author surface too (the target is for the default build, without it)",
    )
    parser.epilog = "--runner flink: time Flink (LocalFlink, parallelism 2) beside the in-process runner"
    args, beam_args = parser.parse_known_args(argv)
    if runner == FLINK and args.out == parser.get_default("out"):
        args.out = FLINK_DEFAULT_OUT  # the in-process result stays where it is
    settings = MODES[args.mode]
    options = pipeline_options(beam_args)
    started = time.perf_counter()
    load_before = os.getloadavg()
    suffix = uuid.uuid4().hex[:8]
    sim = SimulateConfig(
        users=settings["users"],
        seed=args.seed,
        partitions=4,
        decisions_topic=f"bench-dec-{suffix}",
        feedback_topic=f"bench-fb-{suffix}",
    )
    topics = [sim.decisions_topic, sim.feedback_topic]
    with open_broker(None, args.broker) as broker:
        report = run_simulation(sim, broker.bootstrap_servers)
        events = sum(report.written.values())
        raw = repeat_rate(lambda: raw_consume(broker.bootstrap_servers, topics), settings["repeats"])
        if runner == FLINK:
            in_process, pipeline, flink_details = compare_with_flink(
                broker.bootstrap_servers, sim, beam_args, settings["repeats"], settings["flink_timeout_s"]
            )
        else:
            with tempfile.TemporaryDirectory() as root:
                pipeline = repeat_rate(
                    lambda: timed_build(
                        build_config(broker.bootstrap_servers, sim, root, args.user_author_surface), beam_args
                    )[0],
                    settings["repeats"],
                )
    config = {
        "users": sim.users,
        "events": events,
        "broker": args.broker,
        "runner": options.view_as(StandardOptions).runner,
        "direct_running_mode": options.view_as(DirectOptions).direct_running_mode,
        "direct_num_workers": options.view_as(DirectOptions).direct_num_workers,
        "beam_args": beam_args,
        "build": {
            name: getattr(BuildTransitionsConfig, name)
            for name in ("num_shards", "max_records_per_chunk", "join_window_s", "session_gap_s")
        }
        | {"user_author_surface": args.user_author_surface},
    }
    if runner == FLINK:
        result = flink_result(args, config, load_before, pipeline, in_process, raw, flink_details)
    else:
        result = in_process_result(args, config, load_before, pipeline, raw)
    result["wall_s"] = time.perf_counter() - started
    write_result(args.out, result)
    ratio = f"ratio {result['metrics']['ratio_to_raw_consume']:.2f}"
    load = f"load {result['load_average']['start']:.1f} -> {result['load_average']['end']:.1f}"
    rates = f"{pipeline['value']:,.0f} events/s (min {pipeline['min']:,.0f}, max {pipeline['max']:,.0f})"
    if runner == FLINK:
        print(
            f"pipeline on Flink (parallelism {FLINK_PARALLELISM}): {rates} over {events:,} events; "
            f"in-process {in_process['value']:,.0f}/s, ratio to it {result['ratio_to_in_process']:.2f}; "
            f"raw consume {raw['value']:,.0f}/s, {ratio}; no target; {load}; "
            f"{result['wall_s']:.0f} s; wrote {args.out}"
        )
    else:
        verdict = "met" if result["meets_targets"] else "NOT met"
        print(
            f"pipeline: {rates} over {events:,} events; raw consume {raw['value']:,.0f}/s; {ratio}; "
            f"target >= {TARGET_EVENTS_PER_S:,} -> {verdict}; {load}; wrote {args.out}"
        )
    return 0


def in_process_result(
    args: argparse.Namespace,
    config: dict[str, Any],
    load_before: tuple[float, ...],
    pipeline: dict[str, Any],
    raw: dict[str, Any],
) -> dict[str, Any]:
    """The default run's result: the in-process rate against the raw consumer and the target."""
    return {
        "benchmark": "pipeline",
        "mode": args.mode,
        "seed": args.seed,
        "config": config,
        # 1-minute load averages when the bench started and ended (2 cores: above ~2, other work competes)
        "load_average": {"start": load_before[0], "end": os.getloadavg()[0]},
        "events_per_s": pipeline["value"],
        "raw_consume_events_per_s": raw["value"],
        "metrics": {
            "events_per_s": pipeline,
            "raw_consume_events_per_s": raw,
            "ratio_to_raw_consume": pipeline["value"] / raw["value"],
        },
        # wide bounds: one shared 2-core machine; only the lower target is a goal
        "targets": {"events_per_s": {"min": TARGET_EVENTS_PER_S, "max": None}},
        "meets_targets": pipeline["value"] >= TARGET_EVENTS_PER_S,
    }


def flink_result(
    args: argparse.Namespace,
    config: dict[str, Any],
    load_before: tuple[float, ...],
    pipeline: dict[str, Any],
    in_process: dict[str, Any],
    raw: dict[str, Any],
    flink_details: dict[str, Any],
) -> dict[str, Any]:
    """The --runner flink result: Flink's rate, beside the in-process one timed in the same run; no target.

    ``config`` describes the in-process runs (the Beam flags given apply to them); ``config.flink``
    the Flink ones.
    """
    return {
        "benchmark": "pipeline",
        "runner": FLINK,
        "mode": args.mode,
        "seed": args.seed,
        "config": {**config, "flink": flink_details},
        "load_average": {"start": load_before[0], "end": os.getloadavg()[0]},
        "events_per_s": pipeline["value"],
        "ratio_to_in_process": pipeline["value"] / in_process["value"],
        "in_process_events_per_s": in_process["value"],
        "raw_consume_events_per_s": raw["value"],
        "metrics": {
            "events_per_s": pipeline,
            "in_process_events_per_s": in_process,
            "raw_consume_events_per_s": raw,
            "ratio_to_in_process": pipeline["value"] / in_process["value"],
            "ratio_to_raw_consume": pipeline["value"] / raw["value"],
        },
        # published for comparison only: Flink on one 2-core machine is not what a cluster would do
        "targets": {},
        "meets_targets": None,
    }


if __name__ == "__main__":
    sys.exit(main())
