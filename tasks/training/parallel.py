"""The rank side of a launch layout (launch.dp x tp x pp): who shares data, the model split, its whole again.

    layout = RankLayout.of(cfg.launch, rank, world)   # data_rank, data_world: what the batches are cut by
    model = layout.wrap(model, loss_fn)               # pp > 1: DeepSpeed's PipelineModule of the model
    steps = layout.steps(steps)                       # pp > 1: the stage's batches through engine.train_batch
    whole = layout.whole_model(engine, cfg)           # rank 0: a plain Transformer of the trained weights

Rank order: with tp, ranks (dp, tp) row-major (torch's init_device_mesh), so the tp ranks of one replica
are neighbours (on one node, where their all-reduces are cheap); with pp, DeepSpeed's own topology,
(pipe, data) row-major. Tensor-parallel ranks of a replica, and the stages of a pipeline, read the same
batches: the data is cut by data_rank and data_world only.
"""
from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.llama import Transformer
from models.losses import next_token_loss
from models.memory_plan import Layout, plan_layout
from models.pipeline import pipe_state_dict, pipeline_module
from models.tensor_parallel import full_state_dict
from tasks.training.config import LaunchConfig
from tasks.training.distributed import all_gather
from tasks.training.metrics import perplexity
from tasks.training.types import Steps, StepStats


@dataclass(frozen=True)
class RankLayout:
    dp: int
    tp: int
    pp: int
    rank: int

    @classmethod
    def of(cls, launch: LaunchConfig, rank: int, world: int) -> "RankLayout":
        dp = world // (launch.tp * launch.pp)
        if dp * launch.tp * launch.pp != world or (launch.dp is not None and launch.dp != dp):
            raise ValueError(f"launch dp={launch.dp} x tp={launch.tp} x pp={launch.pp} does not fit the {world} ranks "
                             "that were started; launch with num_procs x nodes = dp x tp x pp")
        return cls(dp, launch.tp, launch.pp, rank)

    @property
    def data_rank(self) -> int:
        if self.tp > 1:
            return self.rank // self.tp
        if self.pp > 1:
            return self.rank % self.dp
        return self.rank

    @property
    def data_world(self) -> int:
        return self.dp

    def __str__(self) -> str:
        return f"dp{self.dp}_tp{self.tp}_pp{self.pp}"

    # ------------------------------------------------------------------------- before the engine

    def wrap(self, model: torch.nn.Module, seed: int) -> torch.nn.Module:
        """The module DeepSpeed is handed: the model itself, or (pp > 1) its PipelineModule with the loss inside."""
        if self.pp == 1:
            return model
        return pipeline_module(model, self.pp, next_token_loss, seed)

    def steps(self, steps: Steps) -> Steps:
        """The stage's Steps, or (pp > 1) PipelineSteps over its batches."""
        return PipelineSteps(steps) if self.pp > 1 else steps

    # ------------------------------------------------------------------------- after training

    def whole_model(self, engine, model_cfg) -> torch.nn.Module | None:
        """Rank 0: a plain Transformer holding the trained weights (gathered from every shard or stage); others:
        None. A collective: every rank calls it."""
        if self.tp == 1 and self.pp == 1:
            return engine.module
        if self.tp > 1:
            state = full_state_dict(engine.module)
        else:
            state = {}
            for part in all_gather(pipe_state_dict(engine.module) if self.data_rank == 0 else {}, self.dp * self.pp):
                state.update(part)
        if self.rank != 0:
            return None
        model = Transformer(model_cfg)
        if model_cfg.tie_embeddings:
            state["lm_head.weight"] = state["embed.weight"]
        model.load_state_dict({k: v.cpu() for k, v in state.items()})
        return model


class PipelineSteps:
    """A stage's Steps under pipeline parallelism: the same batches, through DeepSpeed's 1F1B schedule.

    engine.train_batch runs grad_accum micro-batches (each drawn as LossSteps draws them, so the data
    order is the same as any other layout's), forward, backward and the optimizer step; the loss is the
    PipelineModule's (next-token cross-entropy, pretraining's loss), averaged over micro-batches and data
    replicas by DeepSpeed and given to every stage. Validation is the mean of engine.eval_batch over the
    same validation batches (no bits per byte: its byte counts need the logits, which only the last stage has).
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.cfg = inner.cfg
        self.updates_per_step = inner.updates_per_step

    def step(self, engine, step: int, rank: int, world: int) -> StepStats:
        b = self.cfg.batch
        t0 = time.perf_counter()
        lr = float(engine.get_lr()[0])
        batches = iter([self.inner.train_batches(step * b.grad_accum + k, rank, world) for k in range(b.grad_accum)])
        loss = float(engine.train_batch(data_iter=batches))
        finite = loss == loss and abs(loss) != float("inf")
        bad = not finite or not engine.was_step_applied()
        tokens = b.grad_accum * b.micro_batch_size * b.seq_len * world
        return StepStats(lr, None if bad else loss, 0 if finite else b.grad_accum * world, tokens,
                         time.perf_counter() - t0)

    def validate(self, engine, rank: int, world: int) -> dict[str, float] | None:
        n = self.cfg.log.eval_batches
        if self.inner.eval_batches is None or n == 0:
            return None
        total = 0.0
        for i in range(n):
            # One micro-batch per eval_batch: the validation batches are LossSteps' own, one at a time.
            total += float(engine.eval_batch(iter([self.inner.eval_batches(i, rank, world)]), num_micro_batches=1))
        loss = total / n  # eval_batch averages over data replicas already
        return {"val_loss": loss, "val_ppl": perplexity(loss)}

    def start(self, engine) -> dict[str, float] | None:
        return self.inner.start(engine)

    def state(self) -> dict[str, Any]:
        return self.inner.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.inner.load_state(state)


# ----------------------------------------------------------------------------- memory, planned and measured


_PROC_STATUS = Path("/proc/self/status")


def peak_bytes() -> int:
    """This rank's peak memory since its last `reset_peak_bytes`: the GPU's max_memory_allocated, or on the CPU the
    process' peak RSS (Linux's VmHWM, which a reset clears; elsewhere ru_maxrss, the process' whole life)."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    if _PROC_STATUS.is_file():
        for line in _PROC_STATUS.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def reset_peak_bytes() -> None:
    """Start `peak_bytes` over, so that each run of a rank that trains several reports its own peak (on Linux,
    writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def memory_record(layout: RankLayout, zero: str, model_cfg, seq_len: int, micro_batch: int, precision: str,
                  world: int) -> dict[str, Any]:
    """The layout, the memory plan's per-device estimate for it (models/memory_plan.py) and every rank's measured
    peak; a collective (the peaks are gathered). The estimate counts model states, activations and DeepSpeed's
    buffers only: a CPU rank's RSS adds Python, torch and the data (a few hundred MB)."""
    peaks = all_gather(peak_bytes(), world)
    estimate = None
    if model_cfg is not None:
        try:
            estimate = plan_layout(model_cfg, Layout(layout.dp, layout.tp, layout.pp, int(zero[4])), world, seq_len,
                                   micro_batch, precision, device_mem_bytes=2**62).total_bytes
        except ValueError:  # a layout the plan does not model (e.g. a model shape it refuses): no estimate
            estimate = None
    return {"layout": str(layout), "world_size": world, "peak_bytes_per_rank": peaks,
            "plan_bytes_per_device": estimate}
