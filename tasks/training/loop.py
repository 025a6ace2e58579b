"""The generic DeepSpeed training loop shared by pretraining and SFT.

    engine = deepspeed.initialize(model, our AdamW groups, our LambdaLR, JSON for the ZeRO stage)
    for step in range(resumed_step, max_steps):
        for each micro-batch: loss = loss_fn(engine, train_batches(micro, rank, world)); backward; step
        one all-reduce: mean loss + "was any loss non-finite?"  -> skipped/failed steps agree on all ranks
        log / eval / checkpoint on their schedules

Data order is a pure function of (micro-batch index, rank, world), so resuming needs only the
step count; the checkpoint also carries each rank's RNG states so anything random in the
model (dropout) or the loss continues exactly as in an uninterrupted run.
"""
from __future__ import annotations

import contextlib

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import Field

from infra.config import StrictModel
from infra.deepspeed_launch import build_ds_config, free_port, resolve_precision
from models.optim import GuardedAdamW, build_adamw, build_scheduler
from infra.atomic import atomic_path
from tasks.data.manifest import ChecksumError, sha256_file

Batch = Any  # whatever train_batches returns and loss_fn understands; tensors inside are moved to the device
BatchFn = Callable[[int, int, int], Batch]  # (micro-batch index, rank, world size) -> batch
LossFn = Callable[[torch.nn.Module, Batch], torch.Tensor]

CKPT_TAG_PREFIX = "step"
CKPT_SUMS_FILE = "SHA256SUMS.json"  # per checkpoint folder: DeepSpeed itself records no checksums


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


class MetricsSink(Protocol):
    """Where rank 0 sends metrics."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...


class ListSink:
    """Keeps every logged (step, metrics) pair in memory (tests, plots)."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.records.append((step, dict(metrics)))

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, in logging order."""
        pairs = [(s, m[name]) for s, m in self.records if name in m]
        return [s for s, _ in pairs], [v for _, v in pairs]


class MlflowSink:
    """Logs to the active MLflow run (opened with infra.tracking.stage_run); only rank 0 writes."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.rank != 0:
            return
        import mlflow

        # MLflow rejects NaN/inf metric values on some stores; a skipped step's loss is reported as such.
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if clean:
            mlflow.log_metrics(clean, step=step)


class NonFiniteLossError(RuntimeError):
    """Training produced max_bad_steps non-finite losses in a row."""


@dataclass
class TrainResult:
    """What a training run ended with; `history` holds every metrics record rank 0 logged."""

    steps: int
    final_loss: float | None
    final_val_loss: float | None
    final_val_ppl: float | None
    tokens_seen: int
    tokens_per_s: float | None  # training throughput of this session, eval and checkpoints excluded
    skipped_steps: int
    resumed_from: int | None
    world_size: int
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)


# ----------------------------------------------------------------------------- distributed setup


def init_distributed() -> tuple[int, int]:
    """Join the process group the launcher described, or make a one-rank group in this process.

    Returns (rank, world size). DeepSpeed's engine reads LOCAL_RANK etc. from the environment,
    so the single-process case sets them (only if absent) before initialising.
    """
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        if "RANK" not in os.environ:
            for key, value in {
                "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            }.items():
                os.environ.setdefault(key, value)
        deepspeed.init_distributed(auto_mpi_discovery=False, verbose=False)
    return dist.get_rank(), dist.get_world_size()


def measure_peak_flops(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                       n: int | None = None, min_seconds: float = 1.0) -> float:
    """FLOP/s of square matmuls (torch.mm) on `device`: the practical peak that MFU is quoted against."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up: thread pools, kernel selection
    sync()
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and reps >= 3:
            break
    return 2.0 * n**3 * reps / elapsed


def _to_device(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


# ----------------------------------------------------------------------------- RNG and checkpoints


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def checkpoint_tags(ckpt_dir: Path) -> list[str]:
    """Checkpoint folders written by `train`, oldest first."""
    if not Path(ckpt_dir).is_dir():
        return []
    return sorted(p.name for p in Path(ckpt_dir).iterdir() if p.is_dir() and p.name.startswith(CKPT_TAG_PREFIX))


def latest_checkpoint_step(ckpt_dir: Path) -> int | None:
    """The step of the checkpoint a resume would load (DeepSpeed's `latest` file), or None."""
    latest = Path(ckpt_dir) / "latest"
    if not latest.is_file():
        return None
    return int(latest.read_text().strip().removeprefix(CKPT_TAG_PREFIX))


def write_checkpoint_sums(tag_dir: Path) -> Path:
    """Record the sha256 of every file of a finished checkpoint folder in its SHA256SUMS.json."""
    tag_dir = Path(tag_dir)
    sums = {
        p.relative_to(tag_dir).as_posix(): sha256_file(p)
        for p in sorted(tag_dir.rglob("*"))
        if p.is_file() and p.name != CKPT_SUMS_FILE
    }
    path = tag_dir / CKPT_SUMS_FILE
    tmp = atomic_path(path)
    tmp.write_text(json.dumps(sums, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # written last and atomically: its presence means the save completed
    return path


def verify_checkpoint(tag_dir: Path) -> None:
    """Raise ChecksumError naming the first missing, changed or unlisted-truncated file of a checkpoint."""
    tag_dir = Path(tag_dir)
    sums_path = tag_dir / CKPT_SUMS_FILE
    if not sums_path.is_file():
        raise ChecksumError(f"{sums_path}: missing, so {tag_dir} may be incomplete; delete that folder "
                            "(and fix 'latest') to resume from an earlier checkpoint, or delete the "
                            "checkpoints folder to start over")
    for rel, expected in json.loads(sums_path.read_text(encoding="utf-8")).items():
        path = tag_dir / rel
        if not path.is_file():
            raise ChecksumError(f"{path}: listed in {sums_path} but missing; the checkpoint is damaged")
        actual = sha256_file(path)
        if actual != expected:
            raise ChecksumError(f"{path}: sha256 {actual[:12]}… != {expected[:12]}… in {sums_path}; "
                                "the checkpoint file is corrupted or truncated")


def resume_tag(ckpt_dir: Path) -> str | None:
    """The checkpoint folder a resume loads: the one 'latest' names, or None if there is none.

    A run killed after DeepSpeed wrote 'latest' but before SHA256SUMS.json leaves a newest
    folder without sums; the resume then falls back to the newest older folder that has them.
    A folder whose sums do not match raises ChecksumError (never silently skipped).
    """
    ckpt_dir = Path(ckpt_dir)
    step = latest_checkpoint_step(ckpt_dir)
    if step is None:
        return None
    tag = f"{CKPT_TAG_PREFIX}{step:08d}"
    if not (ckpt_dir / tag / CKPT_SUMS_FILE).is_file():
        older = [t for t in checkpoint_tags(ckpt_dir) if t < tag and (ckpt_dir / t / CKPT_SUMS_FILE).is_file()]
        if older:
            tag = older[-1]
    verify_checkpoint(ckpt_dir / tag)
    return tag


def _all_gather(obj: Any, world: int) -> list[Any]:
    import torch.distributed as dist

    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _save_checkpoint(engine, ckpt_dir: Path, step: int, client_state: dict[str, Any], rank: int, world: int,
                     keep: int) -> Path:
    import torch.distributed as dist

    # Every rank's RNG goes into the one client_state file that rank 0 writes.
    state = dict(client_state, rng=_all_gather(_rng_state(), world))
    tag = f"{CKPT_TAG_PREFIX}{step:08d}"
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=state)
    dist.barrier()
    if rank == 0:
        write_checkpoint_sums(Path(ckpt_dir) / tag)
        for old in checkpoint_tags(ckpt_dir)[:-keep]:
            shutil.rmtree(Path(ckpt_dir) / old, ignore_errors=True)
    dist.barrier()
    return Path(ckpt_dir) / tag


# ----------------------------------------------------------------------------- the loop


def _make_engine(model: torch.nn.Module, cfg: TrainConfig):
    import deepspeed

    ds_config = build_ds_config(cfg.zero, cfg)
    plain = cfg.zero == "zero0" and resolve_precision(cfg.precision) == "fp32"
    if plain:
        # Without a ZeRO/bf16 wrapper DeepSpeed steps our optimizer even on NaN gradients and
        # does not report the grad norm; GuardedAdamW clips, reports and skips instead.
        optimizer = GuardedAdamW(
            model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, max_grad_norm=cfg.grad_clip
        )
        ds_config["gradient_clipping"] = 0.0
    else:
        optimizer = build_adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
    scheduler = build_scheduler(optimizer, cfg)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    return engine


def _default_flops_per_token(model: torch.nn.Module, seq_len: int) -> float | None:
    mcfg = getattr(model, "cfg", None)
    if mcfg is None:
        return None
    try:
        from models.flops import flops_per_token

        return flops_per_token(mcfg, seq_len)
    except (ImportError, AttributeError, TypeError):
        return 6.0 * sum(p.numel() for p in model.parameters())


def evaluate(engine, eval_batches: BatchFn, loss_fn: LossFn, n_batches: int, rank: int, world: int) -> float:
    """Mean loss over n_batches per rank, averaged over ranks; the model is left in train mode."""
    import torch.distributed as dist

    engine.eval()
    total = torch.zeros((), dtype=torch.float64, device=engine.device)
    with torch.no_grad():
        for i in range(n_batches):
            total += loss_fn(engine, _to_device(eval_batches(i, rank, world), engine.device)).double()
    engine.train()
    if world > 1:
        dist.all_reduce(total)
    return float(total) / (n_batches * world)


def train(
    model: torch.nn.Module,
    cfg: TrainConfig,
    train_batches: BatchFn,
    eval_batches: BatchFn | None,
    loss_fn: LossFn,
    ckpt_dir: Path,
    log: MetricsSink,
    *,
    flops_per_token: float | None = None,
    batch_tokens: Callable[[Batch], int] | None = None,
    echo: Callable[[str], Any] | None = None,
) -> TrainResult:
    """Train `model` with DeepSpeed until cfg.max_steps, resuming from ckpt_dir's latest checkpoint if any.

    `train_batches(i, rank, world)` returns micro-batch i (= step * grad_accum + k) of this rank;
    it must be a pure function of its arguments (and the seed it was built with) for resumes
    to be exact. `loss_fn(engine, batch)` returns a scalar loss. Rank 0 sends metrics to `log`
    and, when given, one line per log step to `echo`. `batch_tokens(batch)` counts the tokens a
    micro-batch really feeds the model, for tokens/s and MFU when batches are padded per batch
    and shorter than seq_len (SFT); without it every micro-batch counts micro_batch_size * seq_len.
    """
    import torch.distributed as dist

    rank, world = init_distributed()
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    _seed_all(cfg.seed + rank)
    engine = _make_engine(model, cfg)
    device = engine.device

    start, client = 0, {}
    tag = resume_tag(ckpt_dir)  # every rank checks the sums, so a bad checkpoint fails all ranks alike
    if tag is not None:
        load_path, client = engine.load_checkpoint(str(ckpt_dir), tag=tag)
        if load_path is None:
            raise RuntimeError(f"{ckpt_dir}: 'latest' names a checkpoint DeepSpeed could not load; delete it to start over")
        client = client or {}
        start = int(client["step"])
        if client.get("world_size", world) != world and rank == 0 and echo:
            echo(f"resuming a {client['world_size']}-rank checkpoint with {world} ranks: the data order changes")
        rngs = client.get("rng") or []
        if rank < len(rngs):
            _set_rng_state(rngs[rank])

    fpt = flops_per_token if flops_per_token is not None else _default_flops_per_token(model, cfg.seq_len)
    peak = cfg.peak_flops
    if peak is None and rank == 0 and fpt is not None:
        peak = measure_peak_flops(device, torch.bfloat16 if resolve_precision(cfg.precision) == "bf16" else torch.float32)

    tokens_per_step = cfg.tokens_per_step(world)
    tokens_seen = int(client.get("tokens_seen", start * tokens_per_step))
    skipped = int(client.get("skipped_steps", 0))
    bad_run = int(client.get("consecutive_bad", 0))
    last_loss: float | None = client.get("last_loss")
    last_val: float | None = client.get("last_val_loss")
    # Carried in the checkpoint so a resumed run's loss curve starts at step 1, not at the resume.
    history: list[dict[str, float]] = list(client.get("history") or [])
    train_time, train_tokens = 0.0, 0
    window_losses: list[float] = []
    window_time, window_tokens = 0.0, 0
    checkpoint: Path | None = ckpt_dir / f"{CKPT_TAG_PREFIX}{start:08d}" if start else None

    engine.train()
    for step in range(start, cfg.max_steps):
        t0 = time.perf_counter()
        lr = float(engine.get_lr()[0])
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        nonfinite = torch.zeros((), dtype=torch.float64, device=device)
        fed = torch.zeros((), dtype=torch.float64, device=device)
        for k in range(cfg.grad_accum):
            batch = _to_device(train_batches(step * cfg.grad_accum + k, rank, world), device)
            fed += batch_tokens(batch) if batch_tokens else cfg.micro_batch_size * cfg.seq_len
            loss = loss_fn(engine, batch)
            if not loss.requires_grad:
                raise TypeError("loss_fn must return a scalar tensor attached to the model's graph (requires_grad)")
            detached = loss.detach().double()
            loss_sum += torch.nan_to_num(detached, nan=0.0, posinf=0.0, neginf=0.0)
            nonfinite += (~torch.isfinite(detached)).double()
            # A non-finite loss still goes through backward: its NaN gradients make DeepSpeed's
            # overflow check (or GuardedAdamW) skip the update on every rank, with no special path.
            engine.backward(loss)
            engine.step()
        stats = torch.stack([loss_sum, nonfinite, fed])
        if world > 1:
            dist.all_reduce(stats)
        n_nonfinite = int(stats[1].item())
        step_tokens = int(stats[2].item())  # summed over ranks by the same all_reduce
        bad = n_nonfinite > 0 or not engine.was_step_applied()
        done = step + 1
        elapsed = time.perf_counter() - t0
        train_time += elapsed
        train_tokens += step_tokens
        window_time += elapsed
        window_tokens += step_tokens
        tokens_seen += step_tokens

        if bad:
            skipped += 1
            bad_run += 1
            if rank == 0:
                log.log_metrics({"skipped_step": 1.0, "nonfinite_losses": float(n_nonfinite)}, done)
                if echo:
                    echo(f"step {done}: non-finite loss on {n_nonfinite} micro-batch(es); update skipped "
                         f"({bad_run}/{cfg.max_bad_steps} in a row)")
            if bad_run >= cfg.max_bad_steps:
                raise NonFiniteLossError(
                    f"{bad_run} consecutive steps (up to step {done}) had a non-finite loss or gradient; "
                    "lower lr, raise warmup_steps or check the data; the last good checkpoint is in "
                    f"{ckpt_dir}"
                )
        else:
            bad_run = 0
            last_loss = float(stats[0].item()) / (cfg.grad_accum * world)
            window_losses.append(last_loss)

        if done % cfg.log_every == 0 or done == cfg.max_steps:
            if rank == 0 and window_losses:
                tps = window_tokens / window_time if window_time > 0 else 0.0
                grad_norm = engine.get_global_grad_norm()
                metrics = {
                    "loss": sum(window_losses) / len(window_losses),
                    "lr": lr,
                    "tokens_per_s": tps,
                    "tokens_seen": float(tokens_seen),
                }
                if grad_norm is not None and not bad:
                    metrics["grad_norm"] = float(grad_norm)
                if fpt is not None and peak:
                    metrics["mfu"] = fpt * tps / (peak * world)
                log.log_metrics(metrics, done)
                history.append({"step": float(done), **metrics})
                if echo:
                    echo(f"step {done}/{cfg.max_steps} loss {metrics['loss']:.4f} lr {lr:.2e} "
                         f"{tps:,.0f} tok/s" + (f" mfu {metrics['mfu']:.1%}" if "mfu" in metrics else ""))
            window_losses, window_time, window_tokens = [], 0.0, 0

        is_eval = done == cfg.max_steps or (cfg.eval_every and done % cfg.eval_every == 0)
        if is_eval and eval_batches is not None and cfg.eval_batches > 0:
            last_val = evaluate(engine, eval_batches, loss_fn, cfg.eval_batches, rank, world)
            if rank == 0:
                val_metrics = {"val_loss": last_val, "val_ppl": _ppl(last_val)}
                log.log_metrics(val_metrics, done)
                history.append({"step": float(done), **val_metrics})
                if echo:
                    echo(f"step {done}: val_loss {last_val:.4f} val_ppl {val_metrics['val_ppl']:.2f}")

        if done == cfg.max_steps or (cfg.ckpt_every and done % cfg.ckpt_every == 0):
            client_state = {
                "step": done,
                "data_position": done * cfg.grad_accum,  # next micro-batch index
                "world_size": world,
                "tokens_seen": tokens_seen,
                "skipped_steps": skipped,
                "consecutive_bad": bad_run,
                "last_loss": last_loss,
                "last_val_loss": last_val,
                "history": history,
            }
            checkpoint = _save_checkpoint(engine, ckpt_dir, done, client_state, rank, world, cfg.keep_checkpoints)

    return TrainResult(
        steps=max(start, cfg.max_steps),
        final_loss=last_loss,
        final_val_loss=last_val,
        final_val_ppl=_ppl(last_val) if last_val is not None else None,
        tokens_seen=tokens_seen,
        tokens_per_s=train_tokens / train_time if train_time > 0 else None,
        skipped_steps=skipped,
        resumed_from=start or None,
        world_size=world,
        checkpoint=checkpoint,
        history=history,
    )


def _ppl(loss: float) -> float:
    # exp overflows past ~709; an untrained model's perplexity is the vocab size, far below.
    return math.exp(min(loss, 700.0))


def full_parameters(model: torch.nn.Module, zero: str):
    """Context in which every rank sees whole parameters (ZeRO-3 keeps only a shard per rank)."""
    if zero != "zero3":
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


def loss_curve(result: "TrainResult", path: Path, title: str) -> Path | None:
    """Plot the train and validation losses of a finished run; None when nothing was logged."""
    from tasks.reports.plots import loss_curve_png

    train = [(h["step"], h["loss"]) for h in result.history if "loss" in h]
    val = [(h["step"], h["val_loss"]) for h in result.history if "val_loss" in h]
    series = {name: pts for name, pts in (("train loss", train), ("val loss", val)) if pts}
    if not series:
        return None
    return loss_curve_png(
        {name: [s for s, _ in pts] for name, pts in series.items()},
        {name: [v for _, v in pts] for name, pts in series.items()},
        path,
        title=title,
    )
