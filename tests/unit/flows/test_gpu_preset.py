"""The gpt-124m preset validates on the CPU with no network: its model, batch, catalogs and rewards."""
from __future__ import annotations

import pytest

from flows.config import PipelineConfig, load_pipeline_config
from models.flops import num_params
from models.llama import model_config
from tasks.data.catalog import load_catalog
from tasks.training.sft.data import load_sft_catalog
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def cfg() -> PipelineConfig:
    return load_pipeline_config("gpt-124m")


def test_model_has_124m_parameters(cfg):
    train = cfg.pretrain
    mcfg = model_config(train.model, cfg.tokenizer.vocab_size, **train.model_overrides)
    assert (mcfg.dim, mcfg.n_layers, mcfg.n_heads, mcfg.max_seq_len) == (768, 12, 12, 1024)
    assert num_params(mcfg) == pytest.approx(124e6, rel=0.02)
    assert train.batch.seq_len <= mcfg.max_seq_len and mcfg.vocab_size % 64 == 0


def test_half_a_million_tokens_a_step_in_bf16_compiled_with_fused_adamw(cfg):
    train = cfg.pretrain
    assert train.batch.tokens_per_step(world=1) == 16 * 1024 * 32 == pytest.approx(0.5e6, rel=0.05)
    assert (train.launch.precision, train.optim.kernel, train.launch.torch_compile) == ("bf16", "fused", True)
    assert train.optim.warmup_steps < train.steps and train.optim.min_lr_ratio < 1
    assert cfg.sft.launch.precision == "bf16" and cfg.grpo.launch.precision == "bf16"


def test_catalogs_are_the_presets_own_and_name_hub_datasets(cfg):
    catalog = load_catalog(ROOT / cfg.data.catalog)  # validates; names a hub dataset, so nothing is read yet
    assert cfg.data.catalog != PipelineConfig().data.catalog
    [source] = catalog.sources
    assert source.kind == "hf_dataset" and source.hf.name == "HuggingFaceFW/fineweb-edu"
    assert source.hf.config == "sample-10BT" and source.max_documents
    sft = {s.name: s for s in load_sft_catalog(ROOT / cfg.sft.data.catalog)}
    assert {s.kind for s in sft.values()} == {"sft_hf_dataset"}
    assert sft["gsm8k"].hf.split == "train"  # GRPO scores itself on the test split


def test_grpo_trains_on_gsm8k_with_the_exact_answer_reward(cfg):
    grpo = cfg.grpo
    assert grpo.task == "gsm8k" and grpo.gsm8k.name == "openai/gsm8k"
    assert grpo.gsm8k.train_split != grpo.gsm8k.eval_split
    assert grpo.accuracy_reward == "gsm8k_exact" and "gsm8k_exact" in grpo.rewards
    assert grpo.max_new_tokens + 200 <= 1024  # a question and its worked solution fit the context
