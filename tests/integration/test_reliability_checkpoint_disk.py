"""A full disk under a checkpoint save and under MLflow's store (real tmpfs, real DeepSpeed, real SQLite).

The disk fills while training runs (a ballast file written by the batch function, as another
process would), so the kernel's own ENOSPC meets DeepSpeed's torch.save and SQLite.
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from infra.tracking.runs import stage_run
from infra.tracking.store import tracking_uri
from infra.tracking.store_errors import StoreFullError
from infra.workspace.paths import Workspace
from tasks.training.batches import token_window_batches
from tasks.training.checkpoint import (CKPT_SUMS_FILE, checkpoint_tags, latest_checkpoint_step, resume_tag,
                                       save_checkpoint, verify_checkpoint)
from tasks.training.engine import build_engine
from tasks.training.metrics import ListSink, MlflowSink
from tasks.training.pretrain.stage import lm_loss
from tests.conftest import loop_model, random_tokens, train_config_for as cfg_for
from tests.helpers.mounts import mounts  # noqa: F401 - the tmpfs fixture
from tests.helpers.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CKPT_BYTES = 288_000  # about what one checkpoint of loop_model takes (weights + AdamW moments)


def fill(disk: Path, leave: int) -> Path:
    """Write a ballast file until at most `leave` bytes are free on `disk`."""
    ballast = disk / "ballast"
    with open(ballast, "ab") as fh:
        try:
            while (free := shutil.disk_usage(disk).free) > leave:
                fh.write(b"\0" * min(free - leave, 1 << 20))
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast


def filling_at(batches, step: int, disk: Path, leave: int):
    """`batches`, which fills `disk` (to `leave` free bytes) when step `step` (1-based) begins."""

    def batch(i, rank, world):
        if i == step - 1 and not (disk / "ballast").exists():
            fill(disk, leave)
        return batches(i, rank, world)

    return batch


def _status(ws: Workspace, run_id: str) -> str:
    import mlflow

    return mlflow.MlflowClient(tracking_uri(ws)).get_run(run_id).info.status


def test_checkpoint_that_no_longer_fits_fails_early_and_the_rerun_resumes(mounts, tmp_path):  # noqa: F811
    disk = mounts("disk", "size=2m")
    ckpt = disk / "ckpt"
    cfg = cfg_for(max_steps=6, ckpt_every=2)
    batches = token_window_batches(random_tokens(), 16, cfg.batch.micro_batch_size, seed=3)
    straight = train(loop_model(), cfg, batches, None, lm_loss, tmp_path / "straight", ListSink())

    ws = Workspace(tmp_path / "ws")
    with pytest.raises(OSError) as info:
        with stage_run(ws, "pretrain") as run:
            # Step 2's checkpoint fits; then the disk fills, leaving a third of what step 4's needs.
            train(loop_model(), cfg, filling_at(batches, 3, disk, CKPT_BYTES // 3), None, lm_loss, ckpt, ListSink())
    message = str(info.value)
    print(message)
    assert info.value.errno == errno.ENOSPC and "No space left on device" in message
    assert f"checkpoint {ckpt / 'step00000004'}: it needs about 288," in message
    assert f"{ckpt / 'step00000002'} is intact" in message and "nothing was written" in message
    assert checkpoint_tags(ckpt) == ["step00000002"] and latest_checkpoint_step(ckpt) == 2
    verify_checkpoint(ckpt / "step00000002")
    assert _status(ws, run.info.run_id) == "FAILED"

    (disk / "ballast").unlink()
    resumed = train(loop_model(seed=7), cfg, batches, None, lm_loss, ckpt, ListSink())
    assert resumed.resumed_from == 2 and checkpoint_tags(ckpt) == ["step00000004", "step00000006"]
    assert abs(resumed.final_train_loss - straight.final_train_loss) < 1e-5


def test_disk_filling_during_the_save_removes_the_partial_folder(mounts, tmp_path):  # noqa: F811
    """Enough space by the estimate, not for what is written: torch.save meets the kernel's ENOSPC."""
    import torch

    disk = mounts("disk", "size=2m")
    ckpt = disk / "ckpt"
    ckpt.mkdir()
    cfg = cfg_for()
    engine = build_engine(loop_model(), cfg.optim, cfg.launch, cfg.batch.micro_batch_size, cfg.batch.grad_accum, cfg.steps)
    save_checkpoint(engine, ckpt, 2, {"step": 2}, 0, 1, keep=2)
    needed = sum(p.stat().st_size for p in (ckpt / "step00000002").iterdir())
    fill(disk, 2 * needed)  # passes the check (the previous checkpoint's size), but the client state is big
    with pytest.raises(OSError) as info:
        save_checkpoint(engine, ckpt, 4, {"step": 4, "extra": torch.ones(250_000)}, 0, 1, keep=2)
    message = str(info.value)
    print(f"{message}\n  (DeepSpeed's own error: {info.value.__cause__})")
    assert info.value.errno == errno.ENOSPC and "No space left on device" in message
    assert str(ckpt / "step00000004") in message and "the partial folder was removed" in message
    assert f"(about {needed:,} bytes" in message and "the disk filled after" in message
    assert isinstance(info.value.__cause__, RuntimeError)  # what torch.save raised, with no errno or path
    assert checkpoint_tags(ckpt) == ["step00000002"] and sorted(p.name for p in ckpt.iterdir()) == [
        "latest", "step00000002"]
    assert resume_tag(ckpt) == "step00000002"
    assert shutil.disk_usage(disk).free > 2 * needed - 8192  # the partial folder's space is back


@pytest.mark.parametrize("fails", ["logging", "ending"])
def test_mlflow_store_on_the_full_disk_raises_enospc_naming_it(mounts, tmp_path, fails):  # noqa: F811
    """The workspace (SQLite store) and the checkpoints share the disk that fills at step 3."""
    disk = mounts("disk", "size=2m")
    ws = Workspace(disk / "ws")
    cfg = cfg_for(max_steps=4, ckpt_every=2, log_every=1 if fails == "logging" else 10)
    batches = filling_at(token_window_batches(random_tokens(), 16, cfg.batch.micro_batch_size, seed=3), 3, disk, 0)
    with pytest.raises(OSError) as info:
        with stage_run(ws, "pretrain"):
            train(loop_model(), cfg, batches, None, lm_loss, disk / "ckpt", MlflowSink(0) if fails == "logging"
                  else ListSink())
    message = str(info.value)
    print(message)
    assert isinstance(info.value, StoreFullError) and info.value.errno == errno.ENOSPC
    assert f"MLflow's store at {ws.mlflow_db} is on a full disk (No space left on device)" in message
    assert "could not be marked FAILED" in message
    if fails == "ending":  # the checkpoint failed first, and the message says so too
        assert "the run had failed with: [Errno 28] No space left on device (ENOSPC) saving checkpoint" in message
    else:
        assert "logging to run failed" in message
    assert (disk / "ckpt" / "step00000002" / CKPT_SUMS_FILE).is_file()
    assert not (disk / "ckpt" / "step00000004").exists()
