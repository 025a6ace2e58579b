"""The training loop's config, apart from the loop: the pipeline config composes it without importing torch."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from infra.config import StrictModel


class TrainConfig(StrictModel):
    """Everything the loop needs besides the model and the data; shared by pretraining and SFT."""

    seq_len: int = Field(default=256, gt=0)
    micro_batch_size: int = Field(default=8, gt=0)  # sequences per rank per micro-batch
    grad_accum: int = Field(default=1, gt=0)  # micro-batches per optimizer step
    lr: float = Field(default=3e-4, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)  # cosine floor, as a fraction of lr
    warmup_steps: int = Field(default=10, ge=0)
    max_steps: int = Field(default=100, gt=0)
    weight_decay: float = Field(default=0.1, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(default=1.0, ge=0.0)  # 0 disables clipping
    zero: Literal["zero0", "zero1", "zero2", "zero3", "zero2_offload"] = "zero0"
    precision: Literal["fp32", "bf16", "auto"] = "auto"
    # AdamW kernel (models.optim.OptimizerKernel): auto is fused where torch has it, else foreach.
    optimizer_kernel: Literal["auto", "fused", "foreach", "for_loop"] = "auto"
    # torch.compile the model inside the engine (in place: checkpoints and exports keep their keys). Pays off on
    # a GPU for long runs; the first steps then include the compilation, and the CPU build needs a C++ compiler.
    torch_compile: bool = False
    ckpt_every: int = Field(default=0, ge=0)  # 0: only at the end
    keep_checkpoints: int = Field(default=2, gt=0)  # older checkpoint folders are deleted
    eval_every: int = Field(default=0, ge=0)  # 0: only at the end
    eval_batches: int = Field(default=4, ge=0)
    log_every: int = Field(default=10, gt=0)
    seed: int = 0
    max_bad_steps: int = Field(default=5, gt=0)  # consecutive non-finite steps before failing
    peak_flops: float | None = Field(default=None, gt=0)  # per-rank FLOP/s for MFU; None: measure once

    def tokens_per_step(self, world: int) -> int:
        return self.micro_batch_size * self.seq_len * self.grad_accum * world

    def train_config(self) -> "TrainConfig":
        """Only the loop's fields (a stage's config adds its own)."""
        return TrainConfig(**self.model_dump(include=set(TrainConfig.model_fields)))
