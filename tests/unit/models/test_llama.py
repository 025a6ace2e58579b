"""The Transformer, its losses and FLOP accounting, on small real models."""
from __future__ import annotations

import math

import pytest
import torch

from models.flops import chinchilla, flops_per_token, mfu, num_params
from models.llama import KVCache, ModelConfig, Transformer, model_config
from models.losses import next_token_loss, token_logprobs
from models.presets import PRESETS

VOCAB = 97


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(**overrides) -> ModelConfig:
    base = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=64)
    return ModelConfig(vocab_size=VOCAB, **{**base, **overrides})


def make(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_shapes_and_every_parameter_gets_a_gradient(n_kv_heads):
    model = make(tiny(n_kv_heads=n_kv_heads)).train()
    idx = torch.randint(0, VOCAB, (3, 17))
    logits = model(idx)
    assert logits.shape == (3, 17, VOCAB)
    next_token_loss(logits[:, :-1], idx[:, 1:]).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, f"{name} got a zero gradient"


@pytest.mark.parametrize("tie", [True, False])
def test_future_tokens_do_not_change_earlier_logits(tie):
    model = make(tiny(tie_embeddings=tie))
    idx = torch.randint(0, VOCAB, (2, 24))
    changed = idx.clone()
    changed[:, 15:] = (changed[:, 15:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :15], b[:, :15], rtol=0, atol=1e-6)
    assert (a[:, 15:] - b[:, 15:]).abs().max() > 1e-3  # the test can see a change where one is due


def test_cached_chunks_match_a_full_forward():
    cfg = tiny()
    model = make(cfg)
    idx = torch.randint(0, VOCAB, (2, 30))
    cache = KVCache(cfg, 2, 40)
    with torch.no_grad():
        full = model(idx)
        # prefill, multi-token chunk, single token, multi-token chunk
        parts = [model(idx[:, a:b], cache=cache) for a, b in [(0, 9), (9, 16), (16, 17), (17, 30)]]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_positions_past_max_seq_len_and_full_cache_are_errors():
    cfg = tiny(max_seq_len=16)
    model = make(cfg)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    cache = KVCache(cfg, 1, 8)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="full"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_config_rejects_bad_shapes_and_unknown_presets():
    with pytest.raises(ValueError, match="n_kv_heads"):
        tiny(n_kv_heads=3)
    with pytest.raises(ValueError, match="n_heads"):
        tiny(dim=30)
    with pytest.raises(ValueError, match="choose one of"):
        model_config("huge", VOCAB)
    with pytest.raises(ValueError):
        ModelConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64,
                    max_seq_len=64, dropout=0.1)


def test_initialisation_scales_residual_projections():
    cfg = model_config("demo", 4096)
    model = make(cfg)
    assert model.lm_head.weight is model.embed.weight
    std = model.layers[0].attn.wq.weight.std().item()
    resid = model.layers[0].mlp.down.weight.std().item()
    assert std == pytest.approx(cfg.init_std, rel=0.05)
    assert resid == pytest.approx(cfg.init_std / math.sqrt(2 * cfg.n_layers), rel=0.05)
    # Logits of a fresh model are near uniform: the initial loss is close to ln(vocab).
    idx = torch.randint(0, 4096, (2, 64))
    with torch.no_grad():
        loss = next_token_loss(model(idx)[:, :-1], idx[:, 1:]).item()
    assert abs(loss - math.log(4096)) < 0.1


def test_loss_decreases_on_a_repeated_corpus():
    cfg = tiny()
    model = make(cfg).train()
    text = torch.tensor([1, 5, 9, 13, 2, 7, 11, 3] * 8)
    batch = text[None, :].repeat(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = next_token_loss(model(batch[:, :-1]), batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 4.0
    assert losses[-1] < 0.5, losses[-5:]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_param_count_equals_numel(preset):
    for tie in (True, False):
        cfg = model_config(preset, 4096, tie_embeddings=tie)
        with torch.device("meta"):  # no memory for the 1B preset
            model = Transformer(cfg)
        assert num_params(cfg) == sum(p.numel() for p in model.parameters())
        vocab_params = model.embed.weight.numel() * (1 if tie else 2)
        assert num_params(cfg, include_embeddings=False) == num_params(cfg) - vocab_params


def test_preset_sizes():
    assert 1e6 < num_params(model_config("demo", 4096)) < 3e6
    assert 23e6 < num_params(model_config("small25m", 4096)) < 27e6
    assert 115e6 < num_params(model_config("gpt124m", 50304)) < 130e6
    assert 330e6 < num_params(model_config("gpt350m", 50304)) < 380e6
    assert 1.0e9 < num_params(model_config("llama1b", 128256)) < 1.3e9


def test_flops_and_mfu():
    cfg = model_config("gpt124m", 50304)
    n = num_params(cfg, include_embeddings=False) + 50304 * 768
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 768 * 1024
    # nanoGPT's figure for GPT-2 124M at T=1024 is ~ 0.87 GFLOP/token (it has learned positions)
    assert 0.8e9 < flops_per_token(cfg, 1024) < 0.9e9
    assert mfu(1e5, flops_per_token(cfg, 1024), peak_flops=flops_per_token(cfg, 1024) * 2e5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1.0, flops_per_token(cfg, 1024), 0)


def test_chinchilla():
    # Chinchilla itself: 70B params, 1.4T tokens, ~5.9e23 FLOPs.
    r = chinchilla(n_params=70_000_000_000, tokens=1_400_000_000_000)
    assert r.tokens_per_param == pytest.approx(20)
    assert r.compute_flops == pytest.approx(5.88e23)
    assert r.optimal_params == pytest.approx(70e9, rel=1e-6)
    assert r.warning is None
    r = chinchilla(compute_flops=5.88e23)
    assert r.optimal_tokens == pytest.approx(1.4e12, rel=1e-3) and r.tokens is None and r.warning is None
    under = chinchilla(n_params=25_000_000, tokens=50_000_000)
    assert under.tokens_per_param == 2 and "undertrained" in under.warning
    assert under.optimal_params < 25_000_000
    over = chinchilla(compute_flops=6 * 1e6 * 1e9, n_params=1_000_000)
    assert over.tokens == 1_000_000_000 and "compute-optimal" in over.warning
    assert chinchilla(n_params=10).optimal_tokens == 200
    assert "tokens/param" in under.summary()
    with pytest.raises(ValueError, match="at least one"):
        chinchilla()


def test_losses_respect_mask_and_ignore_index():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    full = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert next_token_loss(logits, targets).item() == pytest.approx(full.item(), rel=1e-6)

    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[0, :2] = True
    ignored = targets.clone()
    ignored[mask.logical_not()] = -100
    expect = torch.nn.functional.cross_entropy(logits[0, :2], targets[0, :2])
    assert next_token_loss(logits, targets, mask).item() == pytest.approx(expect.item(), rel=1e-6)
    assert next_token_loss(logits, ignored).item() == pytest.approx(expect.item(), rel=1e-6)
    # all masked: zero, finite, differentiable
    zero = next_token_loss(logits, targets, torch.zeros_like(mask))
    zero.backward()
    assert zero.item() == 0.0 and torch.isfinite(logits.grad).all()

    lp = token_logprobs(logits, ignored)
    ref = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(lp[0, :2], ref[0, :2])
    assert (lp[mask.logical_not()] == 0).all()
    assert -lp[0, :2].mean().item() == pytest.approx(expect.item(), rel=1e-6)


def test_bf16_forward_runs_and_stays_close_to_fp32():
    cfg = tiny()
    model = make(cfg)
    idx = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        ref = model(idx)
        low = model.to(torch.bfloat16)(idx)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 0.05
