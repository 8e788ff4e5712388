"""The Beam pipeline Kafka -> constrained-MDP transitions (DESIGN 5), as composites and one ``build``.

Stages:
  ReadKafkaReplay -> DecodeEvents (dead letters: bytes, fields, versions, ranges)
  -> GroupByKey(user id) -> BuildEpisodes (dedupe, join, sessionise, chain; more dead letters)
  -> ShardTransitions -> WriteWholeFiles     (TFRecord + Parquet shards)
  -> RunReportFiles                          (dead letters, accounting: JSON lines, same writer)
  -> FeatureAggregateFiles                   (Feast offline store under the dataset, same writer)
  -> PairHistoryFiles                        (with the user-author surface: the pairs' Feast rows)
  -> FileInventory                           (name, size and sha256 of every file above, same writer)
Kafka and file IO happen only in :func:`build_pipeline`; the composites take and give PCollections, so
they are tested with ``beam.Create`` and ``assert_that``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from recsys_rl.atomic_json import jsonl_file
from recsys_rl.dataset_contract import dataset_surfaces
from recsys_rl.feature_tables import PARQUET_SUFFIX, TIMESTAMP_COLUMN, USER_AUTHOR_HISTORY
from recsys_rl.pipelines.carry import CARRIED_FILE, carried_lines, count_events
from recsys_rl.pipelines.dataset import (
    ACCOUNTING_FILE,
    BUILT_PREFIX,
    DEAD_LETTER_FILE,
    FEATURES_DIR,
    INVENTORY_FILE,
    inventory_entry,
)
from recsys_rl.pipelines.episodes import (
    DECISION,
    EVENT_TYPES,
    FEEDBACK,
    EpisodeConfig,
    build_user_episodes,
    dead_letter,
    decode_event,
)
from recsys_rl.pipelines.event_validation import Rejection
from recsys_rl.pipelines.feature_aggregates import FeatureAggregateFiles, day_end
from recsys_rl.pipelines.kafka_source import KafkaBatch, ReadKafkaReplay, ReplayPlan
from recsys_rl.pipelines.transition_io import ShardTransitions
from recsys_rl.pipelines.user_author import (
    HISTORIES_FILE,
    PAIR_HISTORIES,
    feature_rows,
    histories_of,
    history_line,
    pair_transitions,
    with_pair_rewards,
)
from recsys_rl.pipelines.whole_files import WriteWholeFiles, parquet_file
from recsys_rl.state import DAY_MS

DEAD_LETTERS = "dead_letters"
VIEW_FACTS = "view_facts"
FATES = "fates"
LATEST = "latest"  # the latest event time of each batch: the run's cut-off, in event time
CARRIED = "carried"
HISTORIES = "pair_histories"
PAIR_FEATURES = "pair_features"
_EVENT_TIME = {kind: event_type._fields.index("event_time_ms") for kind, event_type in EVENT_TYPES.items()}


class DecodeEvents(beam.DoFn):
    """Parse and validate a batch of Kafka records; valid events grouped by user id, the rest dead-lettered.

    Emits one (user id, (kind, events)) element per user of the batch rather than one per event: the
    shuffle to the per-user builder then costs per user and batch, not per record. Events travel as
    plain tuples, which Beam's default coder writes field by field (a NamedTuple would be pickled).
    """

    def __init__(self, decisions_topic: str, feedback_topic: str, *, latest: bool = False) -> None:
        """``latest``: also emit each batch's latest event time (``LATEST``), which carrying and the
        user-author surface need."""
        self._topics = {decisions_topic: DECISION, feedback_topic: FEEDBACK}
        self._latest = latest

    def process(self, batch: KafkaBatch):
        yield TaggedOutput(FATES, ("read", batch.size))
        topic, partition = batch.topic, batch.partition
        kind = self._topics.get(topic)
        by_user: dict[str, list[tuple]] = defaultdict(list)
        rejected: Counter = Counter()
        for offset, timestamp_ms, key, value in zip(
            batch.offsets, batch.timestamps_ms, batch.keys, batch.values, strict=True
        ):
            ref = (topic, partition, offset, timestamp_ms, key, value)
            if kind is None:
                decoded = Rejection("unknown_topic", f"record from topic {topic!r}, not an input")
            else:
                decoded = decode_event(kind, ref)
            if type(decoded) is Rejection:
                rejected[decoded.reason] += 1
                yield TaggedOutput(DEAD_LETTERS, dead_letter(ref, decoded.reason, decoded.detail))
            else:
                user_id, fields = decoded
                by_user[user_id].append(fields)
        for user_id, events in by_user.items():
            yield user_id, (kind, events)
        if self._latest and by_user:
            time_field = _EVENT_TIME[kind]
            yield TaggedOutput(LATEST, max(e[time_field] for events in by_user.values() for e in events))
        for reason, count in rejected.items():
            Metrics.counter("decode", f"dead_letter_{reason}").inc(count)
            yield TaggedOutput(FATES, (f"dead_letter:{reason}", count))


class BuildEpisodes(beam.DoFn):
    """One user's events (and pair histories) -> transitions, view facts, pair histories, dead letters
    and fate counts.

    Transitions and view facts leave as one list per user, for the same reason events arrive grouped.
    The user-author surface's rows (``pipelines.user_author``) come from the user's view facts of this
    run, each pair starting from its history of the runs before.
    """

    def __init__(self, config: EpisodeConfig, *, carry: bool = False, pairs: bool = False) -> None:
        """``carry``: hold back sessions still open at the cut-off (``pipelines.carry``); ``pairs``: build
        the user-author surface."""
        self._config = config
        self._carry = carry
        self._pairs = pairs

    def process(self, element, latest_ms: int | None = None):
        """``latest_ms``: the run's cut-off in event time (None when it read no valid event)."""
        user_id, groups = element
        events, prior = [], {}
        for kind, group in groups:
            if kind == PAIR_HISTORIES:
                prior = histories_of(group)
            else:
                events += [EVENT_TYPES[kind]._make(event) for event in group]
        open_after = latest_ms - self._config.open_for_ms if self._carry and latest_ms is not None else None
        built = build_user_episodes(user_id, events, self._config, open_after)
        for line in carried_lines(user_id, built.carried):
            yield TaggedOutput(CARRIED, line)
        pair_rows, histories = [], {}
        if self._pairs:
            # a run whose records were all dead letters has no cut-off: its carried-in sessions end by theirs
            cut_off = (
                latest_ms
                if latest_ms is not None
                else max((f["event_time_ms"] for f in built.view_facts), default=0)
            )
            pair_rows, histories = pair_transitions(user_id, built.view_facts, cut_off, prior)
            with_pair_rewards(built.transitions, pair_rows)
        for rows in (built.transitions, pair_rows):
            if rows:
                yield rows
                for surface, count in Counter(row["surface"] for row in rows).items():
                    yield TaggedOutput(FATES, (f"{BUILT_PREFIX}{surface}", count))
        if histories:
            yield TaggedOutput(HISTORIES, history_line(user_id, histories))
        if pair_rows:
            met = {row["author_id"] for row in pair_rows}
            yield TaggedOutput(PAIR_FEATURES, (cut_off, feature_rows(user_id, met, histories)))
        if built.view_facts:
            yield TaggedOutput(VIEW_FACTS, built.view_facts)
        for letter in built.dead_letters:
            yield TaggedOutput(DEAD_LETTERS, letter)
        for fate, count in built.fates.items():
            yield TaggedOutput(FATES, (fate, count))


class KafkaToTransitions(beam.PTransform):
    """KafkaBatches -> {"transitions", "view_facts", "dead_letters", "fates", ...} PCollections.

    ``transitions`` and ``view_facts`` hold lists (one user's rows or facts). ``fates`` holds (fate,
    count) pairs summed over the whole input: ``read``, ``used``, and ``filtered:<reason>`` /
    ``dead_letter:<reason>``; the accounting equation is checked on them. ``built:<surface>`` counts
    the transitions made, which the dataset's files must hold. ``carried`` and ``pair_histories`` hold
    the lines of the files the group's next run starts from; ``pair_features`` the feature store's rows
    of the pairs met in the run, as (run cut-off, one user's rows).
    """

    def __init__(
        self,
        decisions_topic: str,
        feedback_topic: str,
        config: EpisodeConfig,
        *,
        carry: bool = False,
        carried_in: Sequence[tuple] = (),
        pairs: bool = False,
        histories_in: Sequence[tuple] = (),
    ) -> None:
        """``carry``: hold back sessions still open at the cut-off (``pipelines.carry``), which come out as
        ``carried`` file lines; ``carried_in``: the previous run's, as (user id, (kind, events));
        ``pairs``: build the user-author surface too, each pair starting from ``histories_in``, the
        previous run's pair histories as ``user_author.read_histories`` gives them."""
        super().__init__()
        self._decisions_topic = decisions_topic
        self._feedback_topic = feedback_topic
        self._config = config
        self._carry = carry
        self._carried_in = list(carried_in)
        self._pairs = pairs
        self._histories_in = list(histories_in) if pairs else []

    def expand(self, batches):
        cut_off = self._carry or self._pairs
        decoded = batches | "Decode" >> beam.ParDo(
            DecodeEvents(self._decisions_topic, self._feedback_topic, latest=cut_off)
        ).with_outputs(DEAD_LETTERS, FATES, LATEST, main="events")
        pipeline = batches.pipeline
        released = [("released", n)] if (n := count_events(self._carried_in)) else []
        events = (
            decoded.events,
            pipeline | "CarriedIn" >> beam.Create(self._carried_in + self._histories_in, reshuffle=False),
        ) | "WithCarried" >> beam.Flatten()
        side = {}
        if cut_off:  # only when needed: the side input is one more stage (bench/pipeline.py: 2-5% slower)
            latest = decoded[LATEST] | "CutOff" >> beam.CombineGlobally(max).without_defaults()
            side["latest_ms"] = beam.pvalue.AsSingleton(latest, default_value=None)
        built = (
            events
            | "GroupByUser" >> beam.GroupByKey()
            | "BuildEpisodes"
            >> beam.ParDo(
                BuildEpisodes(self._config, carry=self._carry, pairs=self._pairs), **side
            ).with_outputs(
                VIEW_FACTS, DEAD_LETTERS, FATES, CARRIED, HISTORIES, PAIR_FEATURES, main="transitions"
            )
        )
        fates = (
            (
                decoded[FATES],
                built[FATES],
                pipeline | "Released" >> beam.Create(released, reshuffle=False),
            )
            | "AllFates" >> beam.Flatten()
            | "SumFates" >> beam.CombinePerKey(sum)
        )
        dead_letters = (decoded[DEAD_LETTERS], built[DEAD_LETTERS]) | "AllDeadLetters" >> beam.Flatten()
        return {
            "transitions": built.transitions,
            "view_facts": built[VIEW_FACTS],
            "dead_letters": dead_letters,
            "fates": fates,
            "carried": built[CARRIED],
            "pair_histories": built[HISTORIES],
            "pair_features": built[PAIR_FEATURES],
        }


class RunReportFiles(beam.PTransform):
    """(dead letters, fate counts, carried lines, pair-history lines) -> the dead-letter, accounting,
    carried and pair-history files, as (file name, JSON lines).

    Every file exists whatever the run met (an empty dead-letter file says there were none), the
    pair-history file when the run builds the user-author surface (``pairs``). One shuffle keyed by
    file name gathers them, lighter for a runner than a global combine per file.
    """

    def __init__(self, *, pairs: bool = False) -> None:
        super().__init__()
        self._pairs = pairs

    def expand(self, pcolls):
        dead_letters, fates, carried, histories = pcolls
        names = [DEAD_LETTER_FILE, ACCOUNTING_FILE, CARRIED_FILE] + [HISTORIES_FILE] * self._pairs
        every_file = [(name, None) for name in names]
        return (
            (
                dead_letters | "KeyLetters" >> beam.Map(lambda letter: (DEAD_LETTER_FILE, letter)),
                fates | "KeyFates" >> beam.Map(lambda fate: (ACCOUNTING_FILE, fate)),
                carried | "KeyCarried" >> beam.Map(lambda line: (CARRIED_FILE, line)),
                histories | "KeyHistories" >> beam.Map(lambda line: (HISTORIES_FILE, line)),
                dead_letters.pipeline | "EveryFile" >> beam.Create(every_file, reshuffle=False),
            )
            | "AllItems" >> beam.Flatten()
            | "GroupByFile" >> beam.GroupByKey()
            | "ToFile" >> beam.Map(_report_file)
        )


def _report_file(element: tuple[str, Iterable]) -> tuple[str, bytes]:
    name, items = element
    present = [item for item in items if item is not None]
    if name == ACCOUNTING_FILE:
        return name, jsonl_file([dict(sorted(present))])
    if name == CARRIED_FILE:
        return name, jsonl_file(sorted(present, key=lambda d: (d["user_id"], d["kind"])))
    if name == HISTORIES_FILE:
        return name, jsonl_file(sorted(present, key=lambda d: d["user_id"]))
    return name, jsonl_file(sorted(present, key=lambda d: (d["topic"], d["partition"], d["offset"])))


class PairHistoryFiles(beam.PTransform):
    """(run cut-off, one user's pair rows) -> the feature store's ``user_author_history`` file of the run,
    as (path under the features directory, Parquet bytes): every pair met in the run, sorted, each row
    stamped at the end of its last interaction's UTC day (``feature_tables.USER_AUTHOR_HISTORY``).

    One file per run, named by its cut-off: the rows are cumulative, so a later run's rows supersede an
    earlier run's in a point-in-time read, and no run's file replaces another's."""

    def expand(self, pair_features):
        return pair_features | "ByRun" >> beam.GroupByKey() | "ToFile" >> beam.MapTuple(pair_history_file)


def pair_history_file(cut_off_ms: int, users: Iterable[list[dict]]) -> tuple[str, bytes]:
    rows = sorted((row for rows in users for row in rows), key=lambda r: (r["user_id"], r["author_id"]))
    table = USER_AUTHOR_HISTORY
    columns = {key: [row[key] for row in rows] for key in (*table.join_keys, *table.feature_names)}
    columns[TIMESTAMP_COLUMN] = [day_end(row["last_interaction_ms"] // DAY_MS) for row in rows]
    name = f"{FEATURES_DIR}/{table.name}/as-of-{cut_off_ms}{PARQUET_SUFFIX}"
    return name, parquet_file(pa.Table.from_pydict(columns, schema=table.arrow_schema()))


class FileInventory(beam.PTransform):
    """(file name, bytes) elements -> the inventory file listing each one's name, size and sha256.

    Written beside them by the same writer, so that publishing can tell a file the writer lost from
    one the pipeline never made (``recsys_rl.pipelines.dataset``).
    """

    def expand(self, files):
        return (
            files
            | "Entry" >> beam.MapTuple(inventory_entry)
            | "ToInventoryFile" >> beam.Map(lambda entry: (INVENTORY_FILE, entry))
            | "GroupAll" >> beam.GroupByKey()
            | "Lines"
            >> beam.MapTuple(lambda name, entries: (name, jsonl_file(sorted(entries, key=_by_name))))
        )


def _by_name(entry: dict) -> str:
    return entry["name"]


def build_pipeline(
    pipeline: beam.Pipeline,
    plan: ReplayPlan,
    *,
    decisions_topic: str,
    feedback_topic: str,
    episode_config: EpisodeConfig,
    num_shards: int,
    max_records_per_chunk: int,
    staging_dir: str,
    carry: bool = False,
    carried_in: Sequence[tuple] = (),
    user_author: bool = False,
    histories_in: Sequence[tuple] = (),
) -> None:
    """Attach the whole Kafka -> dataset pipeline to ``pipeline``, writing into ``staging_dir``.

    ``user_author``: build the user-author surface too (``pipelines.user_author``), its pairs starting
    from ``histories_in``. It is asked for, not built always: it makes a row per feedback event, about
    three times the decisions' rows, and more than doubles the pipeline's cost (``bench/pipeline.py``).

    Every file, the Feast offline store's under ``features/`` included, goes through one writer:
    each writer adds stages that cost a fixed ~0.2 s of an embedded run.
    """
    records = pipeline | "ReadKafka" >> ReadKafkaReplay(plan, max_records_per_chunk)
    out = records | "ToTransitions" >> KafkaToTransitions(
        decisions_topic,
        feedback_topic,
        episode_config,
        carry=carry,
        carried_in=carried_in,
        pairs=user_author,
        histories_in=histories_in,
    )
    transition_files = out["transitions"] | "Shard" >> ShardTransitions(
        num_shards, dataset_surfaces(user_author)
    )
    report = (out["dead_letters"], out["fates"], out["carried"], out["pair_histories"])
    report_files = report | "RunReport" >> RunReportFiles(pairs=user_author)
    feature_files = (
        out["view_facts"]
        | "FeatureAggregates" >> FeatureAggregateFiles(batched=True)
        | "InFeaturesDir" >> beam.MapTuple(lambda name, table: (f"{FEATURES_DIR}/{name}", table))
    )
    files = [transition_files, report_files, feature_files]
    if user_author:
        files.append(out["pair_features"] | "PairHistories" >> PairHistoryFiles())
    files = tuple(files) | "AllFiles" >> beam.Flatten()
    (
        (files, files | "Inventory" >> FileInventory())
        | "WithInventory" >> beam.Flatten()
        | "Write" >> WriteWholeFiles(staging_dir, f"{staging_dir}/.beam-temp")
    )
