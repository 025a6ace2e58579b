"""Pretraining stage: launch `tasks.training.pretrain.worker` on N DeepSpeed ranks over the token files.

    run_pretrain(tokens_dir, tokenizer_path, out_dir, cfg, mlflow_run_id, ws_root)
      out_dir/pretrain_config.json   resolved config (model architecture included)
      out_dir/ds_config.json         the DeepSpeed config the ranks use
      out_dir/checkpoints/           DeepSpeed checkpoints; a rerun with the same out_dir resumes
      out_dir/model/                 final weights (models.export.save_model), out_dir/hf/ for transformers
      out_dir/loss_curve.png, out_dir/result.json

The Prefect task opens the MLflow stage run and passes its id to rank 0, so the metrics of
the DeepSpeed processes land in the run the pipeline shows.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import get_run_logger, task
from models.losses import next_token_loss
from tasks.training.config import RESUME_NEUTRAL, PretrainConfig
from tasks.training.engine import ds_config_for
from tasks.training.launch import (
    ExportedModel,
    StageJob,
    StageSpec,
    in_stage_run,
    job_fields,
    run_stage,
)
from tasks.training.loop import BatchFn
from tasks.training.loss_steps import epoch_orders

CONFIG_FILE = "pretrain_config.json"
WORKER_MODULE = "tasks.training.pretrain.worker"
STAGE = StageSpec(name="pretrain", label="pretrain", worker_module=WORKER_MODULE, config_file=CONFIG_FILE,
                  resume_neutral=RESUME_NEUTRAL, resume_identity={"model": "model architecture"})


class PretrainJob(StageJob):
    """What the worker processes read (out_dir/job.json)."""

    tokens_dir: Path
    config: PretrainConfig
    architecture: dict[str, Any]  # models.llama.ModelConfig fields


class PretrainResult(ExportedModel):
    """What pretraining ended with: the contents of out_dir/result.json."""

    checkpoint: Path | None
    loss_curve: Path | None
    steps: int
    final_train_loss: float | None
    val_loss: float | None
    val_ppl: float | None
    tokens_seen: int
    tokens_per_s: float | None
    skipped_steps: int
    world_size: int
    n_params: int


# ----------------------------------------------------------------------------- data


def token_window_batches(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> BatchFn:
    """Micro-batch i of a rank: `batch_size` windows of seq_len + 1 tokens, as (inputs, targets) int64.

    The corpus is cut into non-overlapping windows; each epoch visits all of them in an order
    drawn from (seed, epoch). Sample number g = (i * world + rank) * batch_size + j, so the
    batch is a pure function of (seed, i, rank, world) and a resume continues mid-epoch.
    """
    n_windows = (len(tokens) - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"{len(tokens)} tokens cannot fill one window of seq_len={seq_len} (+1 target); "
                         "use more data or a shorter seq_len")
    order = epoch_orders(n_windows, seed)

    def batch(i: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = (i * world + rank) * batch_size
        rows = np.empty((batch_size, seq_len + 1), dtype=np.int64)
        for j, g in enumerate(range(first, first + batch_size)):
            start = int(order(g // n_windows)[g % n_windows]) * seq_len
            rows[j] = tokens[start : start + seq_len + 1]
        x = torch.from_numpy(rows)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    return batch


def lm_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy of a (inputs, targets) batch."""
    inputs, targets = batch
    return next_token_loss(model(inputs), targets)


# ----------------------------------------------------------------------------- launching


def resolve_model_config(cfg: PretrainConfig, vocab_size: int) -> dict[str, Any]:
    """The architecture the worker will build, checked here so a bad config fails before launching."""
    from models.llama import model_config

    mcfg = model_config(cfg.model, vocab_size, **cfg.model_overrides)
    if cfg.batch.seq_len > mcfg.max_seq_len:
        raise ValueError(f"batch.seq_len={cfg.batch.seq_len} exceeds the model's max_seq_len={mcfg.max_seq_len}; "
                         "lower batch.seq_len or override max_seq_len in model_overrides")
    return mcfg.model_dump(mode="json")


def run_pretrain(
    tokens_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    cfg: PretrainConfig,
    mlflow_run_id: str | None,
    ws_root: Path | str | None,
    log: Callable[[str], Any] = print,
) -> PretrainResult:
    """Write the configs into out_dir, launch the DeepSpeed worker ranks, and read back result.json."""
    from tasks.tokenizer.tokenize_shards import load_token_index
    from tasks.tokenizer.train import load_tokenizer

    tokens_dir, out_dir = Path(tokens_dir), Path(out_dir)
    index = load_token_index(tokens_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    vocab_size = tokenizer.get_vocab_size()
    if index.vocab_size > vocab_size:
        raise ValueError(f"{tokens_dir} was tokenized with a {index.vocab_size}-token vocabulary but "
                         f"{tokenizer_path} has {vocab_size}; re-tokenize with this tokenizer")
    model_cfg = resolve_model_config(cfg, vocab_size)
    resolved = {"pretrain": cfg.model_dump(mode="json"), "model": model_cfg}
    job = PretrainJob(tokens_dir=tokens_dir.resolve(), config=cfg, architecture=model_cfg,
                      **job_fields(tokenizer_path, out_dir, ws_root, mlflow_run_id, cfg.launch.precision))
    ds_config = ds_config_for(cfg.optim, cfg.launch, cfg.batch.micro_batch_size, cfg.batch.grad_accum)
    return run_stage(STAGE, out_dir, resolved, job, PretrainResult, ds_config=ds_config,
                     num_procs=cfg.launch.num_procs, hostfile=cfg.launch.hostfile,
                     launcher_args=cfg.launch.launcher_args, log=log)


@task(name="pretrain")
def pretrain_task(
    tokens_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    cfg: PretrainConfig,
    ws_root: str | Path | None = None,
    mlflow_run_id: str | None = None,
) -> PretrainResult:
    """Prefect task: launch pretraining, streaming the ranks' output to the task's log.

    Rank 0 logs into `mlflow_run_id` (the calling flow's stage run); without one, the task
    opens its own "pretrain" stage run around the launch.
    """
    logger = get_run_logger()
    return in_stage_run("pretrain", cfg, ws_root, mlflow_run_id, lambda run_id, root: run_pretrain(
        tokens_dir, tokenizer_path, out_dir, cfg, run_id, root, log=logger.info))
