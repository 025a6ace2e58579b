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

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import get_run_logger, task
from pydantic import BaseModel, Field

from infra.config import StrictModel
from infra.deepspeed_launch import build_ds_config, launch_job
from infra.paths import Workspace
from infra.tracking import stage_run
from models.losses import next_token_loss
from tasks.training.loop import BatchFn, TrainConfig

CONFIG_FILE = "pretrain_config.json"
DS_CONFIG_FILE = "ds_config.json"
LOSS_CURVE_FILE = "loss_curve.png"
WORKER_MODULE = "tasks.training.pretrain.worker"

# Settings that can change between a run and its resume without changing what is trained.
_RESUME_NEUTRAL = {"log_every", "eval_every", "eval_batches", "ckpt_every", "keep_checkpoints",
                   "peak_flops", "max_bad_steps", "hostfile"}


class PretrainConfig(TrainConfig):
    """Model preset (+ overrides), every TrainConfig field, and how many ranks to launch."""

    model: str = "demo"  # a models.llama.PRESETS name
    model_overrides: dict[str, int | float | bool] = Field(default_factory=dict)
    num_procs: int = Field(default=1, gt=0)  # ranks per node (GPUs, or CPU processes)
    hostfile: Path | None = None  # DeepSpeed hostfile for multi-node runs
    export_hf: bool = True  # also write a transformers.LlamaForCausalLM folder

    def train_config(self) -> TrainConfig:
        return TrainConfig(**self.model_dump(include=set(TrainConfig.model_fields)))


class PretrainJob(StrictModel):
    """What the worker processes read (out_dir/job.json)."""

    tokens_dir: Path
    tokenizer_path: Path
    out_dir: Path
    ws_root: Path
    mlflow_run_id: str | None
    config: PretrainConfig
    architecture: dict[str, Any]  # models.llama.ModelConfig fields


class PretrainResult(BaseModel):
    """Contents of out_dir/result.json."""

    out_dir: Path
    model_dir: Path
    hf_dir: Path | None
    checkpoint: Path | None
    loss_curve: Path | None
    mlflow_run_id: str | None
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
    orders: dict[int, np.ndarray] = {}  # at most two epochs: a batch can straddle one boundary

    def order(epoch: int) -> np.ndarray:
        if epoch not in orders:
            if len(orders) >= 2:
                orders.pop(min(orders))
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(n_windows)
        return orders[epoch]

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
    if cfg.seq_len > mcfg.max_seq_len:
        raise ValueError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={mcfg.max_seq_len}; "
                         "lower seq_len or override max_seq_len in model_overrides")
    return mcfg.model_dump(mode="json")


def _check_resume_compatible(out_dir: Path, resolved: dict[str, Any]) -> None:
    old_path = out_dir / CONFIG_FILE
    if not old_path.is_file() or not (out_dir / "checkpoints" / "latest").is_file():
        return
    old = json.loads(old_path.read_text(encoding="utf-8"))
    changed = sorted(
        k for k in set(old["pretrain"]) | set(resolved["pretrain"])
        if k not in _RESUME_NEUTRAL and old["pretrain"].get(k) != resolved["pretrain"].get(k)
    )
    if old.get("model") != resolved["model"]:
        changed.append("model architecture")
    if changed:
        raise ValueError(
            f"{out_dir} holds checkpoints of a run with different settings ({', '.join(changed)}); "
            "use a new out_dir, or delete its checkpoints/ folder to start over"
        )


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

    out_dir.mkdir(parents=True, exist_ok=True)
    _check_resume_compatible(out_dir, resolved)
    (out_dir / CONFIG_FILE).write_text(json.dumps(resolved, indent=2) + "\n", encoding="utf-8")
    (out_dir / DS_CONFIG_FILE).write_text(json.dumps(build_ds_config(cfg.zero, cfg), indent=2) + "\n", encoding="utf-8")
    ws = Workspace.locate(ws_root)
    job = PretrainJob(
        tokens_dir=tokens_dir.resolve(),
        tokenizer_path=Path(tokenizer_path).resolve(),
        out_dir=out_dir.resolve(),
        ws_root=ws.root,
        mlflow_run_id=mlflow_run_id,
        config=cfg,
        architecture=model_cfg,
    )
    return launch_job(WORKER_MODULE, job, out_dir, PretrainResult, "pretrain", num_procs=cfg.num_procs, hostfile=cfg.hostfile, log=log)


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
    ws = Workspace.locate(ws_root)
    if mlflow_run_id is not None:
        return run_pretrain(tokens_dir, tokenizer_path, out_dir, cfg, mlflow_run_id, ws.root, log=logger.info)
    with stage_run(ws, "pretrain", config=cfg) as run:
        return run_pretrain(tokens_dir, tokenizer_path, out_dir, cfg, run.info.run_id, ws.root, log=logger.info)
