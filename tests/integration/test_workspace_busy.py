"""Two runs started together on a fresh workspace take turns instead of racing to create the
MLflow store (which failed with an alembic error): each waits while the workspace is held,
saying who holds it, and both end well."""
from __future__ import annotations

import subprocess
import time

import pytest

from infra.workspace.lock import workspace_lock
from infra.workspace.paths import Workspace
from tests.conftest import CLI, ROOT
from tests.helpers.data_flow import make_preset


@pytest.mark.slow
def test_two_runs_on_one_fresh_workspace_take_turns(tmp_path, prefect_env):
    preset = make_preset(tmp_path)
    work = tmp_path / "work"
    args = CLI + ["data", "--preset", str(preset), "--workdir", str(work)]
    logs = [tmp_path / f"run{i}.log" for i in range(2)]
    # Hold the workspace until both runs are at its door, so they really start together.
    with workspace_lock(Workspace(work), wait=False):
        procs = [
            subprocess.Popen(args + ["--set", f"data.near.threshold={t}"], cwd=ROOT, env=prefect_env,
                             stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
            for t, log in zip((0.6, 0.9), logs)
        ]
        deadline = time.monotonic() + 300
        while not all("waiting for it to finish" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [l.read_text()[-2000:] for l in logs]
            time.sleep(0.5)
    for p in procs:
        p.wait(timeout=600)
    outs = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert all("is in use by pid" in o for o in outs)
    assert all("alembic" not in o.lower() for o in outs)
