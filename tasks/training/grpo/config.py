"""GRPO's configs, apart from the loop and the stage: the pipeline config composes them without importing torch."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from infra.config import StrictModel
from tasks.eval.gsm8k import Gsm8kSource


class GrpoConfig(StrictModel):
    """One GRPO run."""

    group_size: int = Field(default=8, ge=2)  # completions per prompt (G)
    prompts_per_step: int = Field(default=8, gt=0)
    max_new_tokens: int = Field(default=16, gt=0)
    temperature: float = Field(default=1.0, gt=0)  # > 0: a greedy group would hold G copies of one answer
    top_p: float = Field(default=1.0, gt=0, le=1)
    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(default=1.0, ge=0)  # 0 disables clipping
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    beta: float = Field(default=0.04, ge=0)  # weight of the KL penalty towards the reference
    updates_per_batch: int = Field(default=2, gt=0)  # optimizer steps on each sampled batch
    steps: int = Field(default=50, gt=0)
    seed: int = 0
    rewards: dict[str, float] = Field(default_factory=lambda: {"arithmetic_exact": 1.0, "format": 0.1})
    accuracy_reward: str = "arithmetic_exact"  # a completion is correct when this reward is >= 1
    # ZeRO-3 is not offered: it partitions the weights, and the step-by-step KV-cache sampler
    # would then gather every layer on every token. The LR is constant (no schedule), as usual for GRPO.
    zero: Literal["zero0", "zero1", "zero2"] = "zero0"
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    # AdamW kernel (models.optim.OptimizerKernel): auto is fused where torch has it, else foreach.
    optimizer_kernel: Literal["auto", "fused", "foreach", "for_loop"] = "auto"
    eval_prompts: int = Field(default=64, ge=0)  # held-out prompts scored greedily before and after
    samples_every: int = Field(default=10, gt=0)  # keep sample completions every this many steps
    samples_per_step: int = Field(default=2, ge=0)
    ckpt_every: int = Field(default=10, ge=0)  # 0: only at the end (when grpo_train is given a ckpt_dir)
    keep_checkpoints: int = Field(default=2, gt=0)  # older checkpoint folders are deleted


class GrpoStageConfig(GrpoConfig):
    """Every GrpoConfig field, the problems to train and score on, and launch settings."""

    max_new_tokens: int = Field(default=24, gt=0)  # "<answer>nn</answer>" is ~16 tokens, plus <|end|>
    # arithmetic: the "grpo" split of tasks/eval/arithmetic.py to train on, its "eval" split to score on;
    # gsm8k: word problems from `gsm8k` (train_split to train on, eval_split to score on; tasks/eval/gsm8k.py).
    task: Literal["arithmetic", "gsm8k"] = "arithmetic"
    gsm8k: Gsm8kSource = Field(default_factory=Gsm8kSource)
    n_train_problems: int = Field(default=200, gt=0)  # drawn from the task's training split
    max_operand: int = Field(default=20, ge=0)  # keep equal to the SFT arithmetic options
    ops: str = "+-"
    problem_seed: int = 0
    num_procs: int = Field(default=1, ge=1, le=1)  # single-rank (see the module docstring)
    export_hf: bool = True
    # Intra-op threads; tiny models on a shared CPU run far faster on 1 than on many.
    torch_threads: int | None = Field(default=None, gt=0)

    def grpo_config(self) -> GrpoConfig:
        return GrpoConfig(**self.model_dump(include=set(GrpoConfig.model_fields)))
