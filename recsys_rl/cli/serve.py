"""``recsys-rl serve``: run the gRPC server (``recsys_rl.serving.server``) until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading

from recsys_rl.cli.options import add_bootstrap_option, add_config_option, non_negative_int, positive_int
from recsys_rl.config import load_config
from recsys_rl.logs import progress_logger
from recsys_rl.processes import wait_for_stop

_OPTIONS = (
    "registry",
    "host",
    "port",
    "bootstrap_servers",
    "decisions_topic",
    "tls_cert",
    "tls_key",
    "auth_token_file",
    "feature_repo",
    "feature_profile",
    "feature_state_dir",
    "feature_warm_users",
    "redis",
    "metrics_port",
    "explore",
    "shutdown_drain_s",
    "shutdown_grace_s",
    "worker_processes",
    "pin_workers",
)


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser(
        "serve",
        help="serve Rank and Allocate over gRPC from the registry's blessed policies",
        description="Serve RankingService.Rank and AllocationService.Allocate from the registry's routing "
        "(stable, canary by a hash of the user id, shadow logged only), reloading when routing.json changes. "
        "Every decision goes to Kafka through a bounded queue; without Kafka the server still answers. "
        "Health checking and reflection (v1 and v1alpha) are on. Any ServeConfig key can come from --config.",
    )
    add_config_option(p)
    p.add_argument("--registry", metavar="DIR", help="model registry (without: the fallback policies answer)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=non_negative_int, help="port (default 50051; 0: any free port)")
    add_bootstrap_option(p, "Kafka cluster for decision logs; without it decisions are not logged")
    p.add_argument("--decisions-topic", help="topic for decision records (default recsys.decisions)")
    p.add_argument("--tls-cert", metavar="PEM", help="certificate chain; with --tls-key, TLS only")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    p.add_argument("--auth-token-file", metavar="FILE", help="token that admin RPCs need (enables them)")
    p.add_argument("--feature-repo", metavar="DIR", help="Feast repo for online user features")
    p.add_argument("--feature-profile", help="Feast profile: sqlite or redis (default sqlite)")
    p.add_argument("--feature-state-dir", metavar="DIR", help="Feast state directory (registry, SQLite)")
    p.add_argument(
        "--feature-warm-users",
        metavar="PARQUET",
        help="users to read into the feature cache before serving: a Parquet file or directory with a "
        "user_id column, e.g. a dataset's features/user_engagement (the users this server will see)",
    )
    p.add_argument("--redis", metavar="HOST:PORT", help="Redis online store for the redis profile")
    p.add_argument(
        "--metrics-port",
        type=non_negative_int,
        help="Prometheus /metrics and JSON /status port (default off; with --workers, worker i uses PORT+i)",
    )
    p.add_argument(
        "--workers",
        dest="worker_processes",
        type=positive_int,
        metavar="N",
        help="server processes sharing the port (SO_REUSEPORT), each with its own GIL: for machines with "
        "more cores, and callers that open several connections (default 1)",
    )
    p.add_argument(
        "--no-pin-workers",
        dest="pin_workers",
        action="store_const",
        const=False,
        help="with --workers, let the scheduler place the workers instead of giving each one CPU in turn",
    )
    p.add_argument(
        "--shutdown-drain-s",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, report NOT_SERVING and keep serving this long so load balancers move away "
        "(default 2)",
    )
    p.add_argument(
        "--shutdown-grace-s",
        type=float,
        metavar="SECONDS",
        help="then stop accepting and give in-flight calls this long to finish (default 5)",
    )
    p.add_argument(
        "--no-explore", dest="explore", action="store_const", const=False, help="serve each policy's mode"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from recsys_rl.serving.server import start_server
    from recsys_rl.serving.settings import ServeConfig

    config = load_config(ServeConfig, args.config, {k: getattr(args, k) for k in _OPTIONS})
    progress = progress_logger("serve")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if config.worker_processes > 1:
        from recsys_rl.serving.workers import run_workers

        code = run_workers(config, stop, lambda line: print(line, flush=True))
        print("stopped", flush=True)
        return code
    server = start_server(config)
    scheme = "grpcs" if config.tls_cert else "grpc"
    metrics = (
        f", metrics on http://{config.host}:{server.metrics_port}/metrics" if server.metrics_port else ""
    )
    print(f"serving on {scheme}://{config.host}:{server.port}{metrics}", flush=True)
    progress("serving", {"port": server.port, "registry": config.registry or "none"})
    wait_for_stop(stop)
    progress(
        "stopping",
        {
            "drain_s": config.shutdown_drain_s,
            "grace_s": config.shutdown_grace_s,
            "log_flush_s": config.log_flush_timeout_s,
        },
    )
    server.stop(config.shutdown_grace_s, config.shutdown_drain_s)
    print("stopped", flush=True)
    return 0
