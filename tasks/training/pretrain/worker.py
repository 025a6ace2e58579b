"""One DeepSpeed rank of pretraining: `deepspeed --module tasks.training.pretrain.worker --job out_dir/job.json`.

Every rank builds the same model (same seed), memory-maps the token files and runs
`tasks.training.loop.train`; rank 0 logs to the MLflow run it was given and writes the
exported model, the loss curve and result.json.
"""
from __future__ import annotations

import sys

import torch

from models.llama import ModelConfig, Transformer
from tasks.training import worker
from tasks.training.config import PretrainConfig
from tasks.training.loop import BatchFn
from tasks.training.pretrain.stage import PretrainJob, PretrainResult, lm_loss, token_window_batches


def token_batches(job: PretrainJob, cfg: PretrainConfig, rank: int) -> tuple[BatchFn, BatchFn | None]:
    """Train and validation batches over the token files; no validation when val is shorter than a window."""
    from tasks.tokenizer.tokenize_shards import load_token_split

    # Checked against index.json's sha256 so a same-size bit flip is caught before training.
    train_tokens = load_token_split(job.tokens_dir, "train", verify_sha256=True)
    val_tokens = load_token_split(job.tokens_dir, "val", verify_sha256=True)
    seq_len, rows = cfg.batch.seq_len, cfg.batch.micro_batch_size
    train_batches = token_window_batches(train_tokens, seq_len, rows, cfg.seed)
    eval_batches = None
    if len(val_tokens) > seq_len:
        eval_batches = token_window_batches(val_tokens, seq_len, rows, cfg.seed + 1)
    elif rank == 0:
        print(f"val split has {len(val_tokens)} tokens, fewer than seq_len+1={seq_len + 1}: no validation loss")
    return train_batches, eval_batches


def run_worker(job: PretrainJob, rank: int, world: int) -> PretrainResult | None:
    """Train on this rank; rank 0 returns (and writes) the result, the others return None."""
    cfg = job.config
    # Same seed on every rank: identical initial weights before DeepSpeed broadcasts/partitions them.
    torch.manual_seed(cfg.seed)
    model = Transformer(ModelConfig(**job.architecture))
    batches = token_batches(job, cfg, rank)
    with worker.rank0_run(job, "pretrain", rank) as run:
        done = worker.train_and_export(model, job, cfg, batches, lm_loss, rank, export_hf=cfg.export_hf,
                                       curve_title="Pretraining loss")
        if done is None:
            return None
        res = done.result
        out = PretrainResult(
            out_dir=job.out_dir, model_dir=done.model_dir, hf_dir=done.hf_dir, checkpoint=res.checkpoint,
            loss_curve=done.loss_curve, mlflow_run_id=run.info.run_id, steps=res.steps,
            final_train_loss=res.final_loss, val_loss=res.final_val_loss, val_ppl=res.final_val_ppl,
            tokens_seen=res.tokens_seen, tokens_per_s=res.tokens_per_s, skipped_steps=res.skipped_steps,
            world_size=world, n_params=done.n_params,
        )
        final = {"final_train_loss": out.final_train_loss, "final_val_loss": out.val_loss,
                 "final_val_ppl": out.val_ppl, "tokens_seen": float(out.tokens_seen),
                 "train_tokens_per_s": out.tokens_per_s, "n_params": float(out.n_params)}
        worker.publish(run, job.out_dir, out, final, res.steps, [done.loss_curve])
        return out


if __name__ == "__main__":
    sys.exit(worker.main(None, PretrainJob, run_worker, __doc__))
