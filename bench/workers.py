"""Worker processes for a benchmark's independent jobs: training runs and simulator evaluations.

The quality benchmarks spend most of their time in jobs that share nothing (a training run, a policy's
days on one world), so they run them in a pool of processes, one a core. Each worker computes on one
thread: TensorFlow's ops one at a time, numpy's BLAS and the simulator's pages too, which otherwise
start a thread a core in every worker (an evaluation alone used 1.3 cores for no shorter wall time; two
of them would fight over both). Results come back in the jobs' order and are the same as in one
process: every job is seeded.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar
from unittest import mock

import recsys_rl  # noqa: F401  first: it selects the Keras 2 API that TF-Agents needs, before TensorFlow loads
from recsys_rl.sim.simulator import THREADS_VARIABLE

K = TypeVar("K")
T = TypeVar("T")

#: Read by the BLAS and OpenMP libraries when a worker's numpy loads them, and by the simulator: one
#: thread each.
_ONE_THREAD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    THREADS_VARIABLE: "1",
}


class Workers:
    """A pool of spawned worker processes (TensorFlow does not survive a fork)."""

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self._pool = pool

    def map(self, fn: Callable[..., T], *iterables: Iterable) -> Iterator[T]:
        """``fn`` over the items, in the workers, yielding results in the items' order as they finish."""
        return self._pool.map(fn, *iterables)

    def run(self, jobs: Mapping[K, Callable[[], T]]) -> dict[K, T]:
        """Each job's result under its key. A job is a picklable call (a module-level function or a
        ``functools.partial`` of one), so a SavedModel, which does not pickle, is loaded inside the job."""
        return dict(zip(jobs, self._pool.map(operator.call, jobs.values()), strict=True))


@contextmanager
def worker_pool(processes: int | None = None) -> Iterator[Workers]:
    """``processes`` workers (one a core by default), each on one thread."""
    spawn = multiprocessing.get_context("spawn")
    # the workers start on demand while the pool is open, each copying this process's environment then
    with (
        mock.patch.dict(os.environ, _ONE_THREAD_ENV),
        ProcessPoolExecutor(
            processes or os.cpu_count() or 1, mp_context=spawn, initializer=_one_tensorflow_thread
        ) as pool,
    ):
        yield Workers(pool)


class Abandoned(Exception):
    """Raised at a task's checkpoint once the work it ran beside has failed."""


@contextmanager
def beside(task: Callable[[Callable[[], None]], T]) -> Iterator[Future[T]]:
    """``task`` in a thread while the caller works, its result in the future yielded.

    If the caller's work fails, the task stops at its next call of the checkpoint it is given (raising
    ``Abandoned``) rather than running to its end, minutes later, before the caller's error surfaces."""
    abandon = threading.Event()

    def checkpoint() -> None:
        if abandon.is_set():
            raise Abandoned("the work this task ran beside has failed")

    with ThreadPoolExecutor(1) as thread:
        future = thread.submit(task, checkpoint)
        try:
            yield future
        except BaseException:
            abandon.set()
            raise


def _one_tensorflow_thread() -> None:
    """A worker's TensorFlow runs its ops one at a time, on one thread (before it runs any)."""
    import tensorflow as tf  # recsys_rl, imported above, has chosen the Keras 2 API already

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
