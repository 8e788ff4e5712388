"""``serve --workers``: each worker's config, and pinning a process (all its threads) to one CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from recsys_rl.cli import serve
from recsys_rl.cli.main import build_parser
from recsys_rl.config import load_config
from recsys_rl.serving.settings import ServeConfig
from recsys_rl.serving.workers import WorkerError, pin_to_cpu, worker_config


def test_the_workers_are_dealt_the_cpus_in_turn():
    config = ServeConfig(worker_processes=3, metrics_port=9100)
    workers = [worker_config(config, i, 5000, [0, 3]) for i in range(3)]
    assert [w.cpu for w in workers] == [0, 3, 0]
    assert [w.metrics_port for w in workers] == [9100, 9101, 9102]
    assert {(w.port, w.reuse_port, w.worker_processes) for w in workers} == {(5000, True, 1)}


def test_without_pinning_the_workers_run_anywhere():
    config = ServeConfig(worker_processes=2, pin_workers=False)
    assert [worker_config(config, i, 5000, [0, 1]).cpu for i in range(2)] == [None, None]


@pytest.mark.parametrize(("flags", "pinned"), [((), True), (("--no-pin-workers",), False)])
def test_the_command_line_pins_the_workers_unless_told_not_to(flags, pinned):
    args = build_parser().parse_args(["serve", "--workers", "2", *flags])
    config = load_config(ServeConfig, None, {k: getattr(args, k) for k in serve._OPTIONS})
    assert (config.worker_processes, config.pin_workers) == (2, pinned)


def test_a_negative_cpu_is_refused_by_name():
    with pytest.raises(ValueError, match="cpu should be >= 0, but is -1"):
        ServeConfig(cpu=-1)


def test_a_cpu_the_process_may_not_use_is_refused_before_anything_changes():
    before = os.sched_getaffinity(0)
    with pytest.raises(WorkerError, match="cpu 100000 is not one this process may run on"):
        pin_to_cpu(100_000)
    assert os.sched_getaffinity(0) == before


def test_pinning_moves_the_threads_started_before_it_and_the_ones_started_after():
    """In a process of its own (pinning the test process would pin the rest of the suite)."""
    cpu = max(os.sched_getaffinity(0))
    script = textwrap.dedent(
        f"""
        import os, threading
        from pathlib import Path
        from recsys_rl.serving.workers import pin_to_cpu
        hold = threading.Event()
        before = threading.Thread(target=hold.wait)
        before.start()
        pin_to_cpu({cpu})
        after = threading.Thread(target=hold.wait)
        after.start()
        tasks = [int(t.name) for t in Path("/proc/self/task").iterdir()]
        print(len(tasks), sorted({{c for t in tasks for c in os.sched_getaffinity(t)}}))
        hold.set()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    threads, cpus = done.stdout.split(maxsplit=1)
    assert int(threads) == 3
    assert cpus.strip() == str([cpu])
