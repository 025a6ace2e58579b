"""The training loop driven from a test: `train` (a batch function and a loss) and `grpo_train` (GRPO on problems).

Both run the one loop (tasks/training/loop.py `fit`) in this process, as a one-rank DeepSpeed engine, with the
same Steps the stages give it: `LossSteps` for pretraining and SFT, `GrpoSteps` for GRPO.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tasks.eval.answers import AnswerScore
from tasks.training.config import GrpoConfig, TrainingConfig
from tasks.training.grpo.rollouts import Problem
from tasks.training.grpo.steps import GrpoSteps, grpo_shape, samples_text
from tasks.training.loop import LossSteps, fit
from tasks.training.metrics import MetricsSink
from tasks.training.types import Batch, BatchFn, LossFn, TrainResult

MetricsLog = Callable[[dict, int], Any]


def train(model: torch.nn.Module, cfg: TrainingConfig, train_batches: BatchFn, eval_batches: BatchFn | None,
          loss_fn: LossFn, ckpt_dir: Path | None, log: MetricsSink, *, batch_tokens: Callable[[Batch], int] | None = None,
          **kw: Any) -> TrainResult:
    """`fit` with pretraining's and SFT's Steps: `train_batches(i, rank, world)` returns micro-batch i
    (= step * grad_accum + k), `loss_fn(engine, batch)` a scalar loss or (loss, named parts)."""
    steps = LossSteps(cfg, train_batches, eval_batches, loss_fn, batch_tokens)
    b = cfg.batch
    return fit(model, cfg, steps, ckpt_dir, log, micro_batch_size=b.micro_batch_size, grad_accum=b.grad_accum,
               seq_len=b.seq_len, **kw)


@dataclass
class GrpoRun:
    """What `grpo_train` ended with: the policy, the rollout metrics of every step, samples, held-out scores."""

    policy: torch.nn.Module
    history: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    eval_before: AnswerScore | None = None
    eval_after: AnswerScore | None = None
    seconds: float = 0.0
    skipped_steps: int = 0
    resumed_from: int | None = None

    def samples_text(self) -> str:
        return samples_text(self.samples)


class _LogCallback:
    """A `log(metrics, step)` callable as the loop's metrics sink."""

    def __init__(self, log: MetricsLog) -> None:
        self.log = log

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.log(metrics, step)


def grpo_train(policy: torch.nn.Module, reference: torch.nn.Module, tokenizer: Any, problems: Sequence[Problem],
               cfg: GrpoConfig, log: MetricsLog | None = None, eval_problems: Sequence[Problem] | None = None,
               ckpt_dir: Path | None = None, echo: Callable[[str], Any] | None = None,
               ds_config: dict[str, Any] | None = None) -> GrpoRun:
    """Train `policy` with GRPO on `problems` through the one loop; `reference` stays frozen. With `eval_problems`
    the first cfg.eval_prompts are scored greedily before and after; with `ckpt_dir` it checkpoints and resumes."""
    if not problems:
        raise ValueError("grpo_train needs at least one problem")
    if policy is reference:
        raise ValueError("reference must be a separate frozen copy of the policy (copy.deepcopy(policy))")
    for name, model in (("policy", policy), ("reference", reference)):
        if model.cfg.vocab_size < tokenizer.get_vocab_size():
            raise ValueError(f"{name} vocab_size={model.cfg.vocab_size} is smaller than the tokenizer's "
                             f"{tokenizer.get_vocab_size()}")
    steps = GrpoSteps(reference, tokenizer, problems, cfg, eval_problems)
    sink = _LogCallback(log or (lambda metrics, step: None))
    trained = fit(policy, cfg, steps, ckpt_dir, sink, **grpo_shape(cfg), echo=echo, ds_config=ds_config)
    return GrpoRun(policy=trained.engine.module, history=[h for h in trained.history if "reward_mean" in h],
                   samples=steps.samples, eval_before=steps.eval_before, eval_after=steps.eval_after,
                   seconds=steps.seconds(), skipped_steps=trained.skipped_steps, resumed_from=trained.resumed_from)
