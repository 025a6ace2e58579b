"""A stale lock in torch's C++ extension folder, found and cleared before a launch.

DeepSpeed builds its CPU communication op with torch's cpp_extension, which takes a `lock`
file in the op's build folder (`torch.utils.file_baton`) and removes it when done. A launch
killed mid-build (the silent first minutes, when a user presses Ctrl-C) leaves the file, and
every later load of the op waits on it forever, printing nothing. The baton records no
owner, so a lock counts as stale when nothing is building: no process works in or names the
folder (the build runs `ninja` and the compiler there), and the file is older than a
start-up's few seconds between taking the lock and starting ninja.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from infra.lifecycle.process_tree import SUPERVISOR_ENV, stop_processes

# torch is imported inside the functions that need it: the CLI and the data flow import this module and never
# load torch (tests/unit/flows/test_data_flow_imports.py).

LOCK_NAME = "lock"
SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's CPU communication op, built on a machine's first launch
# What rank 0 prints before it builds SHM_OP (tasks/training/engine.py): the launch then knows a stop leaves its lock.
BUILDING_SHM_OP = ("building DeepSpeed's CPU shared-memory communication op (first launch on this machine only; "
                   "it can take a few minutes)")
# Taking the baton, checking the compiler and writing build.ninja take seconds; a minute is safe.
STALE_AFTER_S = 60.0


def extensions_root(env: Mapping[str, str] | None = None) -> Path:
    """The folder whose sub-folders torch builds extensions in: $TORCH_EXTENSIONS_DIR, else
    torch's per-user cache plus its `py<ver>_<accelerator>` folder (torch.utils.cpp_extension)."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = (f"rocm{torch.version.hip.replace('.', '')}" if torch.version.hip
                   else f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{py}_{accelerator}"


def _builders(folder: Path) -> list[psutil.Process]:
    """Processes working in `folder` (cwd) or naming it on their command line."""
    target = str(folder.resolve())
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = proc.cwd()
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if cwd == target or cwd.startswith(target + os.sep) or any(target in arg for arg in cmdline):
            found.append(proc)
    return found


def stale_locks(root: Path, stale_after_s: float = STALE_AFTER_S, now: float | None = None) -> list[Path]:
    """Lock files under `root/<extension>/` that are older than `stale_after_s` with no process building there."""
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    stale = []
    for lock in sorted(root.glob(f"*/{LOCK_NAME}")):
        try:
            age = now - lock.stat().st_mtime
        except FileNotFoundError:  # the build finished while we looked
            continue
        if age >= stale_after_s and not _builders(lock.parent):
            stale.append(lock)
    return stale


def clear_stale_build_locks(env: Mapping[str, str] | None = None, log: Callable[[str], Any] = print,
                            stale_after_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the stale locks of torch's extension folder (see the module's docstring), saying so; those removed."""
    root = extensions_root(env)
    removed = []
    for lock in stale_locks(root, stale_after_s):
        try:
            age = time.time() - lock.stat().st_mtime
            lock.unlink()
        except FileNotFoundError:
            continue
        removed.append(lock)
        log(f"removed a stale build lock {lock} ({age:.0f} s old, no build running: an earlier launch was "
            f"stopped while building the op '{lock.parent.name}'); the op is built or loaded again now")
    return removed


def _builders_gone(folder: Path, wait_s: float) -> bool:
    """Whether the processes building in `folder` have exited within `wait_s` (a Ctrl-C reaches ninja and the
    compiler with the launch, and they take a moment to die: until then the lock may still be theirs)."""
    deadline = time.monotonic() + wait_s
    while _builders(folder):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _launched_by(proc: psutil.Process, token: str) -> bool:
    """Whether `proc` inherited this launch's SUPERVISOR_ENV value (infra/lifecycle/process_tree.py)."""
    try:
        return proc.environ().get(SUPERVISOR_ENV) == token
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def clear_lock_of_stopped_build(env: Mapping[str, str] | None = None, log: Callable[[str], Any] = print,
                                wait_s: float = 10.0) -> list[Path]:
    """After a launch whose rank said BUILDING_SHM_OP has stopped: remove the lock it left, saying so (its
    compilers die with it on Ctrl-C, and the next launch would wait STALE_AFTER_S before calling the lock
    stale). A finished build has released it already. A compiler that carries this launch's supervisor token
    (SUPERVISOR_ENV in `env`) is its own, started as the stop came, after the launch last listed its processes:
    it is stopped. Any other build still running after `wait_s` is another launch's (ours waited on its lock):
    its lock stays."""
    token = (env if env is not None else os.environ).get(SUPERVISOR_ENV)
    removed = []
    for folder in [extensions_root(env) / SHM_OP]:
        lock = folder / LOCK_NAME
        if not lock.exists():
            continue
        if token:
            stop_processes([p for p in _builders(folder) if p.pid != os.getpid() and _launched_by(p, token)],
                           grace_s=2.0)
        if _builders_gone(folder, wait_s):
            lock.unlink(missing_ok=True)
            removed.append(lock)
            log(f"removed the build lock {lock}: this launch was stopped while building the op "
                f"'{folder.name}'; the next launch builds it again")
    return removed
