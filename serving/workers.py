"""``recsys-rl serve --workers N``: N server processes sharing one port, each with its own interpreter.

One Python server process runs its handlers under one GIL, so it uses about one core however many
handler threads it has. N processes listening on the same port (SO_REUSEPORT) let the kernel spread
incoming *connections* over them: throughput scales with N while calls arrive over many connections
(a fleet of callers, or a client with several channels); the calls of one connection all go to one
process. Each worker is a complete server (its own policies, feature cache, decision-log producer and
/metrics port: metrics_port + i, or a free port each when metrics_port is 0). Unless ``pin_workers`` is
off, worker i runs on the i-th CPU the supervisor may use (in turn when there are more workers than
CPUs), as nginx's ``worker_cpu_affinity`` does: see ``pin_to_cpu`` for why and what it measured.

The supervisor writes each worker's ServeConfig as YAML, starts it as ``recsys-rl serve --config``,
waits until every worker prints its address, and on SIGTERM forwards the signal, so each worker drains,
finishes its calls and flushes its log as a single server does. A worker that exits on its own stops the
rest: the supervisor exits 1 and leaves restarting to whatever runs it (systemd, Kubernetes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from recsys_rl.errors import OperationalError
from recsys_rl.serving.settings import ServeConfig

_START_TIMEOUT_S = 300.0  # a worker loads TensorFlow and the policies before it prints its address


class WorkerError(OperationalError):
    """A worker process failed to start or exited while serving."""


def _reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) socket on ``port`` (0: a free one) that the workers can share until they
    listen: a free port chosen and released first could be taken by another program in between."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise WorkerError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock


def worker_config(config: ServeConfig, index: int, port: int, cpus: list[int]) -> ServeConfig:
    """Worker ``index``'s config; ``cpus``: those the supervisor may use, dealt out in turn."""
    metrics_port = config.metrics_port
    if metrics_port:  # None: off; 0: a free port for each
        metrics_port += index
    cpu = cpus[index % len(cpus)] if config.pin_workers else None
    return dataclasses.replace(
        config, port=port, reuse_port=True, worker_processes=1, metrics_port=metrics_port, cpu=cpu
    )


def pin_to_cpu(cpu: int) -> None:
    """Run every thread of this process, and the threads it starts later, on ``cpu`` only.

    Why: a request crosses threads inside a worker (gRPC's poller thread wakes the event loop, the
    decision log's sender takes the record). On a virtual machine a wake-up on another core costs an
    inter-processor interrupt, a trip through the hypervisor. Measured on the 2-core machine with
    bench/serving.py's set-up (the load generator and the broker on the same cores): at 1,000 Rank
    requests/s, pinned and unpinned alternated 7 times, pinned cost less CPU a request in 5 (0.86-1.40 ms
    against 0.97-1.46); in the interleaved benchmark, twice each, the server's CPU a request was 2.53
    and 2.65 times the echo server's pinned against 2.83 and 2.98 unpinned, while the saturation ratio
    stayed within the machine's noise (0.41, 0.42 pinned; 0.45, 0.43 unpinned). Less CPU a request is
    the figure other load moves least, hence the default; ``--no-pin-workers`` turns it off.
    """
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        raise WorkerError(f"cpu {cpu} is not one this process may run on ({sorted(allowed)})")
    for task in Path("/proc/self/task").iterdir():  # threads started before this call, too
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), {cpu})


def run_workers(config: ServeConfig, stop: threading.Event, announce: Callable[[str], None]) -> int:
    """Serve ``config`` from ``config.worker_processes`` processes until ``stop`` is set; the exit code."""
    reserved = _reserve_port(config.host, config.port)
    port = reserved.getsockname()[1]
    cpus = sorted(os.sched_getaffinity(0))
    workers: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="recsys-serve-") as tmp:
        try:
            addresses = []
            for index in range(config.worker_processes):
                path = Path(tmp) / f"worker-{index}.yaml"
                path.write_text(yaml.safe_dump(dataclasses.asdict(worker_config(config, index, port, cpus))))
                workers.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "recsys_rl.cli.main", "serve", "--config", str(path)],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for index, worker in enumerate(workers):
                addresses.append(_first_line(worker, index))
        except BaseException:
            _stop_all(workers, config)
            raise
        finally:
            reserved.close()  # the workers listen now (or failed): the port stays theirs
        metrics = [a.split(", metrics on ", 1)[1] for a in addresses if ", metrics on " in a]
        scheme = addresses[0].split("://", 1)[0].removeprefix("serving on ")
        line = f"serving on {scheme}://{config.host}:{port} with {len(workers)} worker processes"
        announce(line + (f", metrics on {', '.join(metrics)}" if metrics else ""))
        while not stop.wait(0.5):
            exited = [(i, w.returncode) for i, w in enumerate(workers) if w.poll() is not None]
            if exited:
                _stop_all(workers, config)
                raise WorkerError(
                    "worker "
                    + ", ".join(f"{i} exited with {code}" for i, code in exited)
                    + "; stopped the rest"
                )
        return _stop_all(workers, config)


def _first_line(worker: subprocess.Popen, index: int) -> str:
    """The worker's "serving on ..." line; WorkerError if it exits (or says nothing) first."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(worker.stdout.readline()), daemon=True)
    reader.start()
    reader.join(_START_TIMEOUT_S)
    if not found or not found[0].startswith("serving on "):
        code = worker.poll()
        why = f"exited with {code}" if code is not None else f"did not start within {_START_TIMEOUT_S:.0f} s"
        raise WorkerError(f"worker {index} {why} (its error is above)")
    return found[0].strip()


def _stop_all(workers: list[subprocess.Popen], config: ServeConfig) -> int:
    """SIGTERM every worker still running and wait for each; 0 when every one stopped cleanly."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    bound = config.shutdown_drain_s + config.shutdown_grace_s + config.log_flush_timeout_s + 30.0
    codes = []
    for worker in workers:
        try:
            codes.append(worker.wait(bound))
        except subprocess.TimeoutExpired:
            worker.kill()
            codes.append(worker.wait())
    return 0 if all(code == 0 for code in codes) else 1
