"""`llmforge run` stops when told: Ctrl-C in its terminal, then a cancel from Prefect, during real pretraining.

After each stop: the CLI has exited, no process of the run is left, no new /dev/shm file, nothing left in
the run's private TMPDIR (but torch's compile cache), no MLflow run is RUNNING and the Prefect flow runs are Crashed or Cancelled.
The Ctrl-C saves a checkpoint of the step it stopped at (far from the next scheduled one, step 100),
and the second run, the same command, resumes pretraining from that step.

The workspace starts with the session seed's data, tokenizer and token stages (tests/helpers/seeds.py),
run with the same overrides: both runs reuse them and go straight to pretraining.
"""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tasks.training.checkpoint import latest_checkpoint_step
from tests.conftest import CLI, ROOT
from tests.helpers import seeds
from tests.helpers.processes import new_shm_files

pytestmark = pytest.mark.slow
STOP_WITHIN_S = 30.0
# The tiny preset on the seed's stages, saying every step (the first line would be step 10): the stop comes
# sooner, and any step it saves lies before the first scheduled checkpoint (step 100).
RUN = ["run"] + [a for kv in seeds.SEED_OVERRIDES + ["pretrain.log.every=1"] for a in ("--set", kv)]
small_stage_seed = seeds.small_stage_seed


def _start_until_pretraining(env: dict[str, str]) -> tuple[subprocess.Popen, str, list[str]]:
    """`llmforge run` in a session of its own (as from a terminal), returned once a pretraining rank trains."""
    proc = subprocess.Popen(CLI + RUN, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    flow_run = None
    for line in proc.stdout:
        lines.append(line)
        if m := re.search(r"Beginning flow run '([\w-]+)' for flow 'pipeline'", line):
            flow_run = m.group(1)
        if "launching:" in line and "tasks.training.rank" in line:  # DeepSpeed's own lines go to launch.log
            break
    else:
        pytest.fail("the run ended before pretraining:\n" + "".join(lines[-60:]))
    assert flow_run is not None
    # Keep draining the output (a full pipe would stall the run) while the rank starts training.
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 300  # a loaded 2-core machine takes minutes to import, build the op and start
    while not any(re.search(r"step \d+/", x) for x in lines) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert any(re.search(r"step \d+/", x) for x in lines), "no training step within 300 s:\n" + "".join(lines[-60:])
    return proc, flow_run, lines


def _tree(proc: subprocess.Popen) -> list[psutil.Process]:
    root = psutil.Process(proc.pid)
    return [root] + root.children(recursive=True)


def _left(tree: list[psutil.Process], within_s: float) -> list[str]:
    _, alive = psutil.wait_procs(tree, timeout=within_s)
    return [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in alive if p.is_running() and p.status() != "zombie"]


def _flow_states(api: str, name: str) -> str:
    """State of flow run `name`."""
    runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": [name]}}}, timeout=10).json()
    assert len(runs) == 1, runs
    return runs[0]["state"]["name"]


def _mlflow_statuses(ws: Path) -> dict[str, str]:
    db = sqlite3.connect(ws / "mlflow.db")
    try:
        return {f"{name} {rid[:8]}": status for rid, name, status in db.execute("select run_uuid, name, status from runs")}
    finally:
        db.close()


def _check_stopped(proc, tree, lines, shm_before, ws, expected_rc, tmpdir: Path):
    t0 = time.monotonic()
    try:
        proc.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the CLI did not stop within 30 s:\n" + "".join(lines[-60:]))
    out = "".join(lines)
    assert proc.returncode in expected_rc, out[-5000:]
    assert _left(tree, max(1.0, STOP_WITHIN_S - (time.monotonic() - t0))) == []
    assert new_shm_files(shm_before) == set()
    # Whatever the run left in its TMPDIR outlived it; torch's compile cache (torchinductor_<user>, created by
    # torch's import in the ranks) is kept across runs on purpose, as in /tmp.
    assert [name for name in os.listdir(tmpdir) if not name.startswith("torchinductor_")] == []
    statuses = _mlflow_statuses(ws)
    assert "RUNNING" not in statuses.values(), statuses
    return out, statuses


def _checkpoint_folder(ws: Path) -> Path:
    """The checkpoints of the run's one pretraining (its folder is named by its key: the same for both runs)."""
    (folder,) = ws.glob("checkpoints/pretrain/*/checkpoints")
    return folder


@pytest.mark.timeout(1800)  # with the seed's build, when this test is the first to need it
def test_ctrl_c_then_prefect_cancel_during_pretraining(prefect_env, prefect_api, small_stage_seed, tmp_path):
    ws = seeds.seed_workspace(small_stage_seed, Path(prefect_env["LLMFORGE_HOME"]))
    tmpdir = tmp_path / "tmp"  # the run's private temp folder: it must end empty
    tmpdir.mkdir()
    env = {**prefect_env, "DS_ACCELERATOR": "cpu", "TMPDIR": str(tmpdir)}
    shm_before = set(os.listdir("/dev/shm"))

    # 1. Ctrl-C in the terminal: SIGINT to the whole foreground process group.
    proc, flow_run, lines = _start_until_pretraining(env)
    assert any("stage tokenize_shards: reused" in line for line in lines), "".join(lines[-60:])  # the seed's
    tree = _tree(proc)
    assert any("tasks.training.rank" in " ".join(p.cmdline()) for p in tree)
    os.killpg(proc.pid, signal.SIGINT)
    out, statuses = _check_stopped(proc, tree, lines, shm_before, ws, expected_rc={130}, tmpdir=tmpdir)
    assert "stopped by SIGINT" in out and "stopping the run" in out
    assert _flow_states(prefect_api, flow_run) == "Crashed"
    assert {s for k, s in statuses.items() if k.startswith(("pipeline", "pretrain"))} == {"KILLED"}
    # The stop saved the step it stopped at, not a scheduled one (every 100 steps).
    checkpoints = _checkpoint_folder(ws)
    saved = latest_checkpoint_step(checkpoints)
    assert saved is not None and 1 <= saved < 100, out[-5000:]
    assert f"after step {saved} " in out and f"continues from step {saved}" in out, out[-5000:]
    assert not (checkpoints.parent / "result.json").exists()  # a stopped stage is not a finished one

    # 2. The same command again (every stage before pretraining reused), cancelled from Prefect during pretraining.
    proc, flow_run, lines = _start_until_pretraining(env)
    # The same pretraining key and folder: the rank resumed from the stopped step's checkpoint.
    assert any(f"resuming from step {saved} " in line for line in lines), "".join(lines[-60:])
    assert _checkpoint_folder(ws) == checkpoints
    tree = _tree(proc)
    run_id = httpx.post(f"{prefect_api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": [flow_run]}}},
                        timeout=10).json()[0]["id"]
    cancel = subprocess.run([str(Path(CLI[0]).parent / "prefect"), "flow-run", "cancel", run_id], env=prefect_env,
                            capture_output=True, text=True, timeout=60)  # not the run's TMPDIR: not the run's process
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    out, statuses = _check_stopped(proc, tree, lines, shm_before, ws, expected_rc={143}, tmpdir=tmpdir)
    assert "was cancelled in Prefect" in out
    assert _flow_states(prefect_api, flow_run) in ("Cancelled", "Crashed")
    assert "RUNNING" not in statuses.values()


@pytest.mark.timeout(1800)
def test_sigkill_to_the_cli_during_pretraining_leaves_no_process(isolated_env, small_stage_seed, tmp_path):
    """No handler runs: the ranks follow their supervisor's death, and Prefect's temporary API server (started by the
    CLI, no PREFECT_API_URL) is ended by its watcher (infra/lifecycle/reaper.py)."""
    seeds.seed_workspace(small_stage_seed, Path(isolated_env["LLMFORGE_HOME"]))
    env = {**isolated_env, "TMPDIR": str(tmp_path)}
    proc, _, lines = _start_until_pretraining(env)
    tree = _tree(proc)
    names = [" ".join(p.cmdline()) for p in tree]
    assert any("prefect" in n and "server" in n for n in names), names  # the temporary server is the CLI's child
    assert any("tasks.training.rank" in n for n in names), names
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert _left(tree[1:], 10.0) == [], "".join(lines[-40:])
