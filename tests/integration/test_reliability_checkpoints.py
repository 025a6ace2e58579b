"""Checkpoints carry sha256 sums; a corrupted, truncated or incomplete checkpoint is caught before resuming."""
from __future__ import annotations

import json
import shutil

import pytest

from tasks.data.manifest import ChecksumError
from tasks.training.batches import token_window_batches
from tasks.training.checkpoint import CKPT_SUMS_FILE, checkpoint_tags, resume_tag, verify_checkpoint
from tasks.training.metrics import ListSink
from tasks.training.pretrain.stage import lm_loss
from tests.conftest import loop_model as tiny_model, random_tokens, train_config_for as cfg_for
from tests.helpers.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def _trained_once(tmp_path_factory):
    """4 steps with a checkpoint every 2, trained once for the module (the tests damage copies of it)."""
    cfg = cfg_for(max_steps=4, ckpt_every=2)
    batches = token_window_batches(random_tokens(), 16, cfg.batch.micro_batch_size, seed=3)
    ckpt = tmp_path_factory.mktemp("trained") / "ckpt"
    result = train(tiny_model(), cfg, batches, None, lm_loss, ckpt, ListSink())
    return ckpt, batches, result


@pytest.fixture
def trained(_trained_once, tmp_path):
    """Folders step2 and step4, each with its sums: this test's own copy of the module's training."""
    template, batches, result = _trained_once
    ckpt = shutil.copytree(template, tmp_path / "ckpt", symlinks=True)
    return ckpt, batches, result


def _resume(ckpt, batches, steps=6):
    return train(tiny_model(seed=7), cfg_for(max_steps=steps, ckpt_every=2), batches, None, lm_loss, ckpt, ListSink())


def test_every_checkpoint_lists_every_file(trained):
    ckpt, _, _ = trained
    assert checkpoint_tags(ckpt) == ["step00000002", "step00000004"]
    for tag in checkpoint_tags(ckpt):
        sums = json.loads((ckpt / tag / CKPT_SUMS_FILE).read_text())
        files = {p.name for p in (ckpt / tag).iterdir() if p.name != CKPT_SUMS_FILE}
        assert set(sums) == files and any(f.endswith("model_states.pt") for f in files)
        assert all(len(v) == 64 for v in sums.values())
        verify_checkpoint(ckpt / tag)
    assert resume_tag(ckpt) == "step00000004"


@pytest.mark.parametrize("damage", ["bit_flip", "truncate", "delete"])
def test_damaged_checkpoint_is_refused_naming_the_file(trained, damage):
    ckpt, batches, _ = trained
    victim = next((ckpt / "step00000004").glob("*model_states.pt"))
    data = bytearray(victim.read_bytes())
    if damage == "bit_flip":
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[: len(data) - 100]))
    else:
        victim.unlink()
    with pytest.raises(ChecksumError, match=victim.name):
        _resume(ckpt, batches)
    assert checkpoint_tags(ckpt) == ["step00000002", "step00000004"]  # nothing was deleted or overwritten


def test_save_interrupted_before_sums_falls_back_to_the_previous_checkpoint(trained):
    """A kill between DeepSpeed's 'latest' and our sums leaves step4 unverified: resume from step2, same end."""
    ckpt, batches, straight = trained
    (ckpt / "step00000004" / CKPT_SUMS_FILE).unlink()
    assert resume_tag(ckpt) == "step00000002"
    resumed = _resume(ckpt, batches, steps=4)
    assert resumed.resumed_from == 2
    assert abs(resumed.final_train_loss - straight.final_train_loss) < 1e-5


def test_only_checkpoint_without_sums_is_refused(tmp_path, trained):
    ckpt, batches, _ = trained
    for tag in checkpoint_tags(ckpt):
        (ckpt / tag / CKPT_SUMS_FILE).unlink()
    with pytest.raises(ChecksumError, match=CKPT_SUMS_FILE):
        _resume(ckpt, batches)
