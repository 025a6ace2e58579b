"""One DeepSpeed rank of SFT: `deepspeed --module tasks.training.sft.worker --job out_dir/job.json`.

Every rank loads the base model and builds the same examples (a fixed order from the
catalog), memory-maps the pretraining token shards it replays (if any), then runs
`tasks.training.loop.train` on its share of the micro-batches; rank 0
logs to the MLflow run it was given and writes rejected.jsonl, the exported model, the
loss curve and result.json.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.atomic import write_text_atomic
from models.chat_template import ChatEncoding
from tasks.training import worker
from tasks.training.config import SftConfig
from tasks.training.loop import BatchFn
from tasks.training.metrics import perplexity
from tasks.training.sft.data import SftExample
from tasks.training.sft.stage import (
    REJECTED_FILE,
    SftJob,
    SftResult,
    chat_batches,
    encode_examples,
    is_val_example,
    replay_mix,
    sft_batch_tokens,
    sft_loss,
    sft_sources,
)


@dataclass
class SftExamples:
    """The encoded examples of a run, split by hash into train and val, and what was rejected."""

    train: list[ChatEncoding]
    val: list[ChatEncoding]
    kept: list[SftExample]  # train and val, in catalog order
    rejected: list[dict]  # reading and encoding rejections, with their reason


def load_examples(cfg: SftConfig, tokenizer: Any, seq_len: int) -> SftExamples:
    """Read the selected sources, encode with the chat template, split train/val; fails when no train example is left."""
    from tasks.training.sft.data import load_sft_examples

    root = cfg.data.catalog if cfg.data.catalog is not None else Path(".")
    examples, rejected = load_sft_examples(sft_sources(cfg.data), root=root)
    encodings, kept, enc_rejected = encode_examples(tokenizer, examples, seq_len)
    rejected += enc_rejected
    is_val = [is_val_example(ex.example_id, cfg.data.val_fraction) for ex in kept]
    train_enc = [e for e, v in zip(encodings, is_val) if not v]
    val_enc = [e for e, v in zip(encodings, is_val) if v]
    if not train_enc:
        raise ValueError(f"no SFT training examples left ({len(examples)} read, {len(rejected)} rejected, "
                         f"{len(val_enc)} held out); check data selection, seq_len={seq_len} and val_fraction")
    return SftExamples(train_enc, val_enc, kept, rejected)


def write_rejected(rows: list[dict], path: Path) -> Path:
    """One JSON line per rejected record."""
    return write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def example_batches(data: SftExamples, cfg: SftConfig, pad: int, replay_rows: int = 0,
                    replay_tokens_dir: Path | None = None, rank: int = 0) -> tuple[BatchFn, BatchFn | None]:
    """Train and (when any example is held out) validation batches.

    With `replay_rows`, each micro-batch holds that many windows of the pretraining token shards
    (train split; val split for validation) beside micro_batch_size - replay_rows examples.
    """
    seq_len, seed = cfg.batch.seq_len, cfg.seed
    n_chat = cfg.batch.micro_batch_size - replay_rows
    train_batches = chat_batches(data.train, n_chat, pad, seq_len, seed)
    eval_batches = chat_batches(data.val, n_chat, pad, seq_len, seed + 1) if data.val else None
    if not replay_rows:
        return train_batches, eval_batches
    from tasks.tokenizer.tokenize_shards import load_token_split
    from tasks.training.pretrain.stage import token_window_batches

    if replay_tokens_dir is None:
        raise ValueError(f"{replay_rows} replay rows per micro-batch but no replay_tokens_dir in the job")
    # Other seeds than pretraining's, so the replay does not retrace its first steps window for window.
    train_tokens = load_token_split(replay_tokens_dir, "train", verify_sha256=True)
    train_batches = replay_mix(train_batches, token_window_batches(train_tokens, seq_len, replay_rows, seed + 2))
    val_tokens = load_token_split(replay_tokens_dir, "val", verify_sha256=True)
    if eval_batches is not None and len(val_tokens) > seq_len:
        eval_batches = replay_mix(eval_batches, token_window_batches(val_tokens, seq_len, replay_rows, seed + 3))
    elif rank == 0:
        print(f"replay: val split has {len(val_tokens)} tokens (seq_len + 1 = {seq_len + 1} needed) or no SFT "
              "example is held out: validation without replayed text")
    return train_batches, eval_batches


def run_worker(job: SftJob, rank: int, world: int) -> SftResult | None:
    """Fine-tune on this rank; rank 0 returns (and writes) the result, the others return None."""
    from models import export
    from models.chat_template import special_ids
    from tasks.tokenizer.train import load_tokenizer

    cfg = job.config
    tokenizer = load_tokenizer(job.tokenizer_path)
    model = export.load_model(job.base_model_dir)
    model.float()  # the optimizer keeps fp32 masters; bf16 runs cast through DeepSpeed
    data = load_examples(cfg, tokenizer, cfg.batch.seq_len)
    reasons = Counter(r["reason"] for r in data.rejected)
    if rank == 0:
        write_rejected(data.rejected, job.out_dir / REJECTED_FILE)
        print(f"SFT examples: {len(data.train)} train, {len(data.val)} val, {len(data.rejected)} rejected "
              f"({dict(reasons)})")
        if cfg.replay_rows:
            print(f"replay: {cfg.replay_rows} of {cfg.batch.micro_batch_size} rows per micro-batch are windows of "
                  f"{cfg.batch.seq_len} pretraining tokens from {job.replay_tokens_dir}")
    batches = example_batches(data, cfg, special_ids(tokenizer).pad, cfg.replay_rows, job.replay_tokens_dir, rank)
    title = "SFT loss (assistant tokens" + (", replayed pretraining text)" if cfg.replay_rows else ")")
    with worker.rank0_run(job, "sft", rank) as run:
        done = worker.train_and_export(model, job, cfg, batches, sft_loss, rank, export_hf=cfg.export_hf,
                                       curve_title=title, batch_tokens=sft_batch_tokens)
        if done is None:
            return None
        res = done.result
        replay_val = res.final_val_parts.get("replay_loss")
        out = SftResult(
            out_dir=job.out_dir, model_dir=done.model_dir, hf_dir=done.hf_dir, checkpoint=res.checkpoint,
            loss_curve=done.loss_curve, rejected_path=job.out_dir / REJECTED_FILE, mlflow_run_id=run.info.run_id,
            steps=res.steps, final_train_loss=res.final_loss,
            val_loss=res.final_val_parts.get("sft_loss", res.final_val_loss),
            replay_val_loss=replay_val, replay_val_ppl=perplexity(replay_val) if replay_val is not None else None,
            tokens_per_s=res.tokens_per_s, skipped_steps=res.skipped_steps, world_size=world,
            examples_train=len(data.train), examples_val=len(data.val),
            examples_by_source=dict(sorted(Counter(ex.source for ex in data.kept).items())),
            rejected=dict(sorted(reasons.items())),
        )
        final = {"final_train_loss": out.final_train_loss, "final_val_loss": out.val_loss,
                 "final_replay_val_loss": out.replay_val_loss, "final_replay_val_ppl": out.replay_val_ppl,
                 "examples_train": float(out.examples_train), "examples_val": float(out.examples_val),
                 "examples_rejected": float(len(data.rejected))}
        worker.publish(run, job.out_dir, out, final, res.steps, [out.rejected_path, done.loss_curve])
        return out


if __name__ == "__main__":
    sys.exit(worker.main(None, SftJob, run_worker, __doc__))
