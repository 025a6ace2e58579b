"""Autoregressive generation: greedy or temperature + nucleus (top-p) sampling, with a KV cache.

Used by GRPO rollouts and evaluation, so it returns what they need: the sampled tokens,
their log-probs under the distribution they were drawn from (the policy at the sampling
temperature, before top-p; temperature 1 when greedy), and a mask of the tokens that count.
GRPO divides the policy's logits by the same temperature in its update (TRL does too), so the
importance ratio of the first update is exactly 1 at any temperature.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.llama import KVCache, Transformer


@dataclass
class Generation:
    """Output of `generate`; `new` is the number of decoding steps taken (<= max_new_tokens)."""

    tokens: torch.Tensor  # [B, T0 + new] prompt then generated tokens, pad_id after EOS
    new_tokens: torch.Tensor  # [B, new]
    logprobs: torch.Tensor  # [B, new] fp32 log pi_T(token), T the temperature (1 when greedy); 0 where mask is False
    mask: torch.Tensor  # [B, new] bool, True up to and including the first EOS


def equal_length_batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Indices of `prompts`, shortest first, in batches of at most batch_size prompts of one length.

    generate() has no padding mask, so only prompts of equal length can share a batch.
    """
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    return [items[start : start + batch_size] for _, items in sorted(by_length.items())
            for start in range(0, len(items), batch_size)]


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most-likely tokens whose total probability reaches top_p, renormalised."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep a token if the mass strictly before it is below top_p: the top token always survives.
    keep_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    probs = probs * keep
    return probs / probs.sum(dim=-1, keepdim=True)


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature: the distribution a sampler at that temperature draws from (greedy: T = 1)."""
    if temperature in (0, 1):
        return logits
    return logits / temperature


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Pick one token id per row of logits [B, V]: argmax when temperature == 0, else top-p sampling."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    probs = top_p_filter(probs, top_p)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: Transformer,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    pad_id: int | None = None,
) -> Generation:
    """Continue every row of prompt [B, T0] by up to max_new_tokens tokens (stops early once all rows hit EOS).

    All rows share the prompt length (no padding mask). `generator` must live on the model's
    device. After a row's EOS its tokens are `pad_id` (default: eos_id).
    """
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 means greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be a non-empty LongTensor [B, T0], got shape {tuple(prompt.shape)}")
    cfg = model.cfg
    B, T0 = prompt.shape
    if T0 + max_new_tokens > cfg.max_seq_len:
        raise ValueError(
            f"prompt length {T0} + max_new_tokens {max_new_tokens} exceeds max_seq_len={cfg.max_seq_len}; "
            "shorten the prompt or ask for fewer tokens"
        )
    fill = eos_id if pad_id is None else pad_id
    param = next(model.parameters())
    cache = KVCache(cfg, B, T0 + max_new_tokens, param.device, param.dtype) if use_cache else None

    seq = prompt
    new_tokens, logprobs, masks = [], [], []
    done = torch.zeros(B, dtype=torch.bool, device=prompt.device)
    step_input = prompt
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else seq, cache=cache)[:, -1, :].float()
        token = sample_next(logits, temperature, top_p, generator)
        logprob = torch.log_softmax(tempered(logits, temperature), dim=-1).gather(-1, token[:, None]).squeeze(-1)
        alive = ~done
        if fill is not None:
            token = torch.where(alive, token, torch.full_like(token, fill))
        new_tokens.append(token)
        logprobs.append(logprob * alive)
        masks.append(alive)
        seq = torch.cat([seq, token[:, None]], dim=1)
        step_input = token[:, None]
        if eos_id is not None:
            done = done | (token == eos_id)
            if bool(done.all()):
                break

    if new_tokens:
        new = torch.stack(new_tokens, dim=1)
        return Generation(seq, new, torch.stack(logprobs, dim=1), torch.stack(masks, dim=1))
    empty = prompt.new_zeros(B, 0)
    return Generation(seq, empty, torch.zeros(B, 0, device=prompt.device), empty.bool())
