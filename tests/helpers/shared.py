"""Work done once per test run and shared by every pytest-xdist worker: a folder built under a file lock.

A session fixture runs once per worker, not once per run; with `-n 2` two tests that share a reference launch
would each pay for it when they land on different workers. `shared_once` builds the folder in the run's
common temporary root (the parent of the workers' own basetemps) under a FileLock: the first worker to ask
builds it, the other waits and then reads what it left. Consumers treat the folder as read-only and write
their own outputs elsewhere.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

DONE = ".done"


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder common to this run's workers: basetemp's parent under xdist (workers use basetemp/popen-gwN),
    basetemp itself without it (its parent holds earlier runs' folders)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `build(folder)` once per run whichever worker asks first.

    A build that raised leaves no `.done`: the next caller starts it again in an emptied folder (and fails the
    same way, with its own traceback)."""
    root = run_root(tmp_path_factory)
    out = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (out / DONE).is_file():
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            build(out)
            (out / DONE).touch()
    return out
