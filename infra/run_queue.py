"""Flows of many runs (`llmforge scale`; ablations and mix searches next): a queue of launched stages, trained in
a few launches side by side, each run still an ordinary stage output.

    queue = RunQueue(ws, config.runs)                              inside the flow's parent MLflow run
    results = queue.run([Queued(Pretrain(cfg), {"tokens": ..., "tokenizer": ...}, "point 3/12 ...", cost), ...])

Every run keeps its content-addressed folder, record, MLflow run (nested under the flow's) and cache:
a finished run is reused, one whose ranks finished but whose flow stopped before recording it is
recorded without training again, and one stopped mid-way resumes from its checkpoint. What changes is
how the rest are launched:
  - runs that launch alike (same ranks, hostfile, launcher flags) form one queue (queue.json, the longest run
    first), and `slots` DeepSpeed launches side by side work through it: before each run, a launch's rank 0
    claims the next unclaimed one (tasks/training/rank.py `claimed`), so the launches finish together whatever
    each run costs, and the runner, the launcher, the interpreters and the imports start once per launch,
    not once per run;
  - each rank trains on `runs.threads` threads (OMP_NUM_THREADS); a launch is a Prefect task on the flow's
    task runner: a thread of this process by default, a Ray task on a cluster (`runs.executor: ray`,
    Prefect's Ray task runner, as the data flow's), which asks Ray for its cores and runs on whichever node
    has them;
  - rank 0 prints RUN_STARTED and RUN_DONE around each run; this side records it then (`after`, result.json,
    record) and prints "run k/n done ... ETA".
"""
from __future__ import annotations

import contextlib
import queue as queue_module
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from infra.config import StrictModel
from infra.launch.launcher import DS_INFO, launch
from infra.lifecycle.clock import clock_text
from infra.lifecycle.process_tree import usable_cores
from infra.lifecycle.signals import stop_on_cancel
from infra.stages import (LAUNCH_LOG, QUEUE_FILE, RUN_DONE, RUN_STARTED, LaunchedStage, Placed, launch_settings,
                          place, prefect_task, task_log)
from infra.workspace.atomic import write_json_atomic
from infra.tracking.runs import stage_run
from infra.workspace.lock import workspace_lock
from infra.workspace.paths import Workspace

QUEUES_DIR = ".queues"  # under the workspace (shared with a cluster's nodes): one folder per queue while it runs


class RunsConfig(StrictModel):
    """The `runs:` section: how a flow of many runs places them (infra/run_queue.py)."""

    # Each rank's threads (OMP_NUM_THREADS). One: on 2 CPU cores a tiny-family run trained about as fast on one thread
    # as on two, so two runs side by side on one each do about twice the work (BENCHMARKS.md "Flows of many runs").
    threads: int = Field(default=1, gt=0)
    # Runs in flight at once. "auto": this machine's cores // (threads x ranks per run), one at a time with a GPU;
    # on Ray, the cluster's CPUs // (threads x ranks per run).
    slots: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None  # None: a local Ray; "auto": the cluster this machine joined; "ray://head:10001"


@dataclass
class Queued:
    """One run to make: a launched stage, its inputs, a label for its lines and a cost (e.g. its steps) that
    orders the queue and times its ETA."""

    stage: LaunchedStage
    inputs: dict[str, Any]
    label: str
    cost: float = 1.0


@dataclass
class _Pending:
    index: int
    item: Queued
    placed: Placed
    job: Path | None = None


@dataclass
class Group:
    """Runs that launch alike, worked through by `launches` launches side by side, each rank on `threads` threads."""

    runs: list[_Pending]
    launches: int
    threads: int

    @property
    def cpus(self) -> int:
        """What each launch asks a Ray cluster for: its ranks' threads."""
        return self.threads * self.runs[0].item.stage.config.launch.num_procs


@dataclass
class Progress:
    """The queue's line: run k of n done, its time, the time so far and the ETA (from the costs still to run)."""

    total: int
    total_cost: float
    done: int = 0
    done_cost: float = 0.0
    started: float = field(default_factory=time.monotonic)
    log: Callable[[str], Any] = print

    def finished(self, item: Queued, note: str) -> None:
        self.done += 1
        self.done_cost += item.cost
        elapsed = time.monotonic() - self.started
        left = self.total_cost - self.done_cost
        eta = elapsed / self.done_cost * left if self.done_cost > 0 and left > 0 else 0.0
        self.log(f"run {self.done}/{self.total} {note}: {item.label} (elapsed {clock_text(elapsed)}, "
                 f"ETA {clock_text(eta)})")


def write_queue(folder: Path, runs: list[_Pending]) -> Path:
    """folder/queue.json: the runs' job.json paths, costliest first, which the launches claim one at a time
    (tasks/training/rank.py): whichever launch is free takes the next, so they finish together."""
    folder.mkdir(parents=True, exist_ok=True)
    order = sorted(runs, key=lambda r: (-r.item.cost, r.index))
    write_json_atomic(folder / QUEUE_FILE, [str(r.job) for r in order])
    return folder


class RunQueue:
    """Launched stages of one flow, trained by a few launches side by side (see the module docstring)."""

    def __init__(self, ws: Workspace, config: RunsConfig | None = None, log: Callable[[str], Any] = print) -> None:
        self.ws, self.config, self.log = ws, config or RunsConfig(), log

    def slots_for(self, num_procs: int, on_gpu: bool) -> int:
        """Runs in flight at once for runs of `num_procs` ranks per launch."""
        if self.config.slots != "auto":
            return self.config.slots
        per_run = self.config.threads * num_procs
        if self.on_ray():
            import ray

            return max(1, int(ray.cluster_resources().get("CPU", 1)) // per_run)
        return 1 if on_gpu else max(1, len(usable_cores()) // per_run)

    def on_ray(self) -> bool:
        from infra.launch.ray_cluster import on_ray_task_runner

        return self.config.executor == "ray" and on_ray_task_runner()

    def run(self, items: list[Queued]) -> list[Any]:
        """Each item's result, in order: reused, recorded, or trained here (several per launch, launches side by side)."""
        results: list[Any] = [None] * len(items)
        todo: list[_Pending] = []
        first: dict[Path, int] = {}  # out_dir -> the first item placed there
        same: dict[int, int] = {}  # an item that is an earlier one's run (the same stage and inputs) -> that one
        for i, item in enumerate(items):
            placed = place(item.stage, self.ws, **item.inputs)
            if placed.out_dir in first:
                same[i] = first[placed.out_dir]
                continue
            first[placed.out_dir] = i
            done = placed.reused()
            if done is None and placed.trained_unrecorded():
                print(f"stage {item.stage.name}: {placed.rel} finished training before the flow stopped; recording it")
                done = placed.end()
            if done is None:
                todo.append(_Pending(i, item, placed))
            else:
                results[i] = done
        if todo:
            self._train_all(todo, results)
        for i, j in same.items():
            results[i] = results[j]
        return results

    def _train_all(self, todo: list[_Pending], results: list[Any]) -> None:
        """Train the runs not reused or recorded, their results into `results`."""
        for run in todo:
            run.job = run.placed.begin()  # every MLflow run and job.json before the first launch: bad input fails now
        progress = Progress(len(todo), sum(r.item.cost for r in todo), log=self.log)
        groups = self.groups(todo)
        for group in groups:
            self.log(f"{len(group.runs)} run(s) to train in {group.launches} launch(es) side by side"
                     + (" on Ray" if self.on_ray() else "") + f", {group.threads} thread(s) per rank; each launch "
                     "takes the next run from the queue, the longest first")
        self._train(groups, results, progress)

    def groups(self, todo: list[_Pending]) -> list[Group]:
        """Runs grouped by how they launch, each group with its launches and threads."""
        import torch

        groups: dict[str, list[_Pending]] = {}
        for run in todo:
            settings = launch_settings(run.item.stage.config)
            groups.setdefault(repr((run.item.stage.rank_module, sorted(settings.items()))), []).append(run)
        out = []
        for runs in groups.values():
            procs = runs[0].item.stage.config.launch.num_procs
            launches = min(len(runs), self.slots_for(procs, torch.cuda.is_available()))
            threads = self.config.threads
            if not self.on_ray() and self.config.slots == "auto" and launches < len(usable_cores()) // procs:
                # Fewer runs than cores (a sweep's predicted run alone): the cores go to the runs there are
                # (on 2 cores the tiny sweep's predicted run took 157 s on two threads, 175 s on one).
                threads = max(threads, len(usable_cores()) // (launches * procs))
            out.append(Group(runs, launches, threads))
        return out

    def _train(self, groups: list[Group], results: list[Any], progress: Progress) -> None:
        """Start every group's launches at once on the task runner; record each run as its rank 0 says it finished."""
        finished: queue_module.Queue[_Pending] = queue_module.Queue()
        on_ray = self.on_ray()
        pending = {r.index: r for g in groups for r in g.runs}
        futures, folders = [], []
        with (ray_placement() if on_ray else contextlib.nullcontext()) as options:
            for group in groups:
                folder = write_queue(self.ws.root / QUEUES_DIR / uuid.uuid4().hex[:12], group.runs)
                folders.append(folder)
                for k in range(1, group.launches + 1):
                    stage = group.runs[0].item.stage
                    name = f"{stage.name}-launch" + (f"-{k}" if group.launches > 1 else "")
                    task = prefect_task(train_queue, name)
                    # In this process a line callback reports each run as it finishes; a Ray worker cannot call back.
                    lines = None if on_ray else _LaunchLines(group.runs, finished)
                    if hasattr(task, "submit"):
                        with options(group.cpus) if on_ray else contextlib.nullcontext():
                            futures.append(task.submit(stage, folder, group.threads, lines=lines))
                    else:  # outside a flow run: plain threads
                        futures.append(_ThreadFuture(train_queue, stage, folder, group.threads, lines=lines))
            try:
                errors = self._collect(futures, pending, finished, results, progress, on_ray)
            finally:
                for folder in folders:
                    shutil.rmtree(folder, ignore_errors=True)
        for run in sorted(pending.values(), key=lambda r: r.index):  # finished, but its line never came (Ray)
            if run.placed.trained_unrecorded():
                results[run.index] = run.placed.end()
                progress.finished(run.item, "done")
        if errors:
            raise errors[0]

    def _collect(self, futures: list[Any], pending: dict[int, _Pending], finished: queue_module.Queue,
                 results: list[Any], progress: Progress, on_ray: bool) -> list[BaseException]:
        """Record runs as they finish until every launch has ended; the launches' errors."""
        def record(run: _Pending) -> None:
            if run.index in pending:
                results[run.index] = pending.pop(run.index).placed.end()
                progress.finished(run.item, "done")

        errors: list[BaseException] = []
        open_ = list(futures)
        while open_:
            with contextlib.suppress(queue_module.Empty):
                record(finished.get(timeout=0.5))
                continue
            for future in [f for f in open_ if _future_done(f)]:
                open_.remove(future)
                try:
                    where = future.result()
                except BaseException as exc:  # noqa: BLE001 - every launch is waited for; the first error is raised
                    errors.append(exc)
                    continue
                if on_ray and where:
                    self.log(f"a launch ran on Ray node {where}")
        while not finished.empty():
            record(finished.get())
        return errors


class _LaunchLines:
    """A launch's line sink: each line into the launch.log of the run its rank 0 last started (DeepSpeed's INFO lines
    there only, the rest to the Prefect task's log too). In the flow's process, RUN_DONE also hands that run to
    the recording side (`finished`); on a Ray node there is no one to hand it to."""

    def __init__(self, runs: Sequence[_Pending] = (), finished: queue_module.Queue | None = None) -> None:
        self.by_dir = {str(r.placed.out_dir.resolve()): r for r in runs}
        self.finished, self.current = finished, None

    def __call__(self, line: str) -> None:
        if line.startswith(RUN_STARTED):
            self.current = Path(line.removeprefix(RUN_STARTED).strip())
        if self.current is not None:  # from its start to its RUN_DONE: then its folder is recorded, no more lines
            with open(self.current / LAUNCH_LOG, "a", encoding="utf-8") as file:
                file.write(line + "\n")
        if not DS_INFO.match(line):
            task_log(line)
        if line.startswith(RUN_DONE) and self.current is not None:
            run = self.by_dir.get(str(self.current))
            if run is not None and self.finished is not None:
                self.finished.put(run)
            self.current = None


def train_queue(stage: LaunchedStage, queue: Path, threads: int,
                lines: Callable[[str], Any] | None = None) -> str | None:
    """One launch whose ranks take runs from `queue` until it is empty, on `threads` threads each (a Prefect task:
    a thread of the flow, or a Ray task on a cluster's node); the node's address on Ray."""
    launch(stage.rank_module, ["--queue", str(queue)], **launch_settings(stage.config),
           env={"OMP_NUM_THREADS": str(threads)}, log=lines if lines is not None else _LaunchLines())
    return _ray_node()


def _ray_node() -> str | None:
    try:
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None
    except ImportError:
        return None


@contextlib.contextmanager
def ray_placement():
    """Ray-task options per launch: its cores (`remote_options(num_cpus=...)`), spread over the nodes."""
    from prefect_ray.context import remote_options

    from infra.launch.ray_cluster import prefect_api_for_workers

    with prefect_api_for_workers():
        yield lambda cpus: remote_options(num_cpus=cpus, scheduling_strategy="SPREAD")


def _future_done(future: Any) -> bool:
    state = getattr(future, "state", None)
    if state is not None:
        return state.is_final()
    return future.done()


class _ThreadFuture:
    """A call on a thread, with `done()` and `result()` as a Prefect future has (outside a flow run)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._call, args=(fn, args, kwargs), name="run-queue-launch", daemon=True)
        self._thread.start()

    def _call(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        try:
            self._value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


@contextlib.contextmanager
def flow_of_runs(ws: Workspace, name: str, config: Any, runs: RunsConfig, *, run_name: str,
                 run_key: str) -> Iterator[tuple[Any, RunQueue]]:
    """A flow of many runs' frame: the workspace locked, a Prefect cancel stopping every launch, the flow's parent
    MLflow run (each queued run nests under it) and its RunQueue; on Ray, every node checked to see the workspace."""
    from infra.launch.ray_cluster import check_cluster, on_ray_task_runner, prefect_api_for_workers

    on_ray = runs.executor == "ray" and on_ray_task_runner()
    with stop_on_cancel(), workspace_lock(ws), (prefect_api_for_workers() if on_ray else contextlib.nullcontext()) as api, \
            stage_run(ws, name, config, run_name=run_name, run_key=run_key) as parent:
        if on_ray:
            print(f"runs on Ray: {len(check_cluster(ws.root, api))} node(s) see the workspace {ws.root}")
        yield parent, RunQueue(ws, runs)
