"""One run at a time per workspace: an advisory lock on `work/.lock`.

Two runs on one workspace would race on the MLflow SQLite store (its creation fails with
an alembic error) and on the `latest` links. The second run waits for the first, saying
who holds the lock, or stops at once with `wait=False`. The lock is a `flock`, so a
killed run releases it with its last file descriptor; the holder's pid and command are
written into the file for the message.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from infra.workspace.paths import Workspace

# Workspaces this process holds: a flow that calls another flow (the pipeline calls the
# data flow) takes the lock once. Process-wide on purpose: flock is per open file.
_HELD: set[Path] = set()


class WorkspaceBusy(RuntimeError):
    """Another run holds the workspace and the caller chose not to wait."""


def _holder(lock_file: Path) -> str:
    try:
        info = json.loads(lock_file.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return "another process"
    return f"pid {info.get('pid')} ({info.get('command', '?')}, since {info.get('since', '?')})"


@contextlib.contextmanager
def workspace_lock(ws: Workspace, wait: bool = True, log: Callable[[str], Any] = print,
                   poll_s: float = 1.0, remind_s: float = 60.0) -> Iterator[None]:
    """Hold ws's lock for the block; wait for another holder (saying so), or raise WorkspaceBusy."""
    root = ws.root.resolve()
    if root in _HELD:
        yield
        return
    ws.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(ws.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        waited = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(ws.lock_file)
                if not wait:
                    raise WorkspaceBusy(
                        f"workspace {ws.root} is in use by {holder}; wait for it, or use another "
                        "--workdir / LLMFORGE_HOME"
                    ) from None
                if waited == 0.0 or waited >= remind_s:
                    log(f"workspace {ws.root} is in use by {holder}; waiting for it to finish "
                        "(Ctrl-C to stop, or use another --workdir / LLMFORGE_HOME)")
                    waited = 0.0
                time.sleep(poll_s)
                waited += poll_s
        info = {"pid": os.getpid(), "command": " ".join(sys.argv)[:300],
                "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        _HELD.add(root)
        try:
            yield
        finally:
            _HELD.discard(root)
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
