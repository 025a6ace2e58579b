"""What a launch leaves behind: DeepSpeed's /dev/shm buffers, and a process tree and whether it is gone."""
from __future__ import annotations

import os
import subprocess
import time

import psutil

from infra.launch.launcher import SHM_DIR, SHM_PREFIX


def shm_files() -> set[str]:
    """DeepSpeed's CPU all-reduce buffers in /dev/shm: what a launch can leak. Other names there belong to other
    programs (a `tmpXXXXXXXX` file, not ours, appeared beside a full suite's run and failed this check once)."""
    return {name for name in os.listdir(SHM_DIR) if name.startswith(SHM_PREFIX)} if SHM_DIR.is_dir() else set()


def new_shm_files(before: set[str], settle_s: float = 5.0) -> set[str]:
    """/dev/shm files absent from `before` that are still there `settle_s` later.

    Another test's launch running alongside (pytest -n) holds its buffers for the seconds of its
    start-up; a leak is what stays.
    """
    new = shm_files() - before
    if new:
        time.sleep(settle_s)
        new &= shm_files()
    return new


def alive(pids: list[int]) -> list[int]:
    """The processes of `pids` still running (a zombie counts as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    """Waits up to `within_s` for every process of `pids` to end; those still alive then."""
    deadline = time.monotonic() + within_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def process_tree(proc: subprocess.Popen) -> list[int]:
    """`proc` and all its descendants, by pid."""
    return [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
