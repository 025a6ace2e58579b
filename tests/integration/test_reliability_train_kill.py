"""SIGKILL a training stage (its driver, DeepSpeed's launcher and the ranks) after a checkpoint; the rerun
resumes to the same result as an uninterrupted run.

The machinery is shared with test_reliability_post_training_kill.py (tests/helpers/killed_runs.py):
`run_killed` runs the stage in a driver subprocess, in a session of its own, and SIGKILLs its whole process
group at once as soon as 'latest' names the first checkpoint; `resumed_like` resumes it and compares with an
uninterrupted run. Here `straight_and_killed` runs that uninterrupted run in a thread of this process alongside
the killed one; the SFT and GRPO kill tests compare with the shared reference runs (tests/helpers/references.py).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tasks.training.pretrain.stage import Pretrain
from tests.conftest import launch_into, tiny_pretrain_config
from tests.helpers.killed_runs import resumed_like, run_killed


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


@pytest.mark.slow
def test_sigkilled_pretraining_resumes_to_the_uninterrupted_loss(tmp_path, pretrain_inputs):
    tokenizer, tokens = pretrain_inputs
    cfg = tiny_pretrain_config(max_steps=40, warmup_steps=2, lr=3e-3, ckpt_every=5, keep_checkpoints=2, log_every=5,
                               eval_batches=2, zero="zero0", num_procs=1, peak_flops=1e11, export_hf=False)
    straight, resumed, killed_at = killed_and_resumed(Pretrain, cfg, {"tokens": tokens, "tokenizer": tokenizer}, tmp_path)
    assert resumed.tokens_seen == straight.tokens_seen
    print(f"killed with checkpoint step {killed_at} of {cfg.steps}; final loss {resumed.final_train_loss:.6f} "
          f"vs {straight.final_train_loss:.6f} uninterrupted")
