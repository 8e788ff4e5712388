"""The benchmarks' worker pool (bench/workers.py): jobs come back under their keys, computed in other
processes on one thread each, and the benchmark's own environment is left as it was."""

from __future__ import annotations

import importlib
import math
import os
import time
from functools import partial

import pytest
import tensorflow as tf
from bench_scripts import BENCH

from recsys_rl.sim.simulator import THREADS_VARIABLE

_BLAS_THREADS = "OPENBLAS_NUM_THREADS"


@pytest.fixture
def workers(monkeypatch):
    # imported under its own name, as the benchmarks do: a spawned worker finds it there by the same path
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("workers")


@pytest.mark.parametrize("before", [None, "7"])
def test_jobs_run_in_single_threaded_workers_and_come_back_under_their_keys(workers, monkeypatch, before):
    if before is None:
        monkeypatch.delenv(_BLAS_THREADS, raising=False)
    else:
        monkeypatch.setenv(_BLAS_THREADS, before)
    jobs = {
        ("sum", 1): partial(math.fsum, [1.0, 2.5]),
        "blas threads": partial(os.getenv, _BLAS_THREADS),
        "simulator threads": partial(os.getenv, THREADS_VARIABLE),  # read by every Simulator it makes
        "tensorflow threads": tf.config.threading.get_intra_op_parallelism_threads,
        "pid": os.getpid,
    }
    with workers.worker_pool(2) as pool:
        results = pool.run(jobs)
        assert list(pool.map(math.sqrt, [9.0, 4.0])) == [3.0, 2.0]
    assert list(results) == list(jobs)
    assert results[("sum", 1)] == 3.5
    assert results["blas threads"] == "1"
    assert results["simulator threads"] == "1"
    assert results["tensorflow threads"] == 1
    assert results["pid"] != os.getpid()
    assert os.environ.get(_BLAS_THREADS) == before


def test_a_failing_job_fails_the_run(workers):
    with workers.worker_pool(1) as pool, pytest.raises(ValueError, match="math domain error"):
        pool.run({"bad": partial(math.sqrt, -1.0)})


def test_a_task_beside_failing_work_stops_at_its_next_checkpoint(workers):
    rounds: list[int] = []

    def search(checkpoint):
        for i in range(1000):
            checkpoint()
            rounds.append(i)
            time.sleep(0.005)  # a round's jobs; 1000 of them are 5 s that a failed run should not wait
        return len(rounds)

    with pytest.raises(ValueError, match="the dataset's build failed"), workers.beside(search) as searched:
        while not rounds:
            time.sleep(0.001)
        raise ValueError("the dataset's build failed")
    assert isinstance(searched.exception(), workers.Abandoned)
    assert len(rounds) < 1000


def test_a_task_beside_work_that_succeeds_runs_to_its_end(workers):
    def search(checkpoint):
        for _ in range(3):
            checkpoint()
        return "found"

    with workers.beside(search) as searched:
        pass
    assert searched.result() == "found"
