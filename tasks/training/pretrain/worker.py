"""One DeepSpeed rank of pretraining: `deepspeed --module tasks.training.pretrain.worker --job out_dir/job.json`.

Every rank builds the same model (same seed), memory-maps the token files and runs
`tasks.training.loop.train`; rank 0 logs to the MLflow run it was given and writes the
exported model, the loss curve and result.json.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

from infra.deepspeed_launch import RESULT_FILE
from infra.paths import Workspace
from models.llama import ModelConfig, Transformer
from tasks.training.pretrain.stage import (
    LOSS_CURVE_FILE,
    PretrainJob,
    PretrainResult,
    lm_loss,
    token_window_batches,
)
from tasks.training.loop import ListSink, MlflowSink, full_parameters, init_distributed, loss_curve, train


def _export(model: Transformer, job: PretrainJob) -> tuple[Path, Path | None]:
    from models import export

    model_dir = export.save_model(model, job.out_dir / "model")
    hf_dir = None
    if job.config.export_hf and hasattr(export, "export_hf_llama"):
        hf_dir = export.export_hf_llama(model, job.out_dir / "hf", tokenizer_json=_tokenizer_json(job.tokenizer_path))
    return model_dir, hf_dir


def _tokenizer_json(path: Path) -> Path | None:
    from tasks.tokenizer.train import TOKENIZER_FILE

    candidate = path / TOKENIZER_FILE if path.is_dir() else path
    return candidate if candidate.is_file() else None


def run_worker(job: PretrainJob) -> PretrainResult | None:
    """Train on this rank; rank 0 returns (and writes) the result, the others return None."""
    from tasks.tokenizer.tokenize_shards import load_token_split

    rank, world = init_distributed()
    cfg = job.config
    tcfg = cfg.train_config()
    mcfg = ModelConfig(**job.architecture)
    # Same seed on every rank: identical initial weights before DeepSpeed broadcasts/partitions them.
    torch.manual_seed(tcfg.seed)
    model = Transformer(mcfg)

    # Checked against index.json's sha256 so a same-size bit flip is caught before training.
    train_tokens = load_token_split(job.tokens_dir, "train", verify_sha256=True)
    val_tokens = load_token_split(job.tokens_dir, "val", verify_sha256=True)
    train_batches = token_window_batches(train_tokens, tcfg.seq_len, tcfg.micro_batch_size, tcfg.seed)
    eval_batches = None
    if len(val_tokens) > tcfg.seq_len:
        eval_batches = token_window_batches(val_tokens, tcfg.seq_len, tcfg.micro_batch_size, tcfg.seed + 1)
    elif rank == 0:
        print(f"val split has {len(val_tokens)} tokens, fewer than seq_len+1={tcfg.seq_len + 1}: no validation loss")

    ws = Workspace.locate(job.ws_root)
    tracking = contextlib.nullcontext()
    if rank == 0:
        from infra.tracking import stage_run

        tracking = stage_run(ws, "pretrain", config=cfg if job.mlflow_run_id is None else None,
                             run_id=job.mlflow_run_id)
    with tracking as run:
        sink = MlflowSink(rank) if rank == 0 else ListSink()
        result = train(
            model, tcfg, train_batches, eval_batches, lm_loss, job.out_dir / "checkpoints", sink,
            echo=print if rank == 0 else None,
        )
        with full_parameters(model, cfg.zero):
            if rank != 0:
                return None
            model_dir, hf_dir = _export(model, job)
            n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        curve = loss_curve(result, job.out_dir / LOSS_CURVE_FILE, "Pretraining loss")
        out = PretrainResult(
            out_dir=job.out_dir,
            model_dir=model_dir,
            hf_dir=hf_dir,
            checkpoint=result.checkpoint,
            loss_curve=curve,
            mlflow_run_id=run.info.run_id if run is not None else None,
            steps=result.steps,
            final_train_loss=result.final_loss,
            val_loss=result.final_val_loss,
            val_ppl=result.final_val_ppl,
            tokens_seen=result.tokens_seen,
            tokens_per_s=result.tokens_per_s,
            skipped_steps=result.skipped_steps,
            world_size=world,
            n_params=n_params,
        )
        _write_result(out, job.out_dir / RESULT_FILE)
        if run is not None:
            import mlflow

            final = {k: v for k, v in {
                "final_train_loss": out.final_train_loss, "final_val_loss": out.val_loss,
                "final_val_ppl": out.val_ppl, "tokens_seen": float(out.tokens_seen),
                "train_tokens_per_s": out.tokens_per_s, "n_params": float(n_params),
            }.items() if v is not None}
            mlflow.log_metrics(final, step=result.steps)
            mlflow.log_artifact(str(job.out_dir / RESULT_FILE))
            if curve is not None:
                mlflow.log_artifact(str(curve))
        return out


def _write_result(result: PretrainResult, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, required=True, help="job.json written by tasks.training.pretrain.stage.run_pretrain")
    args = parser.parse_args(argv)
    job = PretrainJob.model_validate_json(args.job.read_text(encoding="utf-8"))
    run_worker(job)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
