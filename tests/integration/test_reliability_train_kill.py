"""SIGKILL a pretraining run (launcher and ranks) after its first checkpoint; the rerun resumes to the same loss."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tasks.training.checkpoint import CKPT_SUMS_FILE, latest_checkpoint_step
from tasks.training.pretrain.stage import run_pretrain
from tests.conftest import ROOT, tiny_pretrain_config

_DRIVER = """
import sys
from pathlib import Path
from tasks.training.pretrain.stage import PretrainConfig, run_pretrain
cfg = PretrainConfig.model_validate_json(sys.argv[4])
run_pretrain(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), cfg, None, sys.argv[5])
"""


def _kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL the driver and every process group under it (the launcher runs in its own session)."""
    parent = psutil.Process(proc.pid)
    groups = {os.getpgid(c.pid) for c in parent.children(recursive=True) if c.is_running()}
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()
    return len(groups)


@pytest.mark.slow
def test_sigkilled_pretraining_resumes_to_the_uninterrupted_loss(tmp_path, pretrain_inputs):
    tokenizer, tokens = pretrain_inputs
    cfg = tiny_pretrain_config(max_steps=40, warmup_steps=2, lr=3e-3, ckpt_every=5, keep_checkpoints=2, log_every=5,
                               eval_batches=2, zero="zero0", num_procs=1, peak_flops=1e11, export_hf=False)
    straight = run_pretrain(tokens, tokenizer, tmp_path / "straight", cfg, None, tmp_path / "ws", log=lambda _: None)

    out = tmp_path / "killed"
    first = out / "checkpoints" / "step00000005" / CKPT_SUMS_FILE
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tokens), str(tokenizer), str(out), cfg.model_dump_json(),
                             str(tmp_path / "ws")], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not first.exists():
            assert proc.poll() is None, f"the run exited (rc={proc.returncode}) before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.01)
        groups = _kill_tree(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = latest_checkpoint_step(out / "checkpoints")
    assert groups >= 1 and killed_at is not None and killed_at < cfg.max_steps, "the run finished before the kill"
    assert not (out / "result.json").exists()

    resumed = run_pretrain(tokens, tokenizer, out, cfg, None, tmp_path / "ws", log=lambda _: None)
    assert resumed.steps == straight.steps == cfg.max_steps
    assert abs(resumed.final_train_loss - straight.final_train_loss) < 1e-5
    assert abs(resumed.val_loss - straight.val_loss) < 1e-5
    assert resumed.tokens_seen == straight.tokens_seen
    print(f"killed with checkpoint step {killed_at} of {cfg.max_steps}; final loss {resumed.final_train_loss:.6f} "
          f"vs {straight.final_train_loss:.6f} uninterrupted")
