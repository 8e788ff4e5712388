"""``build-transitions`` end to end: plan the replay, run the pipeline, publish, then commit offsets.

Its command-line side is ``recsys_rl.cli.build_transitions``; this module does the work.

The order is what makes a crash at any point safe. Offsets are committed last, so a crash before the
commit replays the same offsets; those map to the same dataset version, so the rerun finds the dataset
already written (and verifies it) instead of writing a second copy, and finishes the remaining steps.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gc
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner.fn_runner import ExtendedProvisionInfo, FnApiRunner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import PipelineRunner

from recsys_rl.atomic_json import jsonl_file, read_json_file, write_json_atomic
from recsys_rl.config import ConfigError
from recsys_rl.dataset_contract import MANIFEST
from recsys_rl.kafka.producer import EventProducer
from recsys_rl.kafka.reader import high_watermarks, read_range
from recsys_rl.kafka.topics import TopicSpec, ensure_topics
from recsys_rl.pipelines.carry import CARRIED_FILE, read_carried
from recsys_rl.pipelines.dataset import (
    DEAD_LETTER_FILE,
    ORPHANED_DIR,
    ORPHANED_NOTE,
    DatasetError,
    DatasetPaths,
    clear_leftovers,
    dataset_version,
    exclusive_output,
    finalize,
    orphan_overlapping,
    read_manifest,
    replace_staged_file,
    sha256_of,
    verify,
)
from recsys_rl.pipelines.episodes import EpisodeConfig
from recsys_rl.pipelines.kafka_source import ReplayPlan, commit_offsets, plan_replay
from recsys_rl.pipelines.transitions import build_pipeline
from recsys_rl.pipelines.user_author import HISTORIES_FILE, read_histories
from recsys_rl.storage import Location, location, use_pipeline_options

PUBLISHED_MARKER = "dead-letters.published.json"
PUBLISHING_MARKER = "dead-letters.publishing.json"  # written before the first letter is sent
# The runner when the arguments name none. Beam's DirectRunner first tries Prism, a Go runner it
# downloads from GitHub at every run (seconds; a failure, then a fallback, on a machine without
# internet access), and otherwise runs a batch pipeline on its in-process engine, the FnApiRunner.
# Naming that engine gives the embedded default without the download: the engine the tests check
# (in memory, or with --direct_running_mode=multi_processing), and ~1 s less per run.
EMBEDDED_RUNNER = "FnApiRunner"
START_MODES = ("committed", "earliest")


@dataclass(frozen=True)
class BuildTransitionsConfig:
    """One bounded replay of the decision and feedback topics into a versioned transition dataset."""

    bootstrap_servers: str = ""  # Kafka cluster, HOST:PORT[,...]
    group: str = ""  # consumer group: its committed offsets start the replay and receive the end offsets
    out: str = ""  # dataset root: each build adds <out>/<version>/ with shards and manifest.json
    decisions_topic: str = "recsys.decisions"
    feedback_topic: str = "recsys.feedback"
    dead_letter_topic: str = "recsys.deadletter"  # "" keeps dead letters in the dataset's file only
    start: str = "committed"  # committed: resume the group; earliest: replay from each log start
    join_window_s: float = 3600.0  # feedback later than this after its decision is dead-lettered
    session_gap_s: float = 1800.0  # inactivity that ends an episode
    num_shards: int = 4  # shards per surface; fixed so reruns produce the same files
    max_records_per_chunk: int = 5_000  # unit of parallel reading; smaller -> more parallelism, more overhead
    commit: bool = True  # commit end offsets after the dataset is written; off for dry runs
    # hold back sessions still open at the cut-off and build them in the group's next run, with the
    # feedback that comes after it (``pipelines.carry``): what scheduled runs over a live stream need
    carry_open_sessions: bool = False
    # build the user-author surface too (``pipelines.user_author``); turn it on from the group's first
    # run: a pair's history starts with the first run that builds it
    user_author_surface: bool = False

    def __post_init__(self) -> None:
        for name in ("bootstrap_servers", "group", "out"):
            if not getattr(self, name):
                raise ValueError(f"{name} is required")
        if self.start not in START_MODES:
            raise ValueError(f"start should be one of {list(START_MODES)}, but is {self.start!r}")
        for name in ("num_shards", "max_records_per_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be at least 1, but is {getattr(self, name)}")
        for name in ("join_window_s", "session_gap_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} should be positive, but is {getattr(self, name)}")
        location(self.out)  # a URI whose filesystem is missing fails here, before anything is read

    @property
    def out_dir(self) -> Location:
        """``out`` as a location: a URI (``s3://b/x``) through Beam's filesystems, or a local path made
        absolute here, on the driver: a relative path would resolve against each worker's own working
        directory, and workers on another runner would write the shards out of reach."""
        return location(self.out)

    def episode_config(self) -> EpisodeConfig:
        return EpisodeConfig(
            join_window_ms=round(self.join_window_s * 1000), session_gap_ms=round(self.session_gap_s * 1000)
        )

    def output_settings(self) -> dict[str, Any]:
        """The settings that shape the dataset's bytes (and so its version)."""
        return {
            "decisions_topic": self.decisions_topic,
            "feedback_topic": self.feedback_topic,
            "join_window_ms": self.episode_config().join_window_ms,
            "session_gap_ms": self.episode_config().session_gap_ms,
            "num_shards": self.num_shards,
            "carry_open_sessions": self.carry_open_sessions,
            "user_author_surface": self.user_author_surface,
        }


@dataclass
class BuildResult:
    plan: ReplayPlan
    dataset_dir: Location | None  # None when there was nothing to read
    manifest: dict[str, Any] | None
    reused: bool  # the dataset already existed from an earlier, interrupted run
    dead_letters_published: int
    committed: bool
    # datasets of the group whose offsets a crash left uncommitted, moved aside (`orphan_overlapping`)
    orphaned: list[str] = field(default_factory=list)


def build_transitions(
    config: BuildTransitionsConfig,
    pipeline_args: Sequence[str] = (),
    progress: Callable[[str, dict[str, Any]], None] = lambda event, fields: None,
) -> BuildResult:
    options = pipeline_options(pipeline_args)  # bad Beam arguments fail before anything is read
    use_pipeline_options(options)  # an object store's endpoint and credentials, for this process too
    out = config.out_dir
    with exclusive_output(out):
        if leftovers := clear_leftovers(out):
            progress("cleared", {"leftovers": len(leftovers)})
        return _build(config, options, out, progress)


def _build(config: BuildTransitionsConfig, options: PipelineOptions, out: Location, progress) -> BuildResult:
    plan = plan_replay(
        config.bootstrap_servers, [config.decisions_topic, config.feedback_topic], config.group, config.start
    )
    progress("planned", {"records": plan.total_records, "partitions": len(plan.ranges)})
    if plan.total_records == 0:
        return BuildResult(plan, None, None, reused=False, dead_letters_published=0, committed=False)

    ranges = [dataclasses.asdict(r) for r in plan.ranges]
    # what the run before carried over is built here, whether or not this run carries in turn
    carried_from = (
        _previous_carry(out, plan, config.user_author_surface) if config.start == "committed" else None
    )
    inputs = {"ranges": ranges, **({"carried_from": carried_from} if carried_from else {})}
    paths = DatasetPaths(out, dataset_version(inputs, config.output_settings()))
    orphaned = []
    if config.start == "committed":  # other starts replay on purpose, over whatever is there
        starts = {(r.topic, r.partition): r.start for r in plan.ranges}
        if orphaned := orphan_overlapping(out, config.group, starts, keep=paths.version):
            progress("orphaned", {"datasets": ",".join(orphaned)})
    reused = (paths.final / MANIFEST).is_file()
    if reused:
        broken = verify(paths.final)
        if broken:
            raise DatasetError(f"dataset {paths.final} does not match its manifest: {broken[:5]}")
        manifest = read_manifest(paths.final)
        progress("reused", {"dataset": str(paths.final)})
    else:
        paths.staging.mkdir(parents=True)
        with (
            _fewer_collections(),
            beam.Pipeline(runner=pipeline_runner(options), options=options) as pipeline,
        ):
            build_pipeline(
                pipeline,
                plan,
                decisions_topic=config.decisions_topic,
                feedback_topic=config.feedback_topic,
                episode_config=config.episode_config(),
                num_shards=config.num_shards,
                max_records_per_chunk=config.max_records_per_chunk,
                staging_dir=str(paths.staging),
                carry=config.carry_open_sessions,
                carried_in=read_carried(out / carried_from["dataset"] / CARRIED_FILE) if carried_from else (),
                user_author=config.user_author_surface,
                histories_in=list(read_histories(out / carried_from["dataset"] / HISTORIES_FILE))
                if carried_from and config.user_author_surface
                else (),
            )
        fill_dead_letters(paths.staging, config.bootstrap_servers)
        inputs = {
            "bootstrap_servers": config.bootstrap_servers,
            "group": config.group,
            **plan.to_dict(),
            "carried_from": carried_from,
        }
        manifest = finalize(paths, inputs, config.output_settings())
        progress("written", {"dataset": str(paths.final)})

    # a dry run (no commit) leaves Kafka as it found it: the next real run publishes the letters (the
    # training pipeline, which commits in a step of its own, publishes them in that step)
    published = publish_dead_letters(paths.final, config) if config.commit else 0
    committed = False
    if config.commit:
        commit_offsets(plan)
        committed = True
        progress("committed", {"group": config.group})
    return BuildResult(plan, paths.final, manifest, reused, published, committed, orphaned)


def _previous_carry(out: Location, plan: ReplayPlan, pairs: bool) -> dict[str, str] | None:
    """The group's dataset that this plan continues (its ranges end where this plan's start), if it
    carried open sessions over: its name and its carried file's digest, and with ``pairs`` its pair
    histories' digest where it has them (not every dataset does), which go into this dataset's version,
    so a rerun after a crash reads the same carried events and histories and writes the same bytes."""
    starts = {(r.topic, r.partition): r.start for r in plan.ranges}
    for dataset in sorted(p for p in out.iterdir() if not p.name.startswith(".")):
        if not (dataset / CARRIED_FILE).is_file() or not (dataset / MANIFEST).is_file():
            continue
        inputs = read_manifest(dataset)["inputs"]
        ends = {(r["topic"], r["partition"]): r["end"] for r in inputs.get("ranges", [])}
        if inputs.get("group") == plan.group and ends == starts:
            found = {"dataset": dataset.name, "sha256": sha256_of(dataset / CARRIED_FILE)}
            if pairs and (dataset / HISTORIES_FILE).is_file():
                found["pair_histories_sha256"] = sha256_of(dataset / HISTORIES_FILE)
            return found
    return None


def pipeline_options(pipeline_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the arguments, with `EMBEDDED_RUNNER` unless they name a runner.

    The in-process engine's multi_threading mode is refused, whatever the number of workers: the
    FnApiRunner's periodic output flush sends a buffer and then clears it without the lock the bundle
    thread writes under, so elements written in between are lost (Beam 2.77). With two or more
    workers it lost tens to hundreds of transitions in one run of three; with one worker, whole users
    under CPU load in two CLI runs of ten. The accounting checks catch the loss, but only after the
    run. multi_processing and in_memory write every element.
    """
    options = PipelineOptions(list(pipeline_args))
    standard = options.view_as(StandardOptions)
    if standard.runner is None:
        standard.runner = EMBEDDED_RUNNER
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "multi_threading":
        raise ConfigError(
            "--direct_running_mode=multi_threading loses elements (Beam's FnApiRunner flushes its output "
            "buffer without the bundle thread's lock); use --direct_running_mode=multi_processing for "
            "parallel workers, or in_memory"
        )
    return options


def pipeline_runner(options: PipelineOptions) -> PipelineRunner | None:
    """The embedded engine when the options name it, made to hand them on to its worker processes;
    None for any other runner, which Beam makes from the options itself.

    Beam makes a runner named ``FnApiRunner`` with no provisioning information, so worker processes
    (``--direct_running_mode=multi_processing``) start with empty options: an object store's endpoint
    and credentials never reach the workers that write the shards. Its DirectRunner passes them in
    provisioning information, as done here.
    """
    if options.view_as(StandardOptions).runner != EMBEDDED_RUNNER:
        return None
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return FnApiRunner(
        provision_info=ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    )


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run the pipeline with CPython's cyclic garbage collector passing less often.

    The pipeline allocates millions of short-lived tuples, lists and dicts that reference counting frees
    (none forms a cycle), yet every 700 allocations start a collection, and the older generations
    rescan every object alive, Beam's and Kafka's included: about a tenth of an embedded run's time.
    Objects alive at the start are frozen out of the scans and collections come a hundred times less
    often. This tunes only the process that runs the pipeline (the embedded runner); remote workers
    keep their defaults.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(70_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def fill_dead_letters(staging: Location, bootstrap_servers: str) -> int:
    """Read back from the source the key, value and timestamp of every dead letter written without them
    (``episodes.unread_dead_letter``: a conflicting duplicate decision, found after the shuffle), so that
    every letter of the dataset carries its record's bytes. The records were read by this very run, so
    they are still in the log. Returns how many were filled."""
    path = staging / DEAD_LETTER_FILE
    if not path.exists():
        return 0
    letters = [json.loads(line) for line in path.read_bytes().splitlines()]
    unread = [letter for letter in letters if letter["value"] is None]
    for letter in unread:
        partition, offset = letter["partition"], letter["offset"]
        end = {partition: offset + 1}
        [record] = read_range(bootstrap_servers, letter["topic"], {partition: offset}, end)
        letter.update(
            timestamp_ms=record.timestamp_ms,
            key=base64.b64encode(record.key or b"").decode("ascii"),
            value=base64.b64encode(record.value or b"").decode("ascii"),
        )
    if unread:
        replace_staged_file(staging, DEAD_LETTER_FILE, jsonl_file(letters))
    return len(unread)


def publish_dead_letters(dataset: Location, config: BuildTransitionsConfig) -> int:
    """Send the dataset's dead letters to the dead-letter topic exactly once, across crashes and reruns;
    returns how many this call sent.

    Before the first send, a marker notes where the topic ended, or where an earlier dataset over the
    same offsets began publishing, if this one supersedes it (`orphan_overlapping`: it was published,
    and maybe sent letters, but its offsets were never committed). The topic is read from there and only
    the letters whose key, their record's source coordinates, it does not hold are sent; so a rerun
    after dying while sending, or before noting that it was done, sends each letter once.
    """
    done = dataset / PUBLISHED_MARKER
    source = dataset / DEAD_LETTER_FILE
    if not config.dead_letter_topic or done.exists() or not source.exists():
        return 0
    topic, servers = config.dead_letter_topic, config.bootstrap_servers
    lines = source.read_bytes().splitlines()
    letters = {_letter_key(json.loads(line)): line for line in lines}
    present: set[bytes] = set()
    if letters:
        ensure_topics(servers, [TopicSpec(topic, 1)])
        publishing = dataset / PUBLISHING_MARKER
        if not publishing.exists():
            since = high_watermarks(servers, topic)
            for began in _superseded_publishing(dataset):
                since = {p: min(offset, began.get(p, offset)) for p, offset in since.items()}
            write_json_atomic(publishing, {"topic": topic, "from": since})
        noted = read_json_file(publishing, DatasetError, "where publishing its dead letters began")
        since = {int(partition): offset for partition, offset in noted["from"].items()}
        present = {record.key for record in read_range(servers, topic, since) if record.key in letters}
        with EventProducer(servers) as producer:
            for key, line in letters.items():
                if key not in present:
                    producer.send(topic, key, line, json.loads(line)["timestamp_ms"])
    _note_published(done, topic, len(lines))
    return len(letters) - len(present)


def _superseded_publishing(dataset: Location) -> list[dict[int, int]]:
    """Where the datasets this one superseded (directly, or through a chain of orphans) began publishing
    their dead letters, for those that did."""
    orphans = dataset.parent / ORPHANED_DIR
    notes = {p.parent: read_json_file(p, DatasetError, "") for p in orphans.glob(f"*/{ORPHANED_NOTE}")}
    began, names = [], {dataset.name}
    while chain := [d for d, note in notes.items() if note["superseded_by"] in names and d.name not in names]:
        for orphan in chain:
            names.add(orphan.name)
            if (orphan / PUBLISHING_MARKER).exists():
                noted = read_json_file(orphan / PUBLISHING_MARKER, DatasetError, "")
                began.append({int(p): offset for p, offset in noted["from"].items()})
    return began


def _letter_key(letter: dict[str, Any]) -> bytes:
    return f"{letter['topic']}/{letter['partition']}/{letter['offset']}".encode()


def _note_published(marker: Location, topic: str, records: int) -> None:
    write_json_atomic(marker, {"topic": topic, "records": records})
