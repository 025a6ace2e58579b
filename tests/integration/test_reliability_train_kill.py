"""SIGKILL a training stage (its driver, DeepSpeed's launcher and the ranks) after a checkpoint; the rerun
resumes to the same result as an uninterrupted run.

The machinery is shared with test_reliability_post_training_kill.py: `run_killed` runs the stage in a
driver subprocess, in a session of its own, and SIGKILLs its whole process group at once as soon as
'latest' names the first checkpoint; `resumed_like` resumes it and compares with an uninterrupted run.
Here `straight_and_killed` runs that uninterrupted run in a thread of this process alongside the killed
one; the SFT and GRPO kill tests compare with the shared reference runs (tests/integration/references.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import BaseModel

from tasks.training.checkpoint import latest_checkpoint_step
from tasks.training.pretrain.stage import Pretrain
from tests.conftest import ROOT, launch_into, tiny_pretrain_config

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


def run_killed(stage: str, cfg: BaseModel, inputs: dict[str, Path | None], out: Path, ws: Path,
               total_steps: int, timeout: float = 300) -> int:
    """Launch stage `stage` ("module:Class") into `out` in a driver subprocess and SIGKILL its process group
    once 'latest' names a checkpoint; the step of the checkpoint a rerun resumes from."""
    ckpt = out / "checkpoints"
    log_path = out.parent / f"{out.name}-killed.log"
    paths = {k: str(v) if v is not None else None for k, v in inputs.items()}
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


def straight_and_killed(stage_cls: Any, cfg: Any, inputs: dict[str, Any], tmp_path: Path) -> tuple[Any, int, Path]:
    """(uninterrupted result, the checkpoint step of a run SIGKILLed into tmp_path/killed, that folder).

    The uninterrupted run (a thread here) and the killed one (a subprocess) go side by side: two launches'
    time for one on two cores."""
    out = tmp_path / "killed"
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(launch_into, stage_cls(cfg), tmp_path / "straight", tmp_path / "ws-straight", **inputs)
        killed_at = run_killed(stage_cls.path(), cfg, inputs, out, tmp_path / "ws", cfg.steps)
        return future.result(), killed_at, out


def killed_and_resumed(stage_cls: Any, cfg: Any, inputs: dict[str, Any], tmp_path: Path) -> tuple[Any, Any, int]:
    """`straight_and_killed`, then the killed run resumed: (uninterrupted, resumed, resumed-from step), checking
    that the resume said so and ended at the same step, train loss and validation loss."""
    straight, killed_at, out = straight_and_killed(stage_cls, cfg, inputs, tmp_path)
    return straight, resumed_like(stage_cls, cfg, inputs, out, tmp_path / "ws", killed_at, straight), killed_at


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


@pytest.mark.slow
def test_sigkilled_pretraining_resumes_to_the_uninterrupted_loss(tmp_path, pretrain_inputs):
    tokenizer, tokens = pretrain_inputs
    cfg = tiny_pretrain_config(max_steps=40, warmup_steps=2, lr=3e-3, ckpt_every=5, keep_checkpoints=2, log_every=5,
                               eval_batches=2, zero="zero0", num_procs=1, peak_flops=1e11, export_hf=False)
    straight, resumed, killed_at = killed_and_resumed(Pretrain, cfg, {"tokens": tokens, "tokenizer": tokenizer}, tmp_path)
    assert resumed.tokens_seen == straight.tokens_seen
    print(f"killed with checkpoint step {killed_at} of {cfg.steps}; final loss {resumed.final_train_loss:.6f} "
          f"vs {straight.final_train_loss:.6f} uninterrupted")
