"""Benchmark: Rank latency of the real server, 200 candidates per request, decision logging to Kafka on.

Set-up, the production way: simulated logs -> embedded Kafka -> transitions; a behaviour-cloning policy
trained on them, evaluated by the OPE gate (with a lenient gate config: this measures speed, not
quality), registered and promoted to stable. Then ``recsys-rl serve`` runs in its own process with
decision logging to the embedded broker, and a load generator in another process
(``bench/serving_load.py``) offers requests open-loop at a fixed rate and then closed-loop to find the
saturation rate. Baseline in the same run: a bare gRPC echo server of the same API under the same load
generator.

Target (DESIGN 12): p99 at most 10 ms at 500 requests per second offered, zero errors.

    python bench/serving.py --quick --out bench/results/serving.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from common import bench_parser, write_result
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recsys_rl import registry
from recsys_rl.kafka import open_broker
from recsys_rl.kafka.broker import free_port
from recsys_rl.kafka.reader import high_watermarks
from recsys_rl.ope.evaluate import EvaluateConfig, run_evaluation
from recsys_rl.ope.gate import GateConfig
from recsys_rl.pipelines.simulated import simulated_dataset
from recsys_rl.training.train import TrainConfig, train

TARGET_P99_MS = 10.0
TARGET_QPS = 500.0
MODES = {
    "quick": {"users": 300, "seconds": 3.0, "saturation_seconds": 2.0},
    "full": {"users": 1_000, "seconds": 20.0, "saturation_seconds": 5.0},
}
LENIENT_GATE = GateConfig(
    resamples=20,
    interval="percentile",
    min_main_lift=-1.0,
    default_tolerance=10.0,
    min_ess=0,
    max_weight_share=1.0,
)
HERE = Path(__file__).resolve().parent


def _blessed_registry(work: Path, bootstrap_servers: str, users: int) -> Path:
    built = simulated_dataset(bootstrap_servers, work / "data", users=users, seed=0)
    run = train(TrainConfig(algo="bc", data=str(built.dataset_dir), out=str(work / "run"), steps=50))
    evaluation = EvaluateConfig(
        candidate=str(run.run_dir),
        data=str(built.dataset_dir),
        out=str(work / "evaluation"),
        gate=LENIENT_GATE,
    )
    run_evaluation(evaluation)
    reg = work / "registry"
    version = registry.register(reg, "feed", run=run.run_dir, report=work / "evaluation").version.version
    registry.promote(reg, "feed", version, "stable")
    return reg


def _wait_serving(target: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"the server at {target} was not SERVING within {timeout_s} s")


def _load(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "serving_load.py"), *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(target: str, pid: int, seconds: float, saturation_seconds: float) -> dict:
    """Open loop at the target rate, then closed loop; with the server's CPU per request in the open loop.

    CPU per request is the one number here that other load on the machine barely moves (latencies
    there are queueing behind whatever else runs): it says what the server costs, and 1000 / it is
    the rate one free core would sustain.
    """
    cpu_before = _cpu_s(pid)
    offered = _load("open", "--target", target, "--qps", str(TARGET_QPS), "--seconds", str(seconds))
    offered["server_cpu_ms_per_request"] = 1000.0 * (_cpu_s(pid) - cpu_before) / offered["requests"]
    saturation = _load(
        "closed", "--target", target, "--concurrency", "16", "--seconds", str(saturation_seconds)
    )
    return {"open": offered, "saturation": saturation}


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__, "serving").parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, open_broker(None, "embedded") as broker:
        work = Path(tmp)
        reg = _blessed_registry(work, broker.bootstrap_servers, settings["users"])
        topic = "bench.decisions"
        server_port, echo_port = free_port(), free_port()
        server = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("recsys-rl")),
                "serve",
                "--registry",
                str(reg),
                "--port",
                str(server_port),
                "--bootstrap-servers",
                broker.bootstrap_servers,
                "--decisions-topic",
                topic,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        echo = subprocess.Popen(
            [sys.executable, str(HERE / "serving_load.py"), "echo", "--port", str(echo_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_serving(f"127.0.0.1:{server_port}")
            served = _measure(
                f"127.0.0.1:{server_port}", server.pid, settings["seconds"], settings["saturation_seconds"]
            )
            time.sleep(0.5)  # let the echo process finish starting, if it has not yet
            echoed = _measure(
                f"127.0.0.1:{echo_port}", echo.pid, settings["seconds"], settings["saturation_seconds"]
            )
        finally:
            server.terminate()
            echo.terminate()
            server.wait(timeout=60)
            echo.wait(timeout=60)
        decisions_logged = sum(high_watermarks(broker.bootstrap_servers, topic).values())
    offered = served["open"]
    result = {
        "benchmark": "serving",
        "mode": args.mode,
        "seed": args.seed,
        "config": {**settings, "candidates": 200, "qps_offered": TARGET_QPS, "decision_logging": True},
        "p50_ms": offered["p50_ms"],
        "p99_ms": offered["p99_ms"],
        "qps_offered": offered["qps_offered"],
        "qps_achieved": offered["qps_achieved"],
        "errors": offered["errors"],
        "saturation_qps": served["saturation"]["qps_achieved"],
        "echo_qps": echoed["saturation"]["qps_achieved"],
        "echo_p99_ms": echoed["open"]["p99_ms"],
        "server_cpu_ms_per_request": offered["server_cpu_ms_per_request"],
        "echo_cpu_ms_per_request": echoed["open"]["server_cpu_ms_per_request"],
        "load_average_1m": os.getloadavg()[0],  # other work on the machine during the run
        "metrics": {"server": served, "echo": echoed, "decisions_logged": decisions_logged},
        "targets": {"p99_ms": {"min": None, "max": TARGET_P99_MS}, "errors": {"min": None, "max": 0}},
        "meets_targets": offered["p99_ms"] is not None
        and offered["p99_ms"] <= TARGET_P99_MS
        and offered["errors"] == 0,
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    print(
        f"serving: p50 {offered['p50_ms']:.2f} ms, p99 {offered['p99_ms']:.2f} ms at {TARGET_QPS:.0f} QPS "
        "offered "
        f"({offered['qps_achieved']:.0f} achieved, {offered['errors']} errors); saturation "
        f"{result['saturation_qps']:.0f} QPS vs echo {result['echo_qps']:.0f} QPS (echo p99 at "
        f"{TARGET_QPS:.0f} QPS: {echoed['open']['p99_ms']:.2f} ms); {decisions_logged} decisions logged; "
        f"CPU per request {result['server_cpu_ms_per_request']:.2f} ms (echo "
        f"{result['echo_cpu_ms_per_request']:.2f} ms); load average {result['load_average_1m']:.1f}; "
        f"target p99 <= {TARGET_P99_MS} ms -> {'met' if result['meets_targets'] else 'NOT met'}; "
        f"wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
