"""Benchmark: the server at another revision against this checkout's, CPU a Rank request, paired.

``bench/serving.py`` compares the server with an echo server, and on this machine the echo server's own
CPU a request moves by a third between spells: a change worth a tenth of the server's CPU hides in the
spread between its runs. Here the baseline is the server itself at ``--base`` (a commit, branch or tag):
both run side by side on one embedded broker, one worker each, with decision logging on and the
fallback policies (no registry: the request path without a model's weights, the same in both), and
take the same load in turn, round after round. Each round's ratio of CPU a request (this checkout's over
the base's) compares two servers measured seconds apart; the median of the rounds' ratios is the result,
with their range.

The base is ``git archive`` of the revision, built with its own ``setup.py build_py`` (stubs included)
into a temporary directory that goes first on the base server's PYTHONPATH.

    python bench/serving_ab.py --base 898eac1 --quick
    python bench/serving_ab.py --base HEAD~3 --qps 500     # open loop at 500/s instead of closed
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import bench_parser, git_commit, write_result
from serving_rounds import interleaved, start_serve, wait_started, warm_up

from recsys_rl.kafka import open_broker
from recsys_rl.kafka.broker import free_port
from recsys_rl.kafka.topics import TopicSpec, ensure_topics

MODES = {"quick": {"rounds": 3, "slice_seconds": 3.0}, "full": {"rounds": 10, "slice_seconds": 5.0}}
ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench.ab.decisions"


def build_revision(revision: str, work: Path) -> Path:
    """``revision`` of this repository as its installed package, in ``work``; the directory to put on
    PYTHONPATH."""
    source, lib = work / "source", work / "lib"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)],
        cwd=source,
        capture_output=True,
        check=True,
    )
    # the installed checkout is an editable install, whose finder comes after PYTHONPATH: make sure
    imported = subprocess.run(
        [sys.executable, "-c", "import recsys_rl.serving.server as m; print(m.__file__)"],
        env={**os.environ, "PYTHONPATH": str(lib)},
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(imported).is_relative_to(lib):
        raise RuntimeError(f"the base server would import {imported}, not the base revision's build")
    return lib


def start_server(bootstrap_servers: str, pythonpath: Path | None) -> tuple[str, subprocess.Popen]:
    port = free_port()
    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    # run from outside this checkout: its sources must not shadow the base's
    server = start_serve(port, bootstrap_servers, TOPIC, env=env, cwd=tempfile.gettempdir())
    return f"127.0.0.1:{port}", server


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, "serving_ab")
    parser.add_argument("--base", required=True, help="the revision to compare this checkout with")
    parser.add_argument("--qps", type=float, help="open loop at this rate (default: closed loop, 16 calls)")
    args = parser.parse_args(argv)
    settings = MODES[args.mode]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, open_broker(None, "embedded") as broker:
        base_lib = build_revision(args.base, Path(tmp))
        ensure_topics(broker.bootstrap_servers, [TopicSpec(TOPIC, 1)])
        servers, processes = {}, []
        try:
            for name, pythonpath in (("base", base_lib), ("head", None)):
                target, process = start_server(broker.bootstrap_servers, pythonpath)
                processes.append(process)
                wait_started(process)
                servers[name] = (target, process.pid)
            for target, _ in servers.values():
                warm_up(target)
            runs = interleaved(servers, settings["rounds"], settings["slice_seconds"], args.qps)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=60)
    base, head = runs["base"], runs["head"]
    per_round = [
        head_slice["server_cpu_ms_per_request"] / base_slice["server_cpu_ms_per_request"]
        for head_slice, base_slice in zip(head["slices"], base["slices"], strict=True)
    ]
    result = {
        "benchmark": "serving_ab",
        "mode": args.mode,
        "seed": args.seed,
        "base_revision": args.base,
        "head_commit": git_commit(),
        "config": {**settings, "qps_offered": args.qps, "load": "open" if args.qps else "closed, 16 calls"},
        "cpu_ratio_to_base": statistics.median(per_round),
        "cpu_ratio_per_round": per_round,
        "base": base,
        "head": head,
        "wall_s": time.perf_counter() - started,
    }
    write_result(args.out, result)
    print(
        f"serving A/B against {args.base} ({result['config']['load']}, {settings['rounds']} rounds): CPU a "
        f"request {base['server_cpu_ms_per_request']:.3f} -> {head['server_cpu_ms_per_request']:.3f} ms; "
        f"per-round ratio median {result['cpu_ratio_to_base']:.3f} "
        f"({min(per_round):.3f}-{max(per_round):.3f}); "
        f"requests/s {base['qps_achieved']:.0f} -> {head['qps_achieved']:.0f}; p99 {base['p99_ms']:.2f} -> "
        f"{head['p99_ms']:.2f} ms; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
