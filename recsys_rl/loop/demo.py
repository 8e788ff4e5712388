"""``recsys-rl demo``: the whole closed loop on one machine, with nothing but pip-installed parts.

Its command-line side is ``recsys_rl.cli.demo``; this module does the work.

    simulated day 0 (behaviour policy) -> Kafka -> pipeline run 1 -> registry (blessed: stable)
    -> ``recsys-rl serve`` in its own process -> simulated day 1, every decision made by the server
       over gRPC -> server decision logs + client feedback in Kafka -> pipeline run 2 -> summary

With ``served_days`` above one, the server is started afresh for each further day (a daily deploy), and
a pipeline run follows every served day. Each start warms the server's feature cache with the user
table's accounts, as a shard would with the users its load balancer sends it.

Everything lands under one output directory, including the pipeline config it wrote, so what the demo
did can be read, rerun and changed with the ordinary commands.

The demo's gate is looser than a production one, and says so in the config it writes: one simulated day
of a few thousand users cannot resolve the sparse signals (a follow is one view in two thousand), so
their tolerances are wide; a production gate keeps them tight and needs the traffic to match.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from recsys_rl.atomic_json import read_json_file, write_json_atomic
from recsys_rl.dataset_contract import MANIFEST
from recsys_rl.errors import OperationalError
from recsys_rl.feature_repo import REPO_DIR as FEATURE_REPO
from recsys_rl.kafka import open_broker
from recsys_rl.ope.gate import GateConfig
from recsys_rl.processes import stop_process
from recsys_rl.sim.events import EventIds
from recsys_rl.sim.live_client import ServedDay, TrafficReport, drive_day
from recsys_rl.sim.parameters import SimConfig
from recsys_rl.sim.simulate import SimulateConfig, run_simulation, simulated_days

DEMO_MARKER = "demo.json"
#: The pipeline config the demo writes per surface, under its output; each runs again with `pipeline run`.
PIPELINE_CONFIGS = {"feed": "pipeline.yaml", "live_allocation": "pipeline-live.yaml"}
USER_TABLE_DIR = "user_table"  # under the output: the simulated platform's user table
SERVER_START_TIMEOUT_S = 180.0
_DAY_MS = 86_400_000


#: The demo's rollout gate (see the module docstring): the main signal may not look clearly worse, the
#: dense signals keep production-like tolerances, the sparse ones are wide open at this data size.
def demo_gate() -> GateConfig:
    return GateConfig(
        resamples=100,
        min_main_lift=-0.10,
        default_tolerance=0.25,
        tolerances={"like": 0.6, "follow": 1.0, "comment": 1.0, "share": 1.0, "hate": 1.0},
        min_ess=100.0,
        max_weight_share=0.1,
    )


#: The same for live-stream allocation: gifts are as sparse as follows here, displaced video watch is dense.
def demo_live_gate() -> GateConfig:
    return dataclasses.replace(demo_gate(), surface="live_allocation", tolerances={"gift": 1.0})


class DemoError(OperationalError):
    """A demo step failed; the message says which and where its log is."""


@dataclass(frozen=True)
class DemoConfig:
    out: str = "demo-output"  # everything the demo writes; an earlier demo's output there is replaced
    users: int = 1_500  # simulated users
    seed: int = 0
    train_steps: int = 800
    served_days: int = 1  # days the live server decides after day 0, each followed by a pipeline run
    feature_repo: str = str(FEATURE_REPO)  # the project's Feast repo, as installed
    bootstrap_servers: str | None = None  # an existing Kafka cluster; None: start the embedded broker
    broker: str = "embedded"  # broker to start when no servers are given: embedded | local-kafka
    deadline_s: float = 2.0  # per gRPC call of the simulated users; a late answer counts as failed
    gate: GateConfig = field(default_factory=demo_gate)
    # live-stream allocation too: a second pipeline (SL-MGAC, its own gate and consumer group) after each
    # feed run, so that Allocate is answered by a trained policy once one is blessed
    train_live: bool = True
    live_gate: GateConfig = field(default_factory=demo_live_gate)

    def __post_init__(self) -> None:
        for name in ("users", "train_steps", "served_days"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} should be at least 1, but is {getattr(self, name)}")
        for name, surface in (("gate", "feed"), ("live_gate", "live_allocation")):
            if getattr(self, name).surface != surface:
                raise ValueError(f"{name}.surface should be {surface}, but is {getattr(self, name).surface}")


@dataclass
class DemoSummary:
    out: Path
    simulated_records: int
    runs: list[dict[str, Any]]  # the feed pipeline's run records: day 0's, then one per served day
    served: list[ServedDay]  # days 1, 2, ...: the calls made and the simulator's record of each
    seconds: float
    live_runs: list[dict[str, Any]] = field(default_factory=list)  # the live pipeline's, likewise (if any)

    @property
    def traffic(self) -> TrafficReport:
        """All served days' calls together."""
        total = TrafficReport()
        for day in self.served:
            total.add(day.traffic)
        return total

    def text(self) -> str:
        lines = [f"demo finished in {self.seconds:.0f} s; everything is under {self.out}"]
        lines.append(f"  day 0: {self.simulated_records} records written by the behaviour policy")
        lines.extend(self._pipeline_lines(0))
        for day, served in enumerate(self.served, start=1):
            t = served.traffic
            failed = ", ".join(f"{count} {code}" for code, count in sorted(t.errors.items())) or "none"
            lines.append(
                f"  day {day} through the live server: {t.rank_calls} Rank + {t.allocate_calls} Allocate "
                f"calls at {t.calls_per_s:.0f} calls/s (failed: {failed}), "
                f"{t.feedback_events} feedback events"
            )
            lines.extend(f"    answered by {key}: {n}" for key, n in sorted(t.policy_versions.items()))
            lines.extend(self._pipeline_lines(day))
        report = next((r for r in reversed(self.runs) if "evaluate" in r["steps"]), None)
        if report is not None:
            lines.append(f"  OPE report: {report['steps']['evaluate']['outputs']['report']}/report.html")
        return "\n".join(lines)

    def _pipeline_lines(self, day: int) -> list[str]:
        """The feed run after ``day``, then the live one (it reuses the feed run's dataset: same offsets)."""
        lines = _run_lines(f"pipeline run {day + 1}", self.runs[day])
        if self.live_runs:
            name = f"pipeline run {day + 1}, live allocation"
            lines.extend(_run_lines(name, self.live_runs[day], dataset_lines=False))
        return lines


def _run_lines(name: str, record: dict[str, Any], dataset_lines: bool = True) -> list[str]:
    steps = record["steps"]
    ingest = steps["ingest"]["outputs"]
    lines = [f"  {name}: {ingest.get('records', 0)} records ingested"]
    if "dataset" in ingest and dataset_lines:
        accounting = ingest["accounting"]
        lines[-1] += (
            f" into {ingest['dataset']}: {accounting['used_in_transitions']} in transitions, "
            f"{accounting['dead_lettered']} dead-lettered {accounting['dead_lettered_by_reason'] or ''}"
        ).rstrip()
        manifest = read_json_file(Path(ingest["dataset"]) / MANIFEST, DemoError, "the dataset's manifest")
        lines.extend(_fallback_line(surface, facts) for surface, facts in manifest["surfaces"].items())
    if "evaluate" in steps:
        evaluation = steps["evaluate"]["outputs"]
        # the verdict's headline and a loose gate's mark (run records from before they were kept: the flag)
        verdict = evaluation.get("verdict") or ("BLESSED" if evaluation["blessed"] else "NOT BLESSED")
        lines.append(f"    OPE verdict vs {evaluation['incumbent']}: {verdict}")
        lines.extend(f"      {reason}" for reason in evaluation["reasons"])
    if "promote" in steps:
        promoted = steps["promote"]["outputs"]
        lines.append(f"    registry: {promoted['version']} -> {promoted.get('role', promoted.get('reason'))}")
    return lines


def _fallback_line(surface: str, facts: dict[str, Any]) -> str:
    """How many of a surface's decisions the state built from default user features, and why."""
    missing, rows = facts["features_missing"], facts["rows"]
    share = missing["rows"] / rows if rows else 0.0
    why = ", ".join(f"{count} {reason}" for reason, count in missing["by_reason"].items())
    return f"    {surface}: {missing['rows']} of {rows} decisions on default user features ({share:.1%})" + (
        f": {why}" if why else ""
    )


def run_demo(config: DemoConfig, say: Callable[[str], None], progress) -> DemoSummary:
    from recsys_rl.pipelines.training_pipeline import load_pipeline_config, run_pipeline

    started = time.perf_counter()
    out = _fresh_output(Path(config.out))
    suffix = uuid.uuid4().hex[:8]
    topics = {
        "decisions_topic": f"demo-{suffix}.decisions",
        "feedback_topic": f"demo-{suffix}.feedback",
    }
    sim_config = SimulateConfig(
        users=config.users, days=1, seed=config.seed, user_table=str(out / USER_TABLE_DIR), **topics
    )
    with open_broker(config.bootstrap_servers, config.broker) as broker:
        servers = broker.bootstrap_servers
        say(f"[1/5] simulating day 0 for {config.users} users into Kafka at {servers}")
        simulation = simulated_days(sim_config)
        written = run_simulation(sim_config, servers, simulation=simulation)

        surfaces = ("feed", "live_allocation") if config.train_live else ("feed",)
        records: dict[str, list[dict[str, Any]]] = {surface: [] for surface in surfaces}

        def pipeline_run(day: int) -> None:
            for surface in surfaces:
                path = out / PIPELINE_CONFIGS[surface]
                _write_pipeline_config(path, config, out, servers, topics, suffix, day, surface)
                records[surface].append(run_pipeline(load_pipeline_config(str(path)), progress).record)

        trained = "TSCAC and SL-MGAC" if config.train_live else "TSCAC"
        say(
            f"[2/5] pipeline run 1 on day 0: ingest, features, train ({trained}), evaluate, register, promote"
        )
        pipeline_run(0)
        served: list[ServedDay] = []
        for day in range(1, config.served_days + 1):
            say(f"[3/5] starting `recsys-rl serve` and driving day {day} through it over gRPC")
            with (
                _server(config, out, servers, topics["decisions_topic"], out / USER_TABLE_DIR) as target,
                grpc.insecure_channel(target) as channel,
            ):
                served.append(
                    drive_day(
                        simulation[0],
                        channel,
                        servers,
                        topics["feedback_topic"],
                        EventIds.for_seed(config.seed),
                        deadline_s=config.deadline_s,
                        progress=lambda calls: say(f"      {calls} Rank calls"),
                    )
                )
            say(
                f"[4/5] pipeline run {day + 1} on day {day}: "
                "the server's decision logs and the users' feedback"
            )
            pipeline_run(day)
    runs = records["feed"]
    summary = DemoSummary(
        out,
        sum(written.written.values()),
        runs,
        served,
        time.perf_counter() - started,
        records.get("live_allocation", []),
    )
    write_json_atomic(
        out / DEMO_MARKER,
        {
            "seconds": summary.seconds,
            "runs": [r["run_id"] for r in runs],
            "calls_per_s": summary.traffic.calls_per_s,
        },
    )
    say("[5/5] summary")
    return summary


def _fresh_output(out: Path) -> Path:
    """``out`` empty: a directory holding an earlier demo is replaced, anything else is refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / DEMO_MARKER).exists() and not (out / PIPELINE_CONFIGS["feed"]).exists():
            raise DemoError(f"{out} exists and is not a demo's output; choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out.resolve()


def _day_end_iso(day: int) -> str:
    end_ms = SimConfig().start_time_ms + (day + 1) * _DAY_MS
    return dt.datetime.fromtimestamp(end_ms / 1000, dt.UTC).isoformat()


def _write_pipeline_config(
    path: Path,
    config: DemoConfig,
    out: Path,
    servers: str,
    topics: dict[str, str],
    suffix: str,
    day: int,
    surface: str,
) -> None:
    """One surface's pipeline config. Each surface has its own consumer group and run records; both write
    datasets into one root, where the live run finds the feed run's dataset (same offsets, same version)."""
    live = surface == "live_allocation"
    settings = {
        "work_dir": str(out / ("pipeline-live" if live else "pipeline")),
        "registry": str(out / "registry"),
        "ingest": {
            "bootstrap_servers": servers,
            "group": f"demo-{suffix}{'-live' if live else ''}",
            "out": str(out / "datasets"),
            "dead_letter_topic": f"demo-{suffix}.deadletter",
            **topics,
        },
        # simulated days lie in the past: materialise up to the end of the day just ingested
        "features": {
            "repo": config.feature_repo,
            "state_dir": str(out / "feast"),
            "user_table": str(out / USER_TABLE_DIR),
            "end_date": _day_end_iso(day),
        },
        # One day of logs supports only a small step away from the logging policy: a heavier behaviour
        # prior than the default keeps the candidate where the logs can judge it (enough effective
        # sample size for the gate). For SL-MGAC the same pull is the actor's cross-entropy with the
        # logged allocation: at its default (0.1) the demo's policy displaced 35-55% more video watch
        # than the behaviour policy on the upper bound, beyond the gate; at 1.0 it passes.
        "train": {
            "steps": config.train_steps,
            "seed": config.seed,
            "checkpoint_every": 500,
            "log_every": 100,
            **(
                {"algo": "sl-mgac", "allocation": {"actor_supervised_weight": 1.0}}
                if live
                else {"agent": {"behaviour_lambda": 0.5}}
            ),
        },
        "gate": dataclasses.asdict(config.live_gate if live else config.gate),
        "promotion": {"canary_fraction": 0.5},
    }
    header = "# Written by `recsys-rl demo`; run it again with `recsys-rl pipeline run --config` this file.\n"
    path.write_text(header + yaml.safe_dump(settings, sort_keys=False))


@contextmanager
def _server(
    config: DemoConfig, out: Path, servers: str, decisions_topic: str, warm_users: Path
) -> Iterator[str]:
    """``recsys-rl serve`` as a child process; yields its address, stops it (flushing its log) on exit.

    Its feature cache is warmed with ``warm_users`` (Parquet with a user_id column).
    """
    log_path = out / "serve.log"
    command = [
        sys.executable,
        "-m",
        "recsys_rl.cli.main",
        "serve",
        "--registry",
        str(out / "registry"),
        "--port",
        "0",
        "--bootstrap-servers",
        servers,
        "--decisions-topic",
        decisions_topic,
        "--feature-repo",
        str(Path(config.feature_repo).resolve()),
        "--feature-state-dir",
        str(out / "feast"),
        "--feature-warm-users",
        str(warm_users),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log)
        try:
            yield _await_address(process, log_path)
        finally:
            stop_process(process, grace_s=60)


def _await_address(process: subprocess.Popen, log_path: Path) -> str:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode()
        if line.startswith("serving on "):
            return line.split("://", 1)[1].split(",", 1)[0].strip()
        if not line and process.poll() is not None:
            break
    raise DemoError(f"the server did not start (exit code {process.poll()}); see {log_path}")
