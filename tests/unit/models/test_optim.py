"""AdamW groups, the warmup + cosine schedule, and GuardedAdamW's skip on non-finite gradients."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from models.llama import Transformer, model_config
from models.optim import GuardedAdamW, build_adamw, build_scheduler, lr_at, param_groups


def _cfg(warmup=10, max_steps=100, min_lr_ratio=0.1):
    return SimpleNamespace(warmup_steps=warmup, max_steps=max_steps, min_lr_ratio=min_lr_ratio)


def _tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(model_config("demo", 300, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64,
                                    max_seq_len=32))


def test_warmup_is_linear_and_reaches_peak():
    cfg = _cfg(warmup=10)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(4, cfg) == pytest.approx(0.5)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)  # cosine starts at the peak
    diffs = [lr_at(s + 1, cfg) - lr_at(s, cfg) for s in range(9)]
    assert all(d == pytest.approx(0.1) for d in diffs)


def test_cosine_decays_monotonically_to_the_floor():
    cfg = _cfg(warmup=10, max_steps=110, min_lr_ratio=0.1)
    values = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:]))
    assert lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: cos(pi/2) = 0
    assert lr_at(110, cfg) == pytest.approx(0.1)
    assert lr_at(10_000, cfg) == pytest.approx(0.1)  # past the end it stays at the floor


def test_no_warmup_starts_at_peak():
    cfg = _cfg(warmup=0, max_steps=10, min_lr_ratio=0.0)
    assert lr_at(0, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(0.0)
    assert math.isfinite(lr_at(0, _cfg(warmup=0, max_steps=0)))


def test_scheduler_drives_optimizer_lr():
    model = _tiny_model()
    opt = build_adamw(model, lr=1e-3, weight_decay=0.1)
    sched = build_scheduler(opt, _cfg(warmup=4, max_steps=20))
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[:5] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert seen[5] < 1e-3


def test_decay_only_on_matrices():
    model = _tiny_model()
    groups = param_groups(model, weight_decay=0.1)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    assert all(p.ndim < 2 for p in no_decay["params"])
    norm_ids = {id(m.weight) for name, m in model.named_modules() if name.endswith("norm")}
    assert norm_ids and norm_ids <= {id(p) for p in no_decay["params"]}
    assert id(model.embed.weight) in {id(p) for p in decay["params"]}
    # Every trainable parameter exactly once (the tied lm_head is the embedding).
    grouped = [id(p) for g in groups for p in g["params"]]
    assert len(grouped) == len(set(grouped)) == len(list(model.parameters()))


def test_frozen_parameters_are_left_out():
    model = _tiny_model()
    model.embed.weight.requires_grad_(False)
    grouped = {id(p) for g in param_groups(model, 0.1) for p in g["params"]}
    assert id(model.embed.weight) not in grouped


def _grad_step(opt: GuardedAdamW, model: torch.nn.Module, scale: float) -> None:
    opt.zero_grad()
    idx = torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(1))
    (model(idx).float().pow(2).mean() * scale).backward()
    opt.step()


def test_guarded_adamw_skips_non_finite_gradients():
    model = _tiny_model()
    opt = GuardedAdamW(model, lr=1e-2, weight_decay=0.1, max_grad_norm=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    _grad_step(opt, model, float("nan"))
    assert opt.overflow and not math.isfinite(opt._global_grad_norm)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert not opt.state  # no moments were created by the skipped step
    _grad_step(opt, model, 1.0)
    assert not opt.overflow and math.isfinite(opt._global_grad_norm)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_guarded_adamw_reports_pre_clip_norm_and_clips():
    model = _tiny_model()
    opt = GuardedAdamW(model, lr=1e-2, weight_decay=0.0, max_grad_norm=1e-3)
    _grad_step(opt, model, 1e3)
    assert opt._global_grad_norm > 1e-3  # the norm before clipping is what gets reported
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    assert float(total) == pytest.approx(1e-3, rel=1e-3)  # ...and the gradients were clipped


def test_auto_kernel_is_fused_on_the_cpu_and_steps_like_the_for_loop():
    """Fused AdamW (auto on the CPU) takes the same steps as torch's default for-loop kernel."""
    models = {k: _tiny_model() for k in ("auto", "for_loop", "foreach")}
    opts = {k: build_adamw(m, lr=1e-2, weight_decay=0.1, kernel=k) for k, m in models.items()}
    assert opts["auto"].defaults["fused"] is True
    assert opts["for_loop"].defaults["foreach"] is False and not opts["for_loop"].defaults["fused"]
    tokens = torch.randint(0, 300, (2, 16))
    for _ in range(3):
        for k, m in models.items():
            loss = m(tokens).float().logsumexp(-1).mean()
            loss.backward()
            opts[k].step()
            opts[k].zero_grad()
    for name, p in models["for_loop"].named_parameters():
        for k in ("auto", "foreach"):
            torch.testing.assert_close(dict(models[k].named_parameters())[name], p, rtol=1e-5, atol=1e-6)


def test_guarded_adamw_takes_the_kernel():
    opt = GuardedAdamW(_tiny_model(), lr=1e-3, weight_decay=0.1, kernel="foreach")
    assert opt.defaults["foreach"] is True
    with pytest.raises(ValueError, match="for_loop"):
        build_adamw(_tiny_model(), lr=1e-3, weight_decay=0.1, kernel="fast")  # type: ignore[arg-type]
