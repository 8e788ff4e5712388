"""``recsys-rl build-transitions``: argument parsing and output of the dataset build.

The work is done by ``recsys_rl.pipelines.build_transitions``.
"""

from __future__ import annotations

import argparse

from recsys_rl.cli.options import add_bootstrap_option, add_config_option, positive_int
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "build-transitions",
        help="replay the Kafka topics into a versioned transition dataset (Apache Beam)",
        description="Read the decision and feedback topics from the group's committed offsets to their "
        "ends at launch, build constrained-MDP transitions with Apache Beam, write TFRecord and Parquet "
        "shards with manifest.json under OUT/<version>/, publish dead letters, then commit the offsets. "
        "Unrecognised flags go to Beam as pipeline options, e.g. --runner=FlinkRunner, "
        "--direct_num_workers=2 --direct_running_mode=multi_processing.",
    )
    add_config_option(p)
    add_bootstrap_option(p, "Kafka cluster to read")
    p.add_argument("--group", help="consumer group whose offsets the replay resumes and commits")
    p.add_argument(
        "--out",
        metavar="DIR|URI",
        help="dataset root: a directory, or a URI of a filesystem Beam has (s3://B/x with --s3_* options)",
    )
    p.add_argument("--decisions-topic", help="decision records topic (default recsys.decisions)")
    p.add_argument("--feedback-topic", help="feedback events topic (default recsys.feedback)")
    p.add_argument(
        "--dead-letter-topic", help="where dead letters go besides the dataset (default recsys.deadletter)"
    )
    p.add_argument(
        "--start", choices=("committed", "earliest"), help="where the replay starts (default committed)"
    )
    p.add_argument("--join-window-s", type=float, help="feedback join window in seconds (default 3600)")
    p.add_argument("--session-gap-s", type=float, help="inactivity gap that ends an episode (default 1800)")
    p.add_argument("--num-shards", type=positive_int, help="shards per surface (default 4)")
    p.add_argument(
        "--max-records-per-chunk", type=positive_int, help="records per parallel read (default 5000)"
    )
    p.add_argument(
        "--carry-open-sessions",
        action="store_true",
        default=None,
        help="hold back sessions still open at the cut-off for the group's next run (scheduled runs)",
    )
    p.add_argument(
        "--user-author-surface",
        action="store_true",
        default=None,
        help="also build the user-author surface: one transition per interaction of a user-author pair",
    )
    p.add_argument(
        "--no-commit",
        dest="commit",
        action="store_false",
        default=None,
        help="do not commit the end offsets nor publish dead letters (a dry run that can be repeated)",
    )
    p.set_defaults(handler=run, accepts_pipeline_args=True)


def run(args: argparse.Namespace) -> int:
    from recsys_rl.pipelines.build_transitions import (  # Beam import only for this verb
        BuildTransitionsConfig,
        build_transitions,
    )

    fields = (
        "bootstrap_servers",
        "group",
        "out",
        "decisions_topic",
        "feedback_topic",
        "dead_letter_topic",
        "start",
        "join_window_s",
        "session_gap_s",
        "num_shards",
        "max_records_per_chunk",
        "carry_open_sessions",
        "user_author_surface",
        "commit",
    )
    config = load_config(BuildTransitionsConfig, args.config, {k: getattr(args, k) for k in fields})
    result = build_transitions(config, args.pipeline_args, progress_logger("build_transitions"))
    if result.dataset_dir is None:
        print(
            f"nothing to read: group {config.group!r} is at the end of "
            f"{config.decisions_topic} and {config.feedback_topic}"
        )
        return 0
    manifest = result.manifest
    accounting = manifest["accounting"]
    print(f"dataset {result.dataset_dir}{' (already built by an earlier run)' if result.reused else ''}")
    for surface, info in manifest["surfaces"].items():
        print(
            f"  {surface:<16} {info['rows']:>9} transitions in {len(info['tfrecord_shards'])} TFRecord "
            f"+ {len(info['parquet_shards'])} Parquet shards"
        )
    released = f" + released from the last run {accounting['released']}" if accounting["released"] else ""
    carried = f" + carried to the next {accounting['carried']}" if accounting["carried"] else ""
    print(
        f"  records read {accounting['read']}{released} = used {accounting['used_in_transitions']} + "
        f"dead-lettered {accounting['dead_lettered']} {accounting['dead_lettered_by_reason']} + filtered "
        f"{accounting['filtered']} {accounting['filtered_by_reason']}{carried}"
    )
    if result.orphaned:
        print(f"  moved aside, uncommitted and covered again: {', '.join(result.orphaned)}")
    if result.dead_letters_published:
        print(f"  {result.dead_letters_published} dead letters published to {config.dead_letter_topic}")
    print(f"  offsets {'committed' if result.committed else 'NOT committed'} for group {config.group!r}")
    return 0
