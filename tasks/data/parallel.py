"""The one process pool of the data stages: batches judged in worker processes, results in input order.

Workers are spawned, not forked: a stage may run inside Prefect's worker threads, and a
fork would copy the locks those threads (and pyarrow's) hold. So a script that runs a
stage with more than one worker needs the usual `if __name__ == "__main__":` guard.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

from infra.process_tree import descendants, die_with_parent, stop_processes

T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def plan_workers(n_items: int, batch_size: int, workers: int = 0, *, parallel_from: int, max_workers: int | None = None) -> int:
    """Worker processes for `n_items` items judged `batch_size` at a time; 1 means in this process.

    An explicit `workers` (> 0) is used, but never more than one per batch. With 0 (auto)
    inputs under `parallel_from` items stay in one process (a spawned worker first spends
    seconds on imports), larger ones use every usable core, at most `max_workers`.
    """
    batches = -(-n_items // batch_size)
    if workers > 0:
        return max(1, min(workers, batches))
    if n_items < parallel_from:
        return 1
    cores = usable_cores() if max_workers is None else min(usable_cores(), max_workers)
    return max(1, min(cores, batches))


def _worker_init() -> None:
    """In each pool worker: die with the stage's process, and leave Ctrl-C to it.

    A terminal's Ctrl-C reaches every process of its group; the stage's process then stops
    the pool itself, instead of each worker printing a KeyboardInterrupt traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def ordered_map(fn: Callable[..., R], jobs: Iterable[tuple[T, tuple[Any, ...]]], workers: int) -> Iterator[tuple[T, R]]:
    """Yield (tag, fn(*args)) for each (tag, args) of `jobs`, in input order.

    With `workers` > 1, `fn` (a picklable top-level function) runs in that many spawned
    processes, at most two jobs per worker in flight, so memory stays bounded however long
    the input; `tag` (e.g. the batch itself) stays in this process.
    """
    if workers <= 1:
        for tag, args in jobs:
            yield tag, fn(*args)
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init)
    finished = False
    try:
        window: deque[tuple[T, Future]] = deque()
        for tag, args in jobs:
            window.append((tag, pool.submit(fn, *args)))
            if len(window) >= 2 * workers:
                done_tag, fut = window.popleft()
                yield done_tag, fut.result()
        while window:
            done_tag, fut = window.popleft()
            yield done_tag, fut.result()
        finished = True
    finally:
        if not finished:
            # Interrupted or failed: do not wait for the batches in flight.
            worker_pids = set(getattr(pool, "_processes", None) or {})
            stop_processes([p for p in descendants() if p.pid in worker_pids], grace_s=5.0)
        pool.shutdown(cancel_futures=True)
