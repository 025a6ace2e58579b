"""The kill tests' machinery: a launched stage SIGKILLed after its first checkpoint, and its resume checked."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel

from tasks.training.checkpoint import latest_checkpoint_step
from tests.conftest import ROOT, launch_into

# A stage object (module:Class, its config as JSON) launched into out_dir with its inputs (JSON).
_DRIVER = """
import importlib, json, sys
from pathlib import Path
from tests.conftest import launch_into
module, _, name = sys.argv[1].partition(":")
cls = getattr(importlib.import_module(module), name)
out, ws = map(Path, sys.argv[3:5])
launch_into(cls(cls.Config.model_validate_json(sys.argv[2])), out, ws, print, **json.loads(sys.argv[5]))
"""


def _latest_step(ckpt_dir: Path) -> int | None:
    try:
        return latest_checkpoint_step(ckpt_dir)
    except (OSError, ValueError):  # not there yet
        return None


def _wait_for_group_to_end(pgid: int, others: list[psutil.Process], timeout: float = 60) -> None:
    """Until no process of group `pgid` (nor any of `others`) is alive; zombies count as gone."""
    psutil.wait_procs(others, timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for p in psutil.process_iter(["status"]):
            try:
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                continue
        if not left:
            return
        assert time.monotonic() < deadline, f"processes {left} of the killed group are still alive"
        time.sleep(0.05)


def run_killed(stage: str, cfg: BaseModel, inputs: dict[str, Any], out: Path, ws: Path,
               total_steps: int, timeout: float = 300) -> int:
    """Launch stage `stage` ("module:Class") into `out` in a driver subprocess and SIGKILL its process group
    once 'latest' names a checkpoint; the step of the checkpoint a rerun resumes from."""
    ckpt = out / "checkpoints"
    log_path = out.parent / f"{out.name}-killed.log"
    paths = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else None if v is None else str(v)
             for k, v in inputs.items()}  # a path as a string; a config section (the arithmetic task) as a dict
    args = [stage, cfg.model_dump_json(), str(out), str(ws), json.dumps(paths)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
    with open(log_path, "w") as log:
        # A session of its own: the launcher and the ranks run in the driver's process group.
        proc = subprocess.Popen([sys.executable, "-c", _DRIVER, *args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    pgid = proc.pid
    try:
        deadline = time.monotonic() + timeout
        while _latest_step(ckpt) is None:
            assert proc.poll() is None, (f"the run exited (rc={proc.returncode}) before its first checkpoint:\n"
                                         + log_path.read_text()[-3000:])
            assert time.monotonic() < deadline, f"no checkpoint within {timeout} s"
            time.sleep(0.005)
        # Also whatever might have left the group (a launcher in a session of its own).
        others = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(pgid, signal.SIGKILL)
        for p in others:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    _wait_for_group_to_end(pgid, others)
    killed_at = _latest_step(ckpt)
    assert killed_at is not None and killed_at < total_steps, f"the run finished before the kill ({killed_at})"
    assert not (out / "result.json").exists()
    return killed_at


def resumed_like(stage_cls: Any, cfg: Any, inputs: dict[str, Any], out: Path, ws: Path, killed_at: int,
                 straight: Any) -> Any:
    """The run killed into `out` resumed there; checks that the resume said so and ended at `straight`'s (the
    uninterrupted run's) step, train loss and validation loss."""
    said: list[str] = []
    resumed = launch_into(stage_cls(cfg), out, ws, said.append, **inputs)
    assert any(f"resuming from step {killed_at} " in line for line in said)
    assert resumed.steps == straight.steps == cfg.steps
    assert abs(resumed.final_train_loss - straight.final_train_loss) < 1e-5
    assert abs(resumed.final_val_loss - straight.final_val_loss) < 1e-5
    return resumed
