"""The processes a run starts, and how they end with it.

Three mechanisms, because no single one covers every way a run ends:
- `stop_tree`: the run's own process stops its descendants (SIGTERM, then SIGKILL after a
  grace period), on Ctrl-C, SIGTERM, a cancel, or an error;
- `die_with_parent`: a direct child asks the kernel for a signal when its parent dies, so a
  SIGKILLed run (which runs no code at all) still takes its children with it;
- `watch_supervisor`: a thread in a process further down the tree (a training rank, whose
  parent is DeepSpeed's launcher, not the run) that exits when the run's process is gone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

# What a supervised process reads to know whom it serves: "<pid>:<create time>", so a
# recycled pid is not mistaken for the run.
SUPERVISOR_ENV = "LLMFORGE_SUPERVISOR"
# Seconds a stopped run's processes get between SIGTERM and SIGKILL: a training rank finishes its step and
# saves a checkpoint in them (tasks/training/stop.py); the bound for a whole stop is 30 s.
STOP_GRACE_S = 25.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux; elsewhere nothing).

    Meant for `preexec_fn` or a pool initializer: the setting is per process and is not
    inherited by the process's own children.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    # The parent may already have died between fork and prctl; then nobody would signal us.
    if os.getppid() == 1:
        os.kill(os.getpid(), sig)


def descendants(pid: int | None = None, exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Every living descendant of `pid` (default: this process), without `exclude` and their subtrees."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    skip = set(exclude)
    out: list[psutil.Process] = []
    stack = [root]
    while stack:
        try:
            children = stack.pop().children()
        except psutil.NoSuchProcess:
            continue
        for child in children:
            if child.pid in skip:
                continue
            out.append(child)
            stack.append(child)
    return out


def stop_processes(procs: list[psutil.Process], grace_s: float = STOP_GRACE_S) -> list[psutil.Process]:
    """SIGTERM `procs`, SIGKILL those still alive after `grace_s`; the ones that were still alive."""
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5.0)
    return alive


def stop_tree(pid: int, grace_s: float = STOP_GRACE_S) -> None:
    """Stop process `pid` and everything under it (children listed first, so none escapes re-parenting)."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    stop_processes(descendants(pid) + [root], grace_s)


class TrackedTree:
    """The processes under `pid`, remembered as they appear (polled every `every_s`): a parent that dies first
    leaves its children to init, out of reach of `descendants` (DeepSpeed's runner dies at once on SIGTERM,
    its launcher and ranks live on to save their work), and a stop must still wait for them.

        with TrackedTree(proc.pid) as tree: ...
        stop_processes(tree.alive())
    """

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.pid, self.every_s = pid, every_s
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="tree-tracker", daemon=True)

    def _remember(self) -> None:
        for p in descendants(self.pid):
            try:
                self.seen.setdefault((p.pid, p.create_time()), p)
            except psutil.NoSuchProcess:
                continue

    def _poll(self) -> None:
        while not self._done.wait(self.every_s):
            self._remember()

    def __enter__(self) -> "TrackedTree":
        self._remember()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def alive(self) -> list[psutil.Process]:
        """Every process of the tree still running (children before the root, as `stop_tree` lists them)."""
        self._remember()
        found = list(self.seen.values())
        try:
            found.append(psutil.Process(self.pid))
        except psutil.NoSuchProcess:
            pass
        return [p for p in found if p.is_running()]


def supervisor_token(pid: int | None = None) -> str:
    """The value of SUPERVISOR_ENV naming process `pid` (default: this one)."""
    p = psutil.Process(pid)
    return f"{p.pid}:{p.create_time():.3f}"


def _alive(token: str) -> bool:
    pid_s, _, created = token.partition(":")
    try:
        p = psutil.Process(int(pid_s))
        return abs(p.create_time() - float(created)) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):
        return False


def watch_supervisor(on_lost: Callable[[], None], token: str | None = None, every_s: float = 1.0) -> bool:
    """Start a daemon thread that calls `on_lost()` and exits this process once the supervisor is gone.

    The supervisor is named by `token` or the SUPERVISOR_ENV variable; without either nothing
    is watched (False).
    """
    token = token or os.environ.get(SUPERVISOR_ENV)
    if not token:
        return False

    def watch() -> None:
        while _alive(token):
            time.sleep(every_s)
        try:
            on_lost()
        finally:
            # os._exit: the main thread may be deep in a collective that never returns.
            os._exit(143)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
    return True


def _exec_dying_with_parent(argv: list[str]) -> None:
    """`python -m infra.lifecycle.process_tree CMD...`: exec CMD with SIGTERM on our parent's death.

    The parent-death setting survives exec, so this starts any program with it without
    `preexec_fn` (unsafe to use from a threaded process).
    """
    if not argv:
        raise SystemExit("usage: python -m infra.lifecycle.process_tree COMMAND [ARG...]")
    die_with_parent(signal.SIGTERM)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    _exec_dying_with_parent(sys.argv[1:])


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def idle_cores_during(run: Callable[[], Any]) -> tuple[Any, float, int]:
    """Call `run` and return (its result, this process's CPU seconds for it, idle usable cores meanwhile + 1).

    The idle share of the usable cores is sampled over the same window (psutil's per-CPU idle
    times); the core this process used counts as free, since it mostly waits while workers run.
    """
    cores = usable_cores()
    before, wall0, cpu0 = psutil.cpu_times(percpu=True), time.perf_counter(), time.process_time()
    result = run()
    cpu, wall, after = time.process_time() - cpu0, time.perf_counter() - wall0, psutil.cpu_times(percpu=True)
    idle = sum(after[c].idle - before[c].idle for c in cores if c < len(after))
    others = idle / wall if wall > 0 else 0.0
    return result, cpu, max(1, min(len(cores), int(others + 0.5) + 1))
