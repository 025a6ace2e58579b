"""Parameter counts, training FLOPs per token, MFU and a Chinchilla compute-optimality check.

Conventions (as in the PaLM appendix B and Chinchilla appendix F, simplified):
- Training a token costs 6 FLOPs per matmul weight (2 forward, 4 backward) plus attention:
      flops_per_token = 6 * N + 12 * n_layers * dim * seq_len
  where the attention term is the QK^T and AV matmuls (2 * 2 * L * dim * T forward, x3 for
  training) over the full T x T square; causal masking is ignored, as PaLM does.
- N counts the weights that take part in a matmul per token: every parameter except the
  input embedding table (a lookup, no FLOPs), but including the output projection
  (vocab x dim), tied or not, because computing logits is a real matmul. Norm weights are
  included; they are a rounding error.
- num_params(cfg, include_embeddings=False) is the Kaplan-style "non-embedding" count:
  it leaves out every vocab x dim matrix (input embedding and an untied output head).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from models.llama import ModelConfig

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022, approach 1-3 rounded
# Outside [5, 100] tokens/param the run is far from compute-optimal: below 5 the model is
# badly undertrained for its size; above 100 a bigger model would reach a lower loss for
# the same compute (acceptable on purpose when inference cost matters, as in Llama 3).
# With a ratio fitted by a sweep, the same band in proportion: [ratio / 4, ratio * 5].
UNDERTRAINED_BELOW = 5.0
OVERTRAINED_ABOVE = 100.0


def count(n: float) -> str:
    """A parameter or token count for a report line: 20.5k, 2.36M, 1.4B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def num_params(cfg: ModelConfig, include_embeddings: bool = True) -> int:
    """Exact parameter count of Transformer(cfg) (tied weights counted once)."""
    d, hd = cfg.dim, cfg.head_dim
    attn = d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + cfg.n_heads * hd * d
    mlp = 3 * d * cfg.ffn_hidden
    per_layer = attn + mlp + 2 * d  # two RMSNorm weights
    body = cfg.n_layers * per_layer + d  # final norm
    if not include_embeddings:
        return body
    vocab_mats = 1 if cfg.tie_embeddings else 2
    return body + vocab_mats * cfg.vocab_size * d


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (non-embedding params + output projection) + 12 * L * dim * seq_len."""
    matmul_params = num_params(cfg, include_embeddings=False) + cfg.vocab_size * cfg.dim
    return 6.0 * matmul_params + 12.0 * cfg.n_layers * cfg.dim * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s (tokens/s x FLOPs per token) over the peak FLOP/s."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops={peak_flops} must be positive (FLOP/s of the hardware, e.g. 989e12 for H100 bf16)")
    return tokens_per_s * flops_per_token / peak_flops


@dataclass(frozen=True)
class ChinchillaReport:
    """Where a run sits against the compute-optimal D ~ ratio x N with C ~ 6 N D (Chinchilla's ratio, or a fitted one)."""

    compute_flops: float | None
    n_params: int | None
    tokens: int | None
    tokens_per_param: float | None
    optimal_params: int | None  # for this compute budget
    optimal_tokens: int | None
    warning: str | None
    optimal_ratio: float = CHINCHILLA_TOKENS_PER_PARAM
    ratio_source: str = "Chinchilla"  # or the sweep that fitted optimal_ratio, with its interval

    def summary(self) -> str:
        """One line for a report card."""
        parts = []
        if self.n_params is not None:
            parts.append(f"params {count(self.n_params)}")
        if self.tokens is not None:
            parts.append(f"tokens {count(self.tokens)}")
        if self.tokens_per_param is not None:
            parts.append(f"{self.tokens_per_param:.1f} tokens/param (optimal ~{self.optimal_ratio:.3g}, "
                         f"{self.ratio_source})")
        if self.optimal_params is not None:
            parts.append(
                f"compute-optimal for {self.compute_flops:.2e} FLOPs: "
                f"{count(self.optimal_params)} params on {count(self.optimal_tokens)} tokens"
            )
        line = "; ".join(parts)
        return f"{line}. WARNING: {self.warning}" if self.warning else line


def chinchilla(
    compute_flops: float | None = None, n_params: int | None = None, tokens: int | None = None,
    optimal_ratio: float = CHINCHILLA_TOKENS_PER_PARAM, ratio_source: str = "Chinchilla",
) -> ChinchillaReport:
    """Fill in what two of (C, N, D) imply via C = 6 N D, and compare with the compute-optimal N, D for C.

    With only N (or only D), the optimal partner D = ratio N (N = D / ratio) and its compute are reported.
    `optimal_ratio` is Chinchilla's 20 tokens per parameter unless a sweep on the same data fitted its own
    (tasks/training/scaling/fit_record.py); `ratio_source` says which, for the report line.
    """
    given = {k: v for k, v in dict(compute_flops=compute_flops, n_params=n_params, tokens=tokens).items() if v is not None}
    if not given:
        raise ValueError("chinchilla() needs at least one of compute_flops, n_params, tokens")
    for key, value in {**given, "optimal_ratio": optimal_ratio}.items():
        if value <= 0:
            raise ValueError(f"chinchilla(): {key}={value} must be positive")
    r = optimal_ratio
    C, N, D = compute_flops, n_params, tokens
    if C is None and N is not None and D is not None:
        C = 6.0 * N * D
    elif C is not None and N is not None and D is None:
        D = int(round(C / (6.0 * N)))
    elif C is not None and N is None and D is not None:
        N = int(round(C / (6.0 * D)))
    elif C is None and N is not None:  # N only: budget of the optimal run for this size
        C = 6.0 * N * r * N
    elif C is None and D is not None:  # D only
        C = 6.0 * (D / r) * D

    # C = 6 N (r N)  =>  N_opt = sqrt(C / 6 r)
    optimal_params = int(round(math.sqrt(C / (6.0 * r))))
    optimal_tokens = int(round(r * optimal_params))

    ratio = D / N if (N is not None and D is not None) else None
    under, over = r * UNDERTRAINED_BELOW / CHINCHILLA_TOKENS_PER_PARAM, r * OVERTRAINED_ABOVE / CHINCHILLA_TOKENS_PER_PARAM
    warning = None
    if ratio is not None and ratio < under:
        warning = (
            f"only {ratio:.1f} tokens per parameter (< {under:.3g}): the model is undertrained; "
            f"for this compute a ~{count(optimal_params)}-parameter model on ~{count(optimal_tokens)} tokens "
            "would reach a lower loss"
        )
    elif ratio is not None and ratio > over:
        warning = (
            f"{ratio:.0f} tokens per parameter (> {over:.3g}): far past compute-optimal; a larger "
            f"model (~{count(optimal_params)} params) would use this compute better, unless inference cost matters"
        )
    return ChinchillaReport(
        compute_flops=C,
        n_params=N,
        tokens=D,
        tokens_per_param=ratio,
        optimal_params=optimal_params,
        optimal_tokens=optimal_tokens,
        warning=warning,
        optimal_ratio=r,
        ratio_source=ratio_source,
    )
