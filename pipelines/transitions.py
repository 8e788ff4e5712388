"""The Beam pipeline Kafka -> constrained-MDP transitions (DESIGN 5), as composites and one ``build``.

Stages:
  ReadKafkaReplay -> DecodeEvents (dead letters: bytes, fields, versions, ranges)
  -> GroupByKey(user id) -> BuildEpisodes (dedupe, join, sessionise, chain; more dead letters)
  -> ShardTransitions -> WriteWholeFiles     (TFRecord + Parquet shards)
  -> dead letters, accounting                (JSON lines, same writer)
  -> WriteFeatureAggregates                  (Feast offline store under the dataset)
Kafka and file IO happen only in :func:`build_pipeline`; the composites take and give PCollections, so
they are tested with ``beam.Create`` and ``assert_that``.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput

from pipelines.dataset import ACCOUNTING_FILE, DEAD_LETTER_FILE, FEATURES_DIR
from pipelines.episodes import DECISION, FEEDBACK, EpisodeConfig, build_user_episodes, dead_letter
from pipelines.feature_aggregates import WriteFeatureAggregates
from pipelines.kafka_source import KafkaRecord, ReadKafkaReplay, ReplayPlan
from pipelines.transition_io import ShardTransitions
from pipelines.validation import check_decision, check_feedback
from pipelines.whole_files import WriteWholeFiles
from recsys_rl import contracts

DEAD_LETTERS = "dead_letters"
VIEW_FACTS = "view_facts"
FATES = "fates"


class DecodeEvents(beam.DoFn):
    """Parse and validate each Kafka record; valid ones are keyed by user id, the rest dead-lettered."""

    def __init__(self, decisions_topic: str, feedback_topic: str) -> None:
        self._topics = {decisions_topic: DECISION, feedback_topic: FEEDBACK}

    def process(self, record: KafkaRecord):
        ref = (
            0,
            record.topic,
            record.partition,
            record.offset,
            record.timestamp_ms,
            record.key,
            record.value,
        )
        kind = self._topics.get(record.topic)
        if kind is None:
            yield self._reject(ref, "unknown_topic", f"record from topic {record.topic!r}, not an input")
            return
        try:
            if kind == DECISION:
                message = contracts.decode_decision(record.value)
                problem = check_decision(message)
            else:
                message = contracts.decode_feedback(record.value)
                problem = check_feedback(message)
        except contracts.ContractError as err:
            yield self._reject(ref, err.reason, err.detail)
            return
        if problem is not None:
            yield self._reject(ref, problem.reason, problem.detail)
            return
        yield message.user_id, (kind, *ref[1:])

    @staticmethod
    def _reject(ref, reason: str, detail: str) -> TaggedOutput:
        Metrics.counter("decode", f"dead_letter_{reason}").inc()
        return TaggedOutput(DEAD_LETTERS, dead_letter(ref, reason, detail))


class BuildEpisodes(beam.DoFn):
    """One user's events -> transitions, view facts for features, dead letters and fate counts."""

    def __init__(self, config: EpisodeConfig) -> None:
        self._config = config

    def process(self, element):
        user_id, refs = element
        built = build_user_episodes(user_id, refs, self._config)
        yield from built.transitions
        for fact in built.view_facts:
            yield TaggedOutput(VIEW_FACTS, fact)
        for letter in built.dead_letters:
            yield TaggedOutput(DEAD_LETTERS, letter)
        for fate, count in built.fates.items():
            yield TaggedOutput(FATES, (fate, count))


class KafkaToTransitions(beam.PTransform):
    """KafkaRecords -> {"transitions", "view_facts", "dead_letters", "fates"} PCollections.

    ``fates`` holds (fate, count) pairs summed over the whole input: ``read``, ``used``, and
    ``filtered:<reason>`` / ``dead_letter:<reason>``; the accounting equation is checked on them.
    """

    def __init__(self, decisions_topic: str, feedback_topic: str, config: EpisodeConfig) -> None:
        super().__init__()
        self._decisions_topic = decisions_topic
        self._feedback_topic = feedback_topic
        self._config = config

    def expand(self, records):
        decoded = records | "Decode" >> beam.ParDo(
            DecodeEvents(self._decisions_topic, self._feedback_topic)
        ).with_outputs(DEAD_LETTERS, main="events")
        built = (
            decoded.events
            | "GroupByUser" >> beam.GroupByKey()
            | "BuildEpisodes"
            >> beam.ParDo(BuildEpisodes(self._config)).with_outputs(
                VIEW_FACTS, DEAD_LETTERS, FATES, main="transitions"
            )
        )
        read = (
            records
            | "CountRead" >> beam.combiners.Count.Globally()
            | "AsReadFate" >> beam.Map(lambda n: ("read", n))
        )
        decode_fates = decoded[DEAD_LETTERS] | "DecodeFates" >> beam.Map(
            lambda letter: (f"dead_letter:{letter['reason']}", 1)
        )
        fates = (
            (read, decode_fates, built[FATES])
            | "AllFates" >> beam.Flatten()
            | "SumFates" >> beam.CombinePerKey(sum)
        )
        dead_letters = (decoded[DEAD_LETTERS], built[DEAD_LETTERS]) | "AllDeadLetters" >> beam.Flatten()
        return {
            "transitions": built.transitions,
            "view_facts": built[VIEW_FACTS],
            "dead_letters": dead_letters,
            "fates": fates,
        }


def _sorted_file(name: str, key=None):
    """Collect a (small) PCollection into one element (file name, sorted items) for WriteWholeFiles."""
    return beam.combiners.ToList() | beam.Map(lambda items: (name, sorted(items, key=key)))


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
) -> None:
    """Attach the whole Kafka -> dataset pipeline to ``pipeline``, writing into ``staging_dir``."""
    records = pipeline | "ReadKafka" >> ReadKafkaReplay(plan, max_records_per_chunk)
    out = records | "ToTransitions" >> KafkaToTransitions(decisions_topic, feedback_topic, episode_config)
    transition_files = out["transitions"] | "Shard" >> ShardTransitions(num_shards)
    dead_letter_file = out["dead_letters"] | "DeadLetterFile" >> _sorted_file(
        DEAD_LETTER_FILE, key=lambda d: (d["topic"], d["partition"], d["offset"])
    )
    accounting_file = (
        out["fates"]
        | "FatesToDict" >> beam.combiners.ToDict()
        | "AccountingFile" >> beam.Map(lambda counts: (ACCOUNTING_FILE, [dict(sorted(counts.items()))]))
    )
    (
        (transition_files, dead_letter_file, accounting_file)
        | "AllFiles" >> beam.Flatten()
        | "Write" >> WriteWholeFiles(staging_dir, f"{staging_dir}/.beam-temp")
    )
    out["view_facts"] | "FeatureAggregates" >> WriteFeatureAggregates(f"{staging_dir}/{FEATURES_DIR}")
