"""A watch on a launch's ranks: one silent past a timeout ends the launch, named.

A rank stopped (SIGSTOP, a debugger), deadlocked or waiting forever on a lost peer prints
nothing and never exits, and the launch would wait with it. The heartbeat is the CPU time a
rank and its children use, read from the kernel: it needs no code in the ranks, and a rank
that is computing, building its op (ninja and the compiler are its children) or
busy-waiting in a shared-memory all-reduce keeps using CPU. A rank silent for `timeout_s`
(under 1% of a core of CPU over that time: polling threads still use a trickle) is killed,
with its process tree, and the launch reports it. Only this machine's ranks are watched.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil

from infra.lifecycle.process_tree import descendants, stop_tree

DEFAULT_TIMEOUT_S = 1800.0
# A rank using less than this share of one core over the timeout counts as silent.
_MIN_CPU_SHARE = 0.01
_MIN_CPU_S = 0.05


@dataclass
class _Heartbeat:
    pid: int
    mark_t: float
    mark_cpu: float


def _cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of `proc` and its living descendants (ended children count through `children_*`)."""
    total = 0.0
    for p in [proc, *descendants(proc.pid)]:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def rank_processes(launcher_pid: int) -> dict[int, psutil.Process]:
    """The ranks under the launcher: the topmost descendant of each RANK value (its children inherit it)."""
    ranks: dict[int, psutil.Process] = {}
    for proc in descendants(launcher_pid):  # parents come before their children
        try:
            rank = proc.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if rank is not None and rank.isdigit() and int(rank) not in ranks:
            ranks[int(rank)] = proc
    return ranks


class RankWatch:
    """A daemon thread that polls the ranks under `launcher_pid`; `silent` says which one ended the launch."""

    def __init__(self, launcher_pid: int, timeout_s: float, poll_s: float | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}; pass None to watch no rank")
        self.launcher_pid = launcher_pid
        self.timeout_s = float(timeout_s)
        self.poll_s = poll_s if poll_s is not None else max(0.2, min(5.0, timeout_s / 10))
        self.min_cpu_s = max(_MIN_CPU_S, _MIN_CPU_SHARE * timeout_s)
        self.silent: str | None = None
        self._done = threading.Event()
        self._beats: dict[int, _Heartbeat] = {}
        self._thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)

    def __enter__(self) -> RankWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=self.poll_s + 1)

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            found = self.check(time.monotonic())
            if found is not None:
                rank, proc, why = found
                self.silent = (f"rank {rank} (pid {proc.pid}) was silent for {self.timeout_s:.0f} s ({why}); the launch "
                               "was stopped. Its last lines are above; if a step, evaluation or checkpoint of this "
                               "run really takes that long, raise the launch's timeout_s")
                # The silent rank first (SIGKILL reaches a stopped process), then the launcher and the others.
                for p in [proc, *descendants(proc.pid)]:
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
                stop_tree(self.launcher_pid, grace_s=5.0)
                return

    def check(self, now: float) -> tuple[int, psutil.Process, str] | None:
        """One look at the ranks: (rank, process, why) for the first silent one, else None."""
        for rank, proc in sorted(rank_processes(self.launcher_pid).items()):
            try:
                cpu = _cpu_s(proc)
                status = proc.status()
            except psutil.NoSuchProcess:
                continue
            beat = self._beats.get(rank)
            if beat is None or beat.pid != proc.pid or cpu - beat.mark_cpu >= self.min_cpu_s:
                self._beats[rank] = _Heartbeat(proc.pid, now, cpu)
            elif now - beat.mark_t >= self.timeout_s:
                why = ("stopped: SIGSTOP or a debugger" if status == psutil.STATUS_STOPPED
                       else f"{cpu - beat.mark_cpu:.2f} s of CPU in that time")
                return rank, proc, why
        return None
