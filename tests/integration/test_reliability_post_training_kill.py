"""SIGKILL SFT and GRPO through the real DeepSpeed launcher after a checkpoint; each rerun resumes to the
uninterrupted run's result (machinery: test_reliability_train_kill.py)."""
from __future__ import annotations

import json
import os

import pytest
import torch
from tokenizers import Tokenizer

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from models.export import load_model, save_model  # noqa: E402
from tasks.training.grpo.stage import Grpo  # noqa: E402
from tasks.training.sft.data import ArithmeticSftOptions  # noqa: E402
from tasks.training.config import SftDataConfig  # noqa: E402
from tasks.training.sft.stage import Sft  # noqa: E402
from tests.conftest import grpo_config, launch_into, saved_tokenizer, sft_config, small_alphabet_bpe, tiny_llama  # noqa: E402
from tests.integration.test_grpo_stage import quick_sft  # noqa: E402
from tests.integration.test_reliability_train_kill import killed_and_resumed, straight_and_killed  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return small_alphabet_bpe(64)


@pytest.fixture(autouse=True)
def _no_outside_mlflow(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _same_weights(a, b, atol: float) -> None:
    sa, sb = load_model(a).state_dict(), load_model(b).state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.allclose(sa[k], sb[k], atol=atol, rtol=0), k


def test_sigkilled_sft_resumes_to_the_uninterrupted_loss(tmp_path, tok):
    tok_path = saved_tokenizer(tok, tmp_path)
    base_dir = save_model(tiny_llama(tok.get_vocab_size()), tmp_path / "base")
    cfg = sft_config(seq_len=48, micro_batch_size=8, max_steps=40, lr=3e-3, warmup_steps=2, ckpt_every=5,
                    log_every=5, eval_batches=2, peak_flops=1e9, torch_threads=1, export_hf=False,
                    data=SftDataConfig(builtin=["arithmetic"], val_fraction=0.2,
                                       arithmetic=ArithmeticSftOptions(n=50, max_operand=9, ops="+")))
    inputs = {"base": base_dir, "tokenizer": tok_path, "tokens": None}
    straight, resumed, killed_at = killed_and_resumed(Sft, cfg, inputs, tmp_path)
    _same_weights(resumed.model_dir, straight.model_dir, atol=1e-5)
    print(f"SFT killed with checkpoint step {killed_at} of {cfg.steps}; final loss "
          f"{resumed.final_train_loss:.6f} vs {straight.final_train_loss:.6f} uninterrupted")


def test_sigkilled_grpo_resumes_to_the_uninterrupted_rewards(tmp_path, tok):
    tok_path = saved_tokenizer(tok, tmp_path)
    sft_dir = save_model(quick_sft(tiny_llama(tok.get_vocab_size()), tok), tmp_path / "sft")
    cfg = grpo_config(group_size=4, prompts_per_step=2, max_new_tokens=12, steps=16, lr=1e-3, eval_prompts=6,
                          n_train_problems=10, max_operand=9, ops="+", samples_every=3, ckpt_every=3,
                          torch_threads=1, export_hf=False)
    inputs = {"sft": sft_dir, "tokenizer": tok_path}
    straight, killed_at, out = straight_and_killed(Grpo, cfg, inputs, tmp_path)

    resumed = launch_into(Grpo(cfg), out, tmp_path / "ws", **inputs)
    assert resumed.resumed_from == killed_at and straight.resumed_from is None
    # Rewards, held-out scores and the samples kept before the kill: exactly the uninterrupted run's.
    assert resumed.final_train_reward == straight.final_train_reward
    assert resumed.before == straight.before and resumed.after == straight.after
    assert (out / "samples.txt").read_text() == (tmp_path / "straight" / "samples.txt").read_text()
    _same_weights(resumed.model_dir, straight.model_dir, atol=1e-6)
    saved = json.loads((out / "result.json").read_text())
    assert saved["steps"] == cfg.steps and saved["resumed_from"] == killed_at
    print(f"GRPO killed with checkpoint step {killed_at} of {cfg.steps}; final reward {resumed.final_train_reward:.4f}"
          f" vs {straight.final_train_reward:.4f}, held-out {resumed.after.n_correct}/{resumed.after.n} vs "
          f"{straight.after.n_correct}/{straight.after.n} uninterrupted")
