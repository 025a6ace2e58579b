"""Supervised fine-tuning stage: launch `tasks.training.sft.worker` on N DeepSpeed ranks over chat examples.

    run_sft(base_model_dir, tokenizer_path, out_dir, cfg, mlflow_run_id, ws_root, replay_tokens=tokens_dir)
      out_dir/sft_config.json    resolved config
      out_dir/ds_config.json     the DeepSpeed config the ranks use
      out_dir/rejected.jsonl     SFT records that did not become examples, with their reason
      out_dir/checkpoints/       DeepSpeed checkpoints; a rerun with the same out_dir resumes
      out_dir/model/             fine-tuned weights (models.export.save_model), out_dir/hf/ for transformers
      out_dir/loss_curve.png, out_dir/result.json

Examples come from tasks/training/sft/data.py (the built-in docstring + arithmetic sets, or an SFT
catalog folder), are encoded with the one chat template and trained on with
`tasks.training.loop.train`; the loss covers only assistant tokens (prompt and padding have
target -100). With `replay_fraction`, that share of each micro-batch's rows are windows of the
pretraining token shards (`replay_tokens`), trained with next-token loss on every token so the
model keeps the language modelling it was pretrained for; the two losses are logged apart
(sft_loss, replay_loss) and the step's loss weighs them by their rows.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from prefect import get_run_logger, task
from models.chat_template import ChatEncoding, collate
from models.losses import next_token_loss
from tasks.training.config import RESUME_NEUTRAL, SftConfig, SftDataConfig
from tasks.training.engine import ds_config_for
from tasks.training.launch import (
    ExportedModel,
    StageJob,
    StageSpec,
    in_stage_run,
    job_fields,
    run_stage,
    saved_model_config,
)
from tasks.training.loop import BatchFn, LossParts
from tasks.training.loss_steps import epoch_orders
from tasks.training.sft.data import SftExample, SftSourceConfig

CONFIG_FILE = "sft_config.json"
REJECTED_FILE = "rejected.jsonl"
WORKER_MODULE = "tasks.training.sft.worker"
STAGE = StageSpec(name="sft", label="SFT", worker_module=WORKER_MODULE, config_file=CONFIG_FILE,
                  resume_neutral=RESUME_NEUTRAL,
                  resume_identity={"base_model": "base model", "replay_tokens": "replayed token shards"})


class SftJob(StageJob):
    """What the worker processes read (out_dir/job.json)."""

    base_model_dir: Path
    config: SftConfig
    replay_tokens_dir: Path | None = None  # pretraining token shards, when config.replay_fraction > 0


class SftResult(ExportedModel):
    """What SFT ended with: the contents of out_dir/result.json."""

    checkpoint: Path | None
    loss_curve: Path | None
    rejected_path: Path
    steps: int
    final_train_loss: float | None
    val_loss: float | None  # on the held-out SFT examples' assistant tokens
    # Next-token loss on the pretraining validation split at the last validation, when replaying.
    replay_val_loss: float | None = None
    replay_val_ppl: float | None = None
    tokens_per_s: float | None
    skipped_steps: int
    world_size: int
    examples_train: int
    examples_val: int
    examples_by_source: dict[str, int]
    rejected: dict[str, int]  # reason -> count (reading and encoding rejections together)


# ----------------------------------------------------------------------------- data


def sft_sources(data: SftDataConfig) -> list[SftSourceConfig]:
    """The SFT sources `data` selects, with its arithmetic options and example cap applied."""
    from tasks.training.sft.data import load_sft_catalog

    if data.catalog is not None:
        sources = load_sft_catalog(data.catalog)
    else:
        licences = {"stdlib_docstrings": "PSF-2.0", "arithmetic": "CC0-1.0"}
        sources = [SftSourceConfig(name=b, kind="sft_builtin", builtin=b, licence=licences[b]) for b in data.builtin]
    if data.sources is not None:
        known = {s.name for s in sources}
        missing = sorted(set(data.sources) - known)
        if missing:
            raise ValueError(f"SFT sources {missing} are not defined; known: {sorted(known)}")
        sources = [s for s in sources if s.name in data.sources]
    out = []
    for s in sources:
        update: dict[str, Any] = {}
        if data.max_examples is not None:
            update["max_examples"] = data.max_examples
        if data.arithmetic is not None and s.builtin == "arithmetic":
            update["arithmetic"] = data.arithmetic
        out.append(s.model_copy(update=update))
    if not out:
        raise ValueError("no SFT sources selected; check data.builtin / data.sources")
    return out


def is_val_example(example_id: str, val_fraction: float) -> bool:
    """Stable train/val assignment by hash of the example id."""
    digest = hashlib.sha256(f"sft-val\x1f{example_id}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


def encode_examples(
    tokenizer: Any, examples: Sequence[SftExample], seq_len: int
) -> tuple[list[ChatEncoding], list[SftExample], list[dict]]:
    """(encodings, their examples, rejected rows) with the chat template.

    An example longer than seq_len + 1 tokens is rejected (`exceeds_seq_len`) rather than
    truncated: a cut answer would teach the model to stop mid-sentence without <|end|>.
    """
    from models.chat_template import encode_chat

    encs, kept, rejected = [], [], []
    for ex in examples:
        row = {"source": ex.source, "path": ex.path, "locator": ex.locator}
        try:
            enc = encode_chat(tokenizer, ex.messages)
        except ValueError as exc:
            rejected.append({**row, "reason": "encode_error", "detail": str(exc)[:200]})
            continue
        if len(enc.ids) > seq_len + 1:
            rejected.append({**row, "reason": "exceeds_seq_len", "detail": f"{len(enc.ids)} tokens > seq_len + 1 = {seq_len + 1}"})
            continue
        encs.append(enc)
        kept.append(ex)
    return encs, kept, rejected


def chat_batches(encodings: Sequence[ChatEncoding], batch_size: int, pad_id: int, seq_len: int, seed: int) -> BatchFn:
    """Micro-batch i of a rank: `batch_size` encoded conversations collated to (inputs, targets).

    Each epoch visits every example once in an order drawn from (seed, epoch); sample
    number g = (i * world + rank) * batch_size + j, so a batch is a pure function of
    (seed, i, rank, world) and a resume continues mid-epoch. Targets are -100 on prompt
    tokens and padding.
    """
    n = len(encodings)
    if n < 1:
        raise ValueError("no encoded SFT examples to batch; check the data selection and seq_len")
    order = epoch_orders(n, seed)

    def batch(i: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = (i * world + rank) * batch_size
        picked = [encodings[int(order(g // n)[g % n])] for g in range(first, first + batch_size)]
        return collate(picked, pad_id, seq_len)

    return batch


def replay_mix(chat: BatchFn, replay: BatchFn) -> BatchFn:
    """Micro-batch i as {"chat": chat(i, ...), "replay": replay(i, ...)}: both pure, so the mix is too.

    The two kinds stay separate tensors, each padded to its own width: a conversation of a
    dozen tokens is not padded to a full pretraining window.
    """

    def batch(i: int, rank: int, world: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {"chat": chat(i, rank, world), "replay": replay(i, rank, world)}

    return batch


SftBatch = tuple[torch.Tensor, torch.Tensor] | dict[str, tuple[torch.Tensor, torch.Tensor]]


def sft_batch_tokens(batch: SftBatch) -> int:
    """Positions the model computes for a collated (or replay-mixed) batch, padding included (it costs the same FLOPs).

    Batches are padded to their longest row, not to seq_len, so counting seq_len per row
    would report tokens/s (and MFU) for work that never ran.
    """
    if isinstance(batch, dict):
        return sum(inputs.numel() for inputs, _ in batch.values())
    return batch[0].numel()


def sft_loss(model: torch.nn.Module, batch: SftBatch) -> torch.Tensor | tuple[torch.Tensor, LossParts]:
    """Cross-entropy on the assistant tokens of a collated (inputs, targets) batch.

    For a replay mix, also next-token loss on every replayed token; the two means are weighted
    by their share of the rows and come back as parts too (sft_loss, replay_loss).
    """
    if not isinstance(batch, dict):
        inputs, targets = batch
        return next_token_loss(model(inputs), targets)
    (chat_in, chat_tgt), (replay_in, replay_tgt) = batch["chat"], batch["replay"]
    chat = next_token_loss(model(chat_in), chat_tgt)
    replay = next_token_loss(model(replay_in), replay_tgt)
    n_chat, n_replay = chat_in.shape[0], replay_in.shape[0]
    loss = (n_chat * chat + n_replay * replay) / (n_chat + n_replay)
    return loss, {"sft_loss": chat.detach(), "replay_loss": replay.detach()}


# ----------------------------------------------------------------------------- launching


def run_sft(
    base_model_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    cfg: SftConfig,
    mlflow_run_id: str | None,
    ws_root: Path | str | None,
    log: Callable[[str], Any] = print,
    replay_tokens: Path | None = None,
) -> SftResult:
    """Write the configs into out_dir, launch the DeepSpeed worker ranks, and read back result.json.

    `replay_tokens`: the pretraining token shards (tasks/tokenizer/tokenize_shards.py) that
    `cfg.replay_fraction` replays; needed only when that is above 0.
    """
    base_model_dir, out_dir = Path(base_model_dir), Path(out_dir)
    mcfg = saved_model_config(base_model_dir, tokenizer_path, "fine-tune a model trained with this tokenizer")
    if cfg.batch.seq_len > mcfg.max_seq_len:
        raise ValueError(f"batch.seq_len={cfg.batch.seq_len} exceeds the base model's max_seq_len={mcfg.max_seq_len}; "
                         "lower batch.seq_len")
    if cfg.data.catalog is not None and not Path(cfg.data.catalog).is_dir():
        raise FileNotFoundError(f"data.catalog={cfg.data.catalog} is not a folder of sft_* YAML definitions")
    replay_dir = check_replay_tokens(cfg, replay_tokens, mcfg.vocab_size)
    resolved = {"sft": cfg.model_dump(mode="json"), "base_model": str(base_model_dir.resolve()),
                "model": mcfg.model_dump(mode="json"), "replay_tokens": str(replay_dir) if replay_dir else None}

    cfg_abs = cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"catalog": Path(cfg.data.catalog).resolve() if cfg.data.catalog else None})})
    job = SftJob(base_model_dir=base_model_dir.resolve(), config=cfg_abs, replay_tokens_dir=replay_dir,
                 **job_fields(tokenizer_path, out_dir, ws_root, mlflow_run_id, cfg.launch.precision))
    ds_config = ds_config_for(cfg.optim, cfg.launch, cfg.batch.micro_batch_size, cfg.batch.grad_accum)
    return run_stage(STAGE, out_dir, resolved, job, SftResult, ds_config=ds_config,
                     num_procs=cfg.launch.num_procs, hostfile=cfg.launch.hostfile,
                     launcher_args=cfg.launch.launcher_args, log=log)


def check_replay_tokens(cfg: SftConfig, replay_tokens: Path | None, vocab_size: int) -> Path | None:
    """The absolute token-shard folder to replay, checked against the model; None when replay is off."""
    from tasks.tokenizer.tokenize_shards import load_token_index

    if cfg.replay_fraction == 0:
        return None
    if replay_tokens is None:
        raise ValueError(f"replay_fraction={cfg.replay_fraction} replays pretraining text but no token shards were "
                         "given; pass the pretraining token folder (replay_tokens / the flow's `tokens`), "
                         "or set replay_fraction: 0")
    index = load_token_index(Path(replay_tokens))  # names the missing index.json when the folder is not one
    if index.vocab_size > vocab_size:
        raise ValueError(f"{replay_tokens} was tokenized with a {index.vocab_size}-token vocabulary but the base "
                         f"model has {vocab_size}; replay the token shards the base model was pretrained on")
    return Path(replay_tokens).resolve()


@task(name="sft")
def sft_task(
    base_model_dir: Path,
    tokenizer_path: Path,
    out_dir: Path,
    cfg: SftConfig,
    ws_root: str | Path | None = None,
    mlflow_run_id: str | None = None,
    replay_tokens: Path | None = None,
) -> SftResult:
    """Prefect task: SFT inside an MLflow stage run (a new one, or `mlflow_run_id` when given)."""
    logger = get_run_logger()
    return in_stage_run("sft", cfg, ws_root, mlflow_run_id, lambda run_id, root: run_sft(
        base_model_dir, tokenizer_path, out_dir, cfg, run_id, root, log=logger.info, replay_tokens=replay_tokens))
