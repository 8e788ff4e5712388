"""The benchmarks' worker pool (bench/workers.py): jobs come back under their keys, computed in other
processes on one thread each, and the benchmark's own environment is left as it was."""

from __future__ import annotations

import importlib
import math
import os
from functools import partial

import pytest
import tensorflow as tf
from bench_scripts import BENCH

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
        "tensorflow threads": tf.config.threading.get_intra_op_parallelism_threads,
        "pid": os.getpid,
    }
    with workers.worker_pool(2) as pool:
        results = pool.run(jobs)
        assert list(pool.map(math.sqrt, [9.0, 4.0])) == [3.0, 2.0]
    assert list(results) == list(jobs)
    assert results[("sum", 1)] == 3.5
    assert results["blas threads"] == "1"
    assert results["tensorflow threads"] == 1
    assert results["pid"] != os.getpid()
    assert os.environ.get(_BLAS_THREADS) == before


def test_a_failing_job_fails_the_run(workers):
    with workers.worker_pool(1) as pool, pytest.raises(ValueError, match="math domain error"):
        pool.run({"bad": partial(math.sqrt, -1.0)})
