"""The serving benchmark's load generator and its bare echo server, each run as its own process.

The load generator offers requests open-loop (on a fixed schedule, whether or not earlier ones have
answered: a slow server cannot slow the offered load down and hide its own latency) or closed-loop
(a fixed number of requests in flight, to find the saturation rate). It prints one JSON line.

The echo server answers Rank with an empty response: the cost of gRPC and protobuf alone on this
machine, the baseline the real server is read against.

    python bench/serving_load.py open --target HOST:PORT --qps 500 --seconds 10 --candidates 200
    python bench/serving_load.py closed --target HOST:PORT --concurrency 16 --seconds 5 --candidates 200
    python bench/serving_load.py echo --port PORT [--aio]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from concurrent import futures

import grpc
import numpy as np

from recsys_rl import contracts, signals
from recsys_rl.proto import serving_pb2_grpc

REQUEST_POOL = (
    64  # distinct prebuilt requests, cycled: building 200 candidates per call would load the client
)


def requests(candidates: int, seed: int) -> list[contracts.RankRequest]:
    """Feed requests with ``candidates`` candidates and typical per-signal predictions."""
    rng = np.random.default_rng(seed)
    scale = np.array([13.0, 0.45, 0.014, 0.0005, 0.0028, 0.0011, 0.00035])
    pool = []
    for i in range(REQUEST_POOL):
        request = contracts.RankRequest(
            schema_version=1,
            request_id=f"bench-{seed}-{i}",
            user_id=f"u{rng.integers(1_000_000)}",
            prediction_names=list(signals.FEED_SIGNALS),
            page_size=6,
        )
        request.context.event_time_ms = 1_760_000_000_000 + i
        request.context.page_index = int(rng.integers(5))
        request.context.session_id = f"s{i}"
        predictions = rng.gamma(2.0, scale / 2.0, size=(candidates, len(scale)))
        for j in range(candidates):
            candidate = request.candidates.add(
                item_id=f"v{i}-{j}", author_id=f"a{j % 50}", item_type=contracts.ITEM_TYPES["video"]
            )
            candidate.predictions.extend(predictions[j].tolist())
        pool.append(request)
    return pool


async def _call(stub, request, deadline_s: float) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
        await stub.Rank(request, timeout=deadline_s)
        ok = True
    except grpc.aio.AioRpcError:
        ok = False
    return time.perf_counter() - started, ok


@contextlib.asynccontextmanager
async def _stubs(target: str, channels: int, pool, deadline_s: float):
    """``channels`` stubs, each on its own connection, all connected before the clock starts.

    Production traffic arrives over many connections; a server that spreads connections over worker
    processes (SO_REUSEPORT) is only exercised by a client that opens more than one.
    """
    async with contextlib.AsyncExitStack() as stack:
        stubs = []
        for _ in range(channels):
            # each channel with its own subchannel pool: gRPC would otherwise share one connection
            options = [("grpc.use_local_subchannel_pool", 1)]
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(target, options=options))
            stubs.append(serving_pb2_grpc.RankingServiceStub(channel))
        for stub in stubs:
            await _call(stub, pool[0], deadline_s)
        yield stubs


async def open_loop(
    target: str, qps: float, seconds: float, pool, deadline_s: float, channels: int = 1
) -> dict:
    async with _stubs(target, channels, pool, deadline_s) as stubs:
        total = int(qps * seconds)
        cpu_start, start = time.process_time(), time.perf_counter()
        tasks = []
        for i in range(total):
            delay = start + i / qps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            stub = stubs[i % channels]
            tasks.append(asyncio.ensure_future(_call(stub, pool[i % len(pool)], deadline_s)))
        results = await asyncio.gather(*tasks)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return _summary(results, elapsed, cpu, offered=qps)


async def closed_loop(
    target: str, concurrency: int, seconds: float, pool, deadline_s: float, channels: int = 1
) -> dict:
    async with _stubs(target, channels, pool, deadline_s) as stubs:
        results: list[tuple[float, bool]] = []
        stop = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            i = offset
            while time.perf_counter() < stop:
                # every call on the next connection: with more connections than calls in flight, all of
                # them carry load, as they do in the open loop
                results.append(await _call(stubs[i % channels], pool[i % len(pool)], deadline_s))
                i += concurrency

        cpu_start, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return _summary(results, elapsed, cpu, offered=None)


def _summary(results: list[tuple[float, bool]], elapsed: float, cpu: float, offered: float | None) -> dict:
    latencies = np.array([latency for latency, ok in results if ok]) * 1000.0
    errors = sum(not ok for _, ok in results)
    return {
        "requests": len(results),
        "errors": errors,
        "qps_offered": offered,
        "qps_achieved": (len(results) - errors) / elapsed,
        "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
        "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
        # the generator's own CPU: what it takes from the machine the server shares
        "client_cpu_ms_per_request": 1000.0 * cpu / max(len(results), 1),
        "elapsed_s": elapsed,
        "client_cpu_s": cpu,
        # every answered call's latency, for a caller that pools several runs (bench/serving.py)
        "latencies_ms": latencies.tolist(),
    }


def _empty_response(request: contracts.RankRequest) -> contracts.RankResponse:
    return contracts.RankResponse(schema_version=1, request_id=request.request_id)


class _Echo(serving_pb2_grpc.RankingServiceServicer):
    def Rank(self, request, context):  # the gRPC method name
        return _empty_response(request)


class _AsyncEcho(serving_pb2_grpc.RankingServiceServicer):
    async def Rank(self, request, context):
        return _empty_response(request)


async def _async_echo(port: int) -> None:
    server = grpc.aio.server()
    serving_pb2_grpc.add_RankingServiceServicer_to_server(_AsyncEcho(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def echo(port: int, use_aio: bool) -> None:
    """The echo server: on a thread pool (the baseline the serving targets were set against), or on
    grpc.aio, the server model of recsys-rl serve (gRPC and protobuf alone as the real server uses them)."""
    if use_aio:
        asyncio.run(_async_echo(port))
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    serving_pb2_grpc.add_RankingServiceServicer_to_server(_Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_subparsers(dest="mode", required=True)
    for name in ("open", "closed"):
        p = mode.add_parser(name)
        p.add_argument("--target", required=True)
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--candidates", type=int, default=200)
        p.add_argument("--deadline-s", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--channels", type=int, default=1, help="connections to spread the calls over")
        if name == "open":
            p.add_argument("--qps", type=float, default=500.0)
        else:
            p.add_argument("--concurrency", type=int, default=16)
    echo_parser = mode.add_parser("echo")
    echo_parser.add_argument("--port", type=int, required=True)
    echo_parser.add_argument("--aio", action="store_true", help="on grpc.aio instead of a thread pool")
    args = parser.parse_args(argv)
    if args.mode == "echo":
        echo(args.port, args.aio)
        return 0
    pool = requests(args.candidates, args.seed)
    if args.mode == "open":
        result = asyncio.run(
            open_loop(args.target, args.qps, args.seconds, pool, args.deadline_s, args.channels)
        )
    else:
        result = asyncio.run(
            closed_loop(args.target, args.concurrency, args.seconds, pool, args.deadline_s, args.channels)
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
