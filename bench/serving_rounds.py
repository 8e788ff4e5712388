"""The serving benchmarks' servers in turn: ``recsys-rl serve`` started for a benchmark, the load
generator (``serving_load.py``) run against each server for a slice of seconds, the servers' CPU over
each slice read from /proc, and each server's slices pooled.

Taking the servers in turn, round after round, puts a slow spell of this machine on all of them alike;
``bench/serving.py`` (the server against echo servers) and ``bench/serving_ab.py`` (the server at two
revisions) both measure this way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
#: Connections, opened anew each slice. The kernel spreads connections (by a hash), not calls, over the
#: worker processes: with 16 the busiest of two workers took 51-75% of their CPU in a slice, and the
#: slice at 75% had p99 60 ms at 1,000/s; with 64, 50-64% at 1,000/s, up to 65% in a closed-loop slice
#: (each slice's ``busiest_worker_share``).
CHANNELS = 64


def start_serve(port: int, bootstrap_servers: str, topic: str, *flags: str, **popen: Any) -> subprocess.Popen:
    """``recsys-rl serve`` on ``port``, logging its decisions to ``topic``, with more ``flags``; its
    address line comes on stdout (``wait_started``)."""
    command = [str(Path(sys.executable).with_name("recsys-rl")), "serve", "--port", str(port)]
    command += ["--bootstrap-servers", bootstrap_servers, "--decisions-topic", topic, *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, **popen)


def wait_started(server: subprocess.Popen) -> None:
    """Until ``recsys-rl serve`` prints its address: all its worker processes are serving then."""
    line = server.stdout.readline()
    if not line.startswith("serving on "):
        raise RuntimeError(f"the server did not start (exit code {server.wait()})")


def warm_up(target: str) -> None:
    """A short closed loop on every connection first: first calls load code and fill caches."""
    _load("closed", "--target", target, "--concurrency", "16", "--seconds", "2", "--channels", str(CHANNELS))


def _load(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "serving_load.py"), *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cpu_s(pid: int) -> dict[str, float]:
    """User plus system CPU seconds so far of process ``pid`` (key "self") and of each of its children
    (key: their pid), from Linux /proc."""

    def stat(path: Path) -> list[str]:
        return path.read_text().rsplit(")", 1)[1].split()

    out = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat(path)
        except OSError:  # the process exited while we looked
            continue
        if path.parent.name == str(pid) or fields[1] == str(pid):  # fields[1]: the parent's pid
            key = "self" if path.parent.name == str(pid) else path.parent.name
            out[key] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _busiest_worker_share(used: dict[str, float]) -> float | None:
    """The busiest worker's share of the workers' CPU over a slice (None with fewer than two workers):
    the kernel spreads connections, not calls, over the workers, so a slice's new connections can load
    one worker with more than its share, and that worker's queue sets the tail."""
    workers = [cpu for key, cpu in used.items() if key != "self"]
    return max(workers) / sum(workers) if len(workers) > 1 and sum(workers) > 0 else None


def _slice(target: str, pid: int, seconds: float, qps: float | None) -> dict:
    """One run of the load generator, open loop at ``qps`` or (None) closed loop with 16 calls in flight
    over the connections, with the server's CPU seconds over it."""
    loop = ("open", "--qps", str(qps)) if qps is not None else ("closed", "--concurrency", "16")
    before = _cpu_s(pid)
    result = _load(*loop, "--target", target, "--seconds", str(seconds), "--channels", str(CHANNELS))
    used = {key: cpu - before.get(key, 0.0) for key, cpu in _cpu_s(pid).items()}
    result["server_cpu_s"] = sum(used.values())
    result["busiest_worker_share"] = _busiest_worker_share(used)
    return result


def _pooled(slices: list[dict]) -> dict:
    """One server's slices of a phase as one run: its latencies pooled, its requests and CPU summed.

    CPU per request is the one number here that other load on the machine barely moves (latencies
    there are queueing behind whatever else runs): it says what the server costs, and 1000 / it is
    the rate one free core would sustain.
    """
    latencies = np.concatenate([np.asarray(s["latencies_ms"], float) for s in slices])
    requests, errors = sum(s["requests"] for s in slices), sum(s["errors"] for s in slices)
    return {
        "requests": requests,
        "errors": errors,
        "qps_offered": slices[0]["qps_offered"],
        "qps_achieved": (requests - errors) / sum(s["elapsed_s"] for s in slices),
        "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
        "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
        "client_cpu_ms_per_request": 1000.0 * sum(s["client_cpu_s"] for s in slices) / requests,
        "server_cpu_ms_per_request": 1000.0 * sum(s["server_cpu_s"] for s in slices) / requests,
        "slices": [
            {
                **{k: s[k] for k in ("qps_achieved", "p99_ms", "busiest_worker_share")},
                "server_cpu_ms_per_request": 1000.0 * s["server_cpu_s"] / max(s["requests"], 1),
            }
            for s in slices
        ],
    }


def interleaved(
    servers: dict[str, tuple[str, int]], rounds: int, seconds: float, qps: float | None = None
) -> dict[str, dict]:
    """Each of ``servers`` (name -> (target, pid)) in turn, ``rounds`` times: a slow spell of the
    machine falls on all of them alike."""
    slices: dict[str, list[dict]] = {name: [] for name in servers}
    for _ in range(rounds):
        for name, (target, pid) in servers.items():
            slices[name].append(_slice(target, pid, seconds, qps))
    return {name: _pooled(taken) for name, taken in slices.items()}
