"""The one worker pool of the data stages: batches judged by workers, results in input order.

    for tag, result in ordered_map(fn, jobs, workers, n_jobs=len_of_jobs): ...

`workers` > 0 means that many workers. `workers` 0 (auto) decides from measurement, so a
stage is never slower than one process: the first jobs run in this process (their CPU
seconds and the machine's idle cores are measured meanwhile); if the rest of the work could
pay for starting workers, one real job goes to a single probe worker while this process goes
on, and that worker's start-up CPU seconds (spawn + imports) decide how many workers, if any,
the remaining jobs get (`choose_workers`, a pure function of those numbers).

Where the workers run: spawned local processes, or Ray tasks spread over the cluster when the
stage itself runs inside Ray (the data flow under `data.executor=ray`: every stage is a Ray
task, `current_executor`); `executor=` says it explicitly.

Local workers are spawned, not forked: a stage may run inside Prefect's worker threads, and
a fork would copy the locks those threads (and pyarrow's) hold. So a script that runs a
stage with more than one worker needs the usual `if __name__ == "__main__":` guard.
"""
from __future__ import annotations

import importlib
import multiprocessing
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from infra.lifecycle.process_tree import descendants, die_with_parent, idle_cores_during, stop_processes

# ray and prefect_ray are imported only with data.executor=ray: the optional extra `pip install -e '.[ray]'`.

T = TypeVar("T")
R = TypeVar("R")
Executor = Literal["local", "ray"]

# In-process jobs run in auto mode before deciding: at least one, until this much wall time,
# so the idle-core sample spans a few scheduler ticks.
MEASURE_S = 0.25
# The least start-up a worker can cost (CPU seconds): a bare interpreter with this package's
# imports. Below the work this could save, no probe worker is started at all.
MIN_START_CPU_S = 0.25
# Jobs in flight per worker: one running, one queued, so a worker never waits for the next.
IN_FLIGHT_PER_WORKER = 2


def plan_workers(n_items: int, batch_size: int, workers: int = 0, *, parallel_from: int | None = None,
                 max_workers: int | None = None) -> int:
    """The `workers` argument of `ordered_map` for `n_items` items judged `batch_size` at a time.

    An explicit `workers` (> 0) is used, but never more than one per batch; one batch is 1
    (this process); otherwise 0: auto, decided by `ordered_map` from measured costs.
    `parallel_from` is accepted for older callers and ignored: the decision is measured at run time.
    `max_workers` bounds an explicit count (give it to ordered_map too, to bound auto).
    """
    batches = -(-n_items // batch_size)
    if workers > 0:
        return max(1, min(workers, batches, max_workers or workers))
    return 1 if batches <= 1 else 0


def current_executor() -> Executor:
    """'ray' when this process is connected to Ray (a stage running as a Ray task, or its driver), else 'local'.

    Ray is only ever imported by the data flow under `data.executor=ray`; a process that never
    imported it runs its jobs locally.
    """
    ray = sys.modules.get("ray")
    return "ray" if ray is not None and ray.is_initialized() else "local"


@dataclass
class WorkerPlan:
    """How `ordered_map` ran its jobs, with the numbers the choice came from."""

    workers: int  # workers the remaining jobs used; 1 = this process only
    executor: Executor
    reason: str
    job_cpu_s: float | None = None  # measured CPU seconds of one job in this process
    start_cpu_s: float | None = None  # measured CPU seconds to start one worker (spawn + imports)
    idle_cores: int | None = None  # cores free for workers (this one included) when measured
    jobs: int = 0
    in_process: int = 0  # jobs run in this process (the measuring ones, or all)
    nodes: dict[str, int] = field(default_factory=dict)  # Ray node id -> jobs it ran

    def describe(self) -> str:
        nums = [f"{k}={v:.3g}" for k, v in (("job_cpu_s", self.job_cpu_s), ("start_cpu_s", self.start_cpu_s))
                if v is not None]
        if self.idle_cores is not None:
            nums.append(f"idle_cores={self.idle_cores}")
        return f"workers={self.workers} ({self.executor}): {self.reason}" + (f" [{', '.join(nums)}]" if nums else "")


def choose_workers(job_cpu_s: float, jobs_left: int, start_cpu_s: float, idle_cores: int,
                   max_workers: int | None = None) -> tuple[int, str]:
    """Workers for `jobs_left` jobs of `job_cpu_s` CPU seconds each; 1 = stay in this process.

    k workers finish in about start + left*job/k seconds; that choice is taken only when the
    wall time it saves beats the CPU seconds spent starting them (k * start), and k never
    exceeds the idle cores, the jobs left or `max_workers`.
    """
    serial = job_cpu_s * jobs_left
    limit = min(idle_cores, jobs_left, max_workers or idle_cores)
    best, best_net = 1, 0.0
    for k in range(2, limit + 1):
        saved = serial - (start_cpu_s + serial / k)
        net = saved - k * start_cpu_s
        if net > best_net:
            best, best_net = k, net
    if limit < 2:
        return 1, f"{idle_cores} idle core(s) for {jobs_left} job(s) left: one process"
    if best == 1:
        return 1, (f"{serial:.2f} CPU s left would not pay for starting workers at {start_cpu_s:.2f} CPU s each: "
                   "one process")
    return best, f"{serial:.2f} CPU s left over {best} workers saves {best_net:.2f} s net of their start-up"


def _worker_init() -> None:
    """In each pool worker: die with the stage's process, and leave Ctrl-C to it.

    A terminal's Ctrl-C reaches every process of its group; the stage's process then stops
    the pool itself, instead of each worker printing a KeyboardInterrupt traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def _by_name(fn: Callable) -> Callable | tuple[str, str]:
    """A top-level function as (module, name), so the worker's import of it is timed; others as themselves."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in name:
        return module, name
    return fn


def _timed_job(fn: Callable | tuple[str, str], args: tuple, on_ray: bool) -> tuple[Any, float, float, str]:
    """Run one job in a worker: (result, start-up CPU s, job CPU s, Ray node id or '').

    Start-up is the process's whole CPU so far for a fresh local worker (interpreter, spawn,
    imports), and the import of the job's module for a pooled Ray worker.
    """
    t0 = time.process_time()
    if isinstance(fn, tuple):
        obj: Any = importlib.import_module(fn[0])
        for part in fn[1].split("."):
            obj = getattr(obj, part)
        fn = obj
    t1 = time.process_time()
    result = fn(*args)
    node = ""
    if on_ray:
        import ray

        node = ray.get_runtime_context().get_node_id()
    return result, (t1 - t0) if on_ray else t1, time.process_time() - t1, node


class _Local:
    """Spawned worker processes."""

    def __init__(self, workers: int):
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_worker_init)

    def submit(self, fn: Any, args: tuple) -> Future:
        return self.pool.submit(_timed_job, fn, args, False)

    @staticmethod
    def done(handle: Future) -> bool:
        return handle.done()

    @staticmethod
    def get(handle: Future) -> tuple:
        return handle.result()

    def close(self, finished: bool) -> None:
        if not finished:
            # Interrupted or failed: do not wait for the batches in flight.
            worker_pids = set(getattr(self.pool, "_processes", None) or {})
            stop_processes([p for p in descendants() if p.pid in worker_pids], grace_s=5.0)
        self.pool.shutdown(cancel_futures=True)


class _Ray:
    """Ray tasks, one CPU each, spread over the cluster's nodes."""

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self.remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD", max_retries=0)(_timed_job)
        self.pending: set[Any] = set()

    def submit(self, fn: Any, args: tuple) -> Any:
        ref = self.remote.remote(fn, args, True)
        self.pending.add(ref)
        return ref

    def done(self, handle: Any) -> bool:
        ready, _ = self.ray.wait([handle], timeout=0)
        return bool(ready)

    def get(self, handle: Any) -> tuple:
        self.pending.discard(handle)
        return self.ray.get(handle)

    def close(self, finished: bool) -> None:
        if not finished:
            for ref in self.pending:
                try:
                    self.ray.cancel(ref, force=True)
                except Exception:  # already finished or its worker gone: nothing left to stop
                    pass


def _runner(executor: Executor, workers: int) -> _Local | _Ray:
    return _Ray() if executor == "ray" else _Local(workers)


def _ray_idle_cores() -> int:
    """CPUs of the Ray cluster free now, plus the one this stage's task holds (it waits while jobs run)."""
    import ray

    return max(1, int(ray.available_resources().get("CPU", 0)) + 1)


class MappedJobs(Generic[T, R]):
    """The iterator `ordered_map` returns; `plan` says how its jobs ran (final once it is exhausted)."""

    def __init__(self, fn: Callable[..., R], jobs: Iterable[tuple[T, tuple[Any, ...]]], workers: int,
                 n_jobs: int | None, max_workers: int | None, executor: Executor | None, label: str):
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = chosen from measured cost), got {workers}")
        self.fn, self.jobs, self.label = fn, iter(jobs), label or getattr(fn, "__name__", "jobs")
        self.n_jobs = n_jobs if n_jobs is not None else (len(jobs) if isinstance(jobs, Sized) else None)
        self.max_workers = max_workers
        executor = executor or current_executor()
        self.plan = WorkerPlan(workers=workers or 1, executor=executor, reason="")
        self.requested = workers
        self._iter = self._run()

    def __iter__(self) -> "MappedJobs[T, R]":
        return self

    def __next__(self) -> tuple[T, R]:
        return next(self._iter)

    def _say(self) -> None:
        print(f"{self.label}: {self.plan.describe()}", flush=True)

    def _run(self) -> Iterator[tuple[T, R]]:
        plan = self.plan
        if self.requested == 1:
            plan.reason = "one process requested"
            yield from self._in_process(self.jobs)
            return
        window: deque[tuple[T, Any, bool]] = deque()  # (tag, result or handle, is_handle)
        if self.requested > 1:
            plan.reason = "requested"
            self._say()
            yield from self._pooled(self.requested, window)
            return
        yield from self._auto(window)

    def _in_process(self, jobs: Iterator[tuple[T, tuple]]) -> Iterator[tuple[T, R]]:
        for tag, args in jobs:
            self.plan.jobs += 1
            self.plan.in_process += 1
            yield tag, self.fn(*args)

    def _auto(self, window: deque) -> Iterator[tuple[T, R]]:
        plan, fn = self.plan, self.fn
        # 1. The first jobs here: their CPU cost and the idle cores meanwhile.
        cpu_s, idle, done, started = 0.0, None, 0, time.perf_counter()
        while done == 0 or time.perf_counter() - started < MEASURE_S:
            job = next(self.jobs, None)
            if job is None:
                plan.reason = f"all {done} job(s) ran while measuring"
                return
            tag, args = job
            result, cpu, cores = idle_cores_during(lambda: fn(*args))
            idle = cores if idle is None else min(idle, cores)
            cpu_s += cpu
            done += 1
            plan.jobs += 1
            plan.in_process += 1
            yield tag, result
        plan.job_cpu_s = cpu_s / done
        plan.idle_cores = _ray_idle_cores() if plan.executor == "ray" else idle
        left = None if self.n_jobs is None else self.n_jobs - done
        if left is None:
            plan.reason = "number of jobs unknown (pass n_jobs): one process"
            self._say()
            yield from self._in_process(self.jobs)
            return
        # 2. Could workers pay off even if they started as cheaply as possible? If not, stay here.
        workers, plan.reason = choose_workers(plan.job_cpu_s, left, MIN_START_CPU_S, plan.idle_cores, self.max_workers)
        if workers == 1:
            self._say()
            yield from self._in_process(self.jobs)
            return
        # 3. One real job on one probe worker measures the start-up; this process keeps going meanwhile.
        job = next(self.jobs, None)
        if job is None:
            return
        probe = _runner(plan.executor, 1)
        finished = False
        try:
            handle = probe.submit(_by_name(fn), job[1])
            window.append((job[0], handle, True))
            plan.jobs += 1
            while not probe.done(handle):
                nxt = next(self.jobs, None)
                if nxt is None:
                    break
                plan.jobs += 1
                plan.in_process += 1
                window.append((nxt[0], fn(*nxt[1]), False))
            result, start_cpu, _, node = probe.get(handle)
            window[0] = (window[0][0], result, False)
            self._count_node(node)
            plan.start_cpu_s = start_cpu
            left = self.n_jobs - plan.jobs
            workers, plan.reason = choose_workers(plan.job_cpu_s, left, start_cpu, plan.idle_cores, self.max_workers)
            finished = True
        finally:
            probe.close(finished)
        while window:  # everything up to here has its result
            tag, result, _ = window.popleft()
            yield tag, result
        plan.workers = workers
        self._say()
        if workers == 1:
            yield from self._in_process(self.jobs)
        else:
            yield from self._pooled(workers, window)

    def _count_node(self, node: str) -> None:
        if node:
            self.plan.nodes[node] = self.plan.nodes.get(node, 0) + 1

    def _pooled(self, workers: int, window: deque) -> Iterator[tuple[T, R]]:
        plan = self.plan
        plan.workers = workers
        runner = _runner(plan.executor, workers)
        finished = False
        target = _by_name(self.fn)
        try:
            for tag, args in self.jobs:
                window.append((tag, runner.submit(target, args), True))
                plan.jobs += 1
                if len(window) >= IN_FLIGHT_PER_WORKER * workers:
                    yield self._take(runner, window)
            while window:
                yield self._take(runner, window)
            finished = True
        finally:
            runner.close(finished)
            if plan.nodes:
                print(f"{self.label}: {plan.jobs - plan.in_process} job(s) on Ray nodes {dict(sorted(plan.nodes.items()))}",
                      flush=True)

    def _take(self, runner: _Local | _Ray, window: deque) -> tuple[T, R]:
        tag, handle, _ = window.popleft()
        result, _, _, node = runner.get(handle)
        self._count_node(node)
        return tag, result


def ordered_map(fn: Callable[..., R], jobs: Iterable[tuple[T, tuple[Any, ...]]], workers: int = 0, *,
                n_jobs: int | None = None, max_workers: int | None = None, executor: Executor | None = None,
                label: str = "") -> MappedJobs[T, R]:
    """Yield (tag, fn(*args)) for each (tag, args) of `jobs`, in input order.

    `workers` > 1: `fn` (a picklable top-level function) runs on that many workers, at most
    two jobs per worker in flight, so memory stays bounded however long the input; `tag`
    (e.g. the batch itself) stays in this process. 1: all in this process. 0: chosen from
    measured cost (module docstring), needing `n_jobs` (the number of jobs, when `jobs` has
    no len) and bounded by `max_workers`. `executor` None: `current_executor()`. The
    returned iterator's `plan` (a WorkerPlan) says what was chosen and why; the choice is
    also printed with its numbers, prefixed by `label` (default: fn's name).
    """
    return MappedJobs(fn, jobs, workers, n_jobs, max_workers, executor, label)
