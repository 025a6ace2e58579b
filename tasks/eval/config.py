"""The evaluation's config, apart from the evaluation: the pipeline config composes it without importing torch."""
from __future__ import annotations

from pydantic import Field

from infra.config import StrictModel


class EvalConfig(StrictModel):
    """How much to evaluate and how: bins, token budget, temperature study, arithmetic questions."""

    n_bins: int = Field(default=15, ge=1)
    max_tokens: int = Field(default=16384, ge=1)  # next-token predictions evaluated, from the start of val
    seq_len: int | None = Field(default=None, ge=1)  # window length; None: the model's max_seq_len
    batch_size: int = Field(default=8, ge=1)
    # Logits of this many randomly chosen predictions are kept (float16) for temperature
    # scaling: memory is temperature_tokens * vocab * 2 bytes.
    temperature_tokens: int = Field(default=8192, ge=2)
    temperature_fit_fraction: float = Field(default=0.5, gt=0.0, lt=1.0)
    n_questions: int = Field(default=100, ge=0)  # arithmetic questions, from the held-out "eval" split
    max_answer_tokens: int = Field(default=16, ge=1)
    arithmetic_max_operand: int = Field(default=20, ge=0)  # must match what SFT/GRPO trained on
    arithmetic_ops: str = "+-"
    reward: str = "arithmetic_exact"
    seed: int = 0
    device: str | None = None  # evaluate_checkpoint only; None: cuda when available, else cpu
