"""A decoder-only transformer in the Llama style, in one file you can read top to bottom.

RMSNorm -> grouped-query attention with rotary embeddings -> RMSNorm -> SwiGLU MLP, with
residual connections, no biases and (optionally) tied input/output embeddings. Rotary
embeddings use the Hugging Face "rotate_half" layout, so every weight maps 1:1 onto
`transformers.LlamaForCausalLM` (see models/export.py) with no permutation.

Contract used by pretraining, SFT, GRPO and evaluation:
    cfg = model_config("demo", vocab_size=4096)
    model = Transformer(cfg)
    logits = model(idx)                       # [B, T, vocab]
    cache = KVCache(cfg, B, max_len, device, dtype)
    logits = model(chunk, cache=cache)        # positions continue from cache.length

Batches in one forward share positions: prompts of different lengths need separate
calls (or right-aligned padding handled by the caller); there is no padding mask here.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import model_validator
from torch import nn

from infra.config import StrictModel
from models.presets import PRESETS, shape_problem

# ----------------------------------------------------------------------------- config


class ModelConfig(StrictModel):
    """Architecture of one model; saved next to its weights as config.json."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelConfig":
        problem = shape_problem(self.model_dump())
        if problem:
            raise ValueError(problem)
        return self

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def model_config(preset: str, vocab_size: int, **overrides) -> ModelConfig:
    """Build a ModelConfig from a named preset, with the tokenizer's vocab size and any overrides."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[preset], "vocab_size": vocab_size, **overrides})


# ----------------------------------------------------------------------------- KV cache


class KVCache:
    """Keys and values of every layer for positions [0, length), preallocated to max_len."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, device=None, dtype=torch.float32):
        if max_len > cfg.max_seq_len:
            raise ValueError(f"KVCache max_len={max_len} exceeds the model's max_seq_len={cfg.max_seq_len}")
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0  # positions filled; advanced by Transformer.forward after all layers ran

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this chunk's k, v for `layer` and return all keys/values up to the chunk's end."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KVCache is full: {end} positions needed, max_len={self.max_len}")
        if k.shape[0] != self.batch_size:
            raise ValueError(f"batch size {k.shape[0]} does not match the cache's {self.batch_size}")
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


# ----------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (bf16 squares overflow/lose precision), exactly as HF Llama does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape [T, head_dim] for the given absolute positions (HF layout: freqs repeated twice)."""
    # Computed per call in fp32 rather than stored as buffers: no state to be cast to bf16 by
    # model.to(), and the cost (T * head_dim trig ops) is negligible beside the matmuls.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] by position; cos/sin [T, D] broadcast over batch and heads."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, layer: int, cache: KVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(layer, k, v)
        if past == 0:
            # Training or prefill: plain causal attention over this chunk.
            mask, causal = None, T > 1
        elif T == 1:
            # One new token attends to everything before it: no mask needed.
            mask, causal = None, False
        else:
            # A multi-token chunk after a cache: query i (position past+i) sees keys 0..past+i.
            # (is_causal would align the triangle to the top-left, which is wrong here.)
            q_pos = past + torch.arange(T, device=x.device)
            mask = torch.arange(past + T, device=x.device)[None, :] <= q_pos[:, None]
            causal = False
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, self.layer, cache)
        return x + self.mlp(self.mlp_norm(x))


# ----------------------------------------------------------------------------- model


class Transformer(nn.Module):
    """Token ids [B, T] -> next-token logits [B, T, vocab]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """normal(0, init_std) everywhere; residual output projections scaled by 1/sqrt(2 * n_layers)."""
        std = self.cfg.init_std
        # The residual stream sums 2 * n_layers branch outputs; shrinking the projections that
        # write into it keeps its variance roughly constant with depth (GPT-2 / nanoGPT).
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                if module is self.lm_head and self.cfg.tie_embeddings:
                    continue  # shares the embedding weight, initialised once
                is_resid = name.endswith("attn.wo") or name.endswith("mlp.down")
                nn.init.normal_(module.weight, mean=0.0, std=resid_std if is_resid else std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits for every position; with a cache, positions continue from cache.length and the cache grows."""
        return self.lm_head(self.hidden(idx, cache))

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The final normed hidden state of every position (`lm_head` of it gives the logits): scoring a few
        positions of a long row needs the vocabulary projection, the largest matmul here, only at those."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {start + T} positions exceeds max_seq_len={self.cfg.max_seq_len}; "
                "truncate the input or build the model with a larger max_seq_len"
            )
        x = self.embed(idx)
        positions = torch.arange(start, start + T, device=idx.device)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for block in self.layers:
            x = block(x, cos, sin, cache)
        if cache is not None:
            cache.length = start + T
        return self.norm(x)
