"""The types the loop and its parts share: a stage's Steps and their StepStats, what `fit` returns, batch and loss shapes.

A stage gives the loop (tasks/training/loop.py) a `Steps`: its optimizer step, its validation and the state a
checkpoint carries for it. Every step returns a `StepStats` that all ranks agree on; `fit` ends with a
`TrainResult`. Nothing here runs anything: every module of the training wing can import it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

Batch = Any  # whatever a stage's batches return and its loss understands; tensors inside are moved to the device
BatchFn = Callable[[int, int, int], Batch]  # (micro-batch index, rank, world size) -> batch
# A loss, or (loss, parts): named detached scalars, e.g. the loss of each data source in a mixed
# batch, averaged like the loss and logged beside it. Every micro-batch returns the same names.
LossParts = dict[str, torch.Tensor]
LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor | tuple[torch.Tensor, LossParts]]
# (nats summed, UTF-8 bytes summed) of a validation batch's predicted tokens, for bits per byte.
BpbFn = Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]
Echo = Callable[[str], Any]  # where rank 0 prints its progress lines


@dataclass
class StepStats:
    """One loop step, agreed on by every rank."""

    lr: float  # the lr this step used
    loss: float | None  # mean over micro-batches and ranks; None when the step was skipped
    n_nonfinite: int  # micro-batches (all ranks) with a non-finite loss
    tokens: int  # fed by all ranks
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)  # the loss's named parts, averaged like it; {} when skipped


class Steps(Protocol):
    """What a stage gives the loop: its step, its validation, and its own checkpoint state.

    `updates_per_step` is how many optimizer steps one loop step makes (GRPO updates each sampled batch several
    times): the learning-rate schedule counts those. An `echoed` attribute (names of the step's parts) limits what
    the progress line shows; without one it shows every part (the loss's parts, e.g. SFT's sft_loss and replay_loss).
    """

    updates_per_step: int

    def step(self, engine, step: int, rank: int, world: int) -> StepStats:
        """One loop step; rank and world are this rank's data-parallel ones (tasks/training/parallel.py)."""

    def validate(self, engine, rank: int, world: int) -> dict[str, float] | None:
        """Validation metrics (`val_loss` among them when there is one); None: nothing to validate."""

    def start(self, engine) -> dict[str, float] | None:
        """Before the first step of a fresh run: metrics logged at step 0 (GRPO scores the starting policy)."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint carries for the stage besides the engine, the RNG and the loop's counters."""

    def load_state(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainResult:
    """What a training run ended with; `history` holds every metrics record rank 0 logged.

    The names are the ones the stages' results and their MLflow runs keep (final_train_loss, final_val_loss, ...).
    """

    steps: int
    final_train_loss: float | None
    final_val_loss: float | None
    final_val_ppl: float | None
    tokens_seen: int
    train_tokens_per_s: float | None  # training throughput of this session, eval and checkpoints excluded
    skipped_steps: int
    resumed_from: int | None  # the checkpoint step this session started from; None for a fresh run
    world_size: int
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)
    final_val_parts: dict[str, float] = field(default_factory=dict)  # the loss's parts at the last validation
    final_val_bpb: float | None = None  # bits per byte at the last validation, when the stage measures it
    engine: Any = field(default=None, repr=False)  # the trained engine (its .module is the model)
    layout: Any = field(default=None, repr=False)  # tasks/training/parallel.py's RankLayout the ranks trained in
    memory: dict[str, Any] = field(default_factory=dict)  # parallel.memory_record: layout, planned and peak bytes
