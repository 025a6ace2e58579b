"""One run per workspace: a second one waits (saying who holds it) or stops at once; a killed
holder releases the lock; a flow inside a flow takes it once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra.workspace.lock import WorkspaceBusy, workspace_lock
from infra.workspace.paths import Workspace
from tests.conftest import ROOT


def _holder(ws_root: Path, seconds: float) -> subprocess.Popen:
    """A process that takes the lock, says so on stdout, and holds it for `seconds`."""
    code = textwrap.dedent(f"""
        import sys, time
        from infra.workspace.paths import Workspace
        from infra.workspace.lock import workspace_lock
        with workspace_lock(Workspace.locate({str(ws_root)!r})):
            print("held", flush=True)
            time.sleep({seconds})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_busy_workspace_is_refused_naming_the_holder(tmp_path):
    holder = _holder(tmp_path / "work", 30)
    try:
        with pytest.raises(WorkspaceBusy, match=rf"in use by pid {holder.pid} .*--workdir"):
            with workspace_lock(Workspace(tmp_path / "work"), wait=False):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_second_run_waits_for_the_first_and_says_so(tmp_path):
    holder = _holder(tmp_path / "work", 2)
    said: list[str] = []
    started = time.monotonic()
    with workspace_lock(Workspace(tmp_path / "work"), log=said.append, poll_s=0.1):
        waited = time.monotonic() - started
    holder.wait()
    assert waited > 0.5 and len(said) == 1 and f"pid {holder.pid}" in said[0] and "waiting" in said[0]


def test_a_killed_holder_releases_the_lock(tmp_path):
    holder = _holder(tmp_path / "work", 60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with workspace_lock(Workspace(tmp_path / "work"), wait=False):
        pass


def test_a_flow_inside_a_flow_takes_the_lock_once(tmp_path):
    ws = Workspace(tmp_path / "work")
    with workspace_lock(ws, wait=False):
        with workspace_lock(ws, wait=False):  # would block forever if flock were taken twice
            pass
        # still held by the outer block
        code = f"from infra.workspace.paths import Workspace; from infra.workspace.lock import workspace_lock\n" \
               f"with workspace_lock(Workspace.locate({str(ws.root)!r}), wait=False): pass"
        other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert other.returncode != 0 and "WorkspaceBusy" in other.stderr
