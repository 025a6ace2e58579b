"""The evaluation's config, apart from the evaluation: the pipeline config composes it without importing torch."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from infra.config import StrictModel
from tasks.eval.rewards import check_reward_names


class EvalConfig(StrictModel):
    """How much to evaluate and how: bins, token budget, temperature study, how many arithmetic questions."""

    # What the models are evaluated on and the training data is decontaminated against: "arithmetic" (the built-in
    # questions below) and lm-evaluation-harness tasks by name, from its registry or from the YAML folders of
    # task_paths
    tasks: list[str] = Field(default_factory=lambda: ["arithmetic"])
    task_paths: list[Path] = Field(default_factory=list)
    n_bins: int = Field(default=15, ge=1)
    max_tokens: int = Field(default=16384, ge=1)  # next-token predictions evaluated, from the start of val
    seq_len: int | None = Field(default=None, ge=1)  # window length; None: the model's max_seq_len
    batch_size: int = Field(default=8, ge=1)
    # Logits of this many randomly chosen predictions are kept (float16) for temperature
    # scaling: memory is temperature_tokens * vocab * 2 bytes.
    temperature_tokens: int = Field(default=8192, ge=2)
    temperature_fit_fraction: float = Field(default=0.5, gt=0.0, lt=1.0)
    # Arithmetic questions from the held-out "eval" split of the arithmetic task's outer range (the pipeline's
    # `arithmetic:` section); answers are also scored on those within its trained range.
    n_questions: int = Field(default=100, ge=0)
    max_new_tokens: int = Field(default=16, ge=1)  # an answer's budget; "<answer>unknown</answer>" and <|end|> must fit
    answer_batch_size: int = Field(default=64, ge=1)  # prompts generated (or options scored) together
    reward: str = "arithmetic_exact"
    # Models (by their name in the eval flow) that never saw the chat template: asked with a
    # few-shot completion prompt (`few_shot` worked examples from the "sft" split) instead.
    few_shot_models: list[str] = Field(default_factory=lambda: ["base"])
    few_shot: int = Field(default=3, ge=1)
    multiple_choice: bool = True  # also score each question as 4 options by their likelihood
    answer_bin_strategy: Literal["uniform", "quantile"] = "quantile"  # reliability bins of answers: equal mass by default
    bootstrap_resamples: int = Field(default=1000, ge=2)  # for the ECE, perplexity and bits-per-byte intervals
    target_accuracy: float = Field(default=0.9, gt=0.0, le=1.0)  # selective prediction: the threshold that reaches it
    seed: int = 0
    device: str | None = None  # evaluate_checkpoint only; None: cuda when available, else cpu

    @field_validator("tasks")
    @classmethod
    def _tasks_named_once(cls, tasks: list[str]) -> list[str]:
        twice = sorted({t for t in tasks if tasks.count(t) > 1})
        if twice or any(not t.strip() for t in tasks):
            raise ValueError(f"eval.tasks {tasks}: each task once, by a non-empty name")
        return tasks

    @field_validator("reward")
    @classmethod
    def _reward_known(cls, name: str) -> str:
        check_reward_names("eval.reward", [name])
        return name
