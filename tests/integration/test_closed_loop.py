"""The closed loop end to end, smaller than the demo: simulate, pipeline, serve over gRPC, pipeline again.

Runs on real Apache Kafka, with the server in its own process and the simulated users calling it over a
socket. What it pins: the server's decision logs and the users' feedback join with nothing orphaned,
the served policy is the one the first run blessed, and the second run learns from the server's logs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recsys_rl import registry
from recsys_rl.loop.demo import DemoConfig, run_demo
from recsys_rl.ope.gate import GateConfig

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The gate is not under test here (tests/integration/test_gate_error_rates.py is): this one blesses
# anything, so the loop always serves the first run's policy.
OPEN_GATE = GateConfig(
    resamples=20, min_main_lift=-1.0, default_tolerance=100.0, min_ess=0.0, max_weight_share=1.0
)


def test_closed_loop_serves_the_blessed_policy_and_learns_from_its_logs(apache_kafka, tmp_path: Path) -> None:
    config = DemoConfig(
        out=str(tmp_path / "demo"),
        users=250,
        seed=5,
        train_steps=60,
        feature_repo=str(REPO / "features"),
        bootstrap_servers=apache_kafka.bootstrap_servers,
        deadline_s=30.0,  # a loaded CI machine must not turn slow answers into orphaned feedback
        gate=OPEN_GATE,
    )
    lines: list[str] = []
    summary = run_demo(config, lines.append, lambda event, fields: None)
    first, second = summary.runs

    # run 1: the day the behaviour policy logged, trained on, blessed and made stable
    ingest = first["steps"]["ingest"]["outputs"]
    assert ingest["records"] == summary.simulated_records
    assert ingest["accounting"]["dead_lettered"] == 0
    served_version = first["steps"]["register"]["outputs"]["version"]
    assert first["steps"]["promote"]["outputs"] == {
        "version": served_version,
        "role": "stable",
        "routing_revision": 1,
    }

    # day 1: every call answered by that version, none failed
    traffic = summary.traffic
    assert traffic.errors == {}
    assert traffic.rank_calls > 100 and traffic.allocate_calls > 0
    answered = Counter({key.split("/")[0]: n for key, n in traffic.policy_versions.items()})
    assert traffic.policy_versions[f"feed/{served_version}/stable"] == traffic.rank_calls
    assert answered["live_allocation"] == traffic.allocate_calls

    # run 2: exactly the server's decisions plus the users' feedback, all joined
    ingest = second["steps"]["ingest"]["outputs"]
    assert ingest["records"] == traffic.rank_calls + traffic.allocate_calls + traffic.feedback_events
    assert ingest["accounting"]["dead_lettered"] == 0
    assert ingest["accounting"]["used_in_transitions"] == ingest["records"]
    dataset = Path(ingest["dataset"])
    manifest = json.loads((dataset / "manifest.json").read_text())
    feed_rows = pq.read_table(sorted(dataset.glob("transitions-feed-*.parquet"))).column("policy_version")
    assert set(feed_rows.to_pylist()) == {served_version}
    assert len(feed_rows) == traffic.rank_calls == manifest["surfaces"]["feed"]["rows"]

    # decisions on default user features are counted, with their reasons; known users (day 0's, whose
    # rows the server's cache was warmed with) almost never fall back
    first_dataset = Path(first["steps"]["ingest"]["outputs"]["dataset"])
    known = set(pq.read_table(first_dataset / "features" / "user_engagement").column("user_id").to_pylist())
    for surface, facts in manifest["surfaces"].items():
        shards = sorted(dataset.glob(f"transitions-{surface}-*.parquet"))
        rows = pq.read_table(shards, columns=["user_id", "features_missing_reason"]).to_pylist()
        reasons = Counter(row["features_missing_reason"] for row in rows if row["features_missing_reason"])
        assert facts["features_missing"] == {
            "rows": reasons.total(),
            "by_reason": dict(sorted(reasons.items())),
        }
        of_known = [row["features_missing_reason"] != "" for row in rows if row["user_id"] in known]
        assert len(of_known) > 100 and sum(of_known) <= 0.02 * len(of_known), (surface, sum(of_known))
    assert "decisions on default user features" in summary.text()

    # the second candidate was judged against the stable version, and registered either way
    evaluation = second["steps"]["evaluate"]["outputs"]
    assert evaluation["incumbent"] == served_version
    versions = {v.version for v in registry.list_versions(tmp_path / "demo" / "registry", "feed")}
    assert versions == {served_version, second["steps"]["register"]["outputs"]["version"]}
    assert "OPE report:" in summary.text() and (Path(evaluation["report"]) / "report.html").is_file()
