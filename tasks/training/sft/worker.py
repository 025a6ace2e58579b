"""One DeepSpeed rank of SFT: `deepspeed --module tasks.training.sft.worker --job out_dir/job.json`.

Every rank loads the base model and builds the same examples (a fixed order from the
catalog), then runs `tasks.training.loop.train` on its share of the micro-batches; rank 0
logs to the MLflow run it was given and writes rejected.jsonl, the exported model, the
loss curve and result.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from infra.deepspeed_launch import RESULT_FILE
from infra.paths import Workspace
from tasks.training.sft.stage import (
    LOSS_CURVE_FILE,
    REJECTED_FILE,
    SftJob,
    SftResult,
    chat_batches,
    encode_examples,
    is_val_example,
    sft_batch_tokens,
    sft_loss,
    sft_sources,
)
from tasks.training.loop import ListSink, MlflowSink, full_parameters, init_distributed, loss_curve, train


def _tokenizer_json(path: Path) -> Path | None:
    from tasks.tokenizer.train import TOKENIZER_FILE

    candidate = path / TOKENIZER_FILE if path.is_dir() else path
    return candidate if candidate.is_file() else None


def _write_rejected(rows: list[dict], path: Path) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def run_worker(job: SftJob) -> SftResult | None:
    """Fine-tune on this rank; rank 0 returns (and writes) the result, the others return None."""
    from models import export
    from tasks.training.sft.data import load_sft_examples
    from tasks.tokenizer.train import load_tokenizer
    from models.chat_template import special_ids

    cfg = job.config
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    rank, world = init_distributed()
    tcfg = cfg.train_config()
    tokenizer = load_tokenizer(job.tokenizer_path)
    model = export.load_model(job.base_model_dir)
    model.float()  # the optimizer keeps fp32 masters; bf16 runs cast through DeepSpeed

    sources = sft_sources(cfg.data)
    root = cfg.data.catalog if cfg.data.catalog is not None else Path(".")
    examples, rejected = load_sft_examples(sources, root=root)
    encodings, kept, enc_rejected = encode_examples(tokenizer, examples, tcfg.seq_len)
    rejected += enc_rejected
    is_val = [is_val_example(ex.example_id, cfg.data.val_fraction) for ex in kept]
    train_enc = [e for e, v in zip(encodings, is_val) if not v]
    val_enc = [e for e, v in zip(encodings, is_val) if v]
    if not train_enc:
        raise ValueError(f"no SFT training examples left ({len(examples)} read, {len(rejected)} rejected, "
                         f"{len(val_enc)} held out); check data selection, seq_len={tcfg.seq_len} and val_fraction")
    pad = special_ids(tokenizer).pad
    train_batches = chat_batches(train_enc, tcfg.micro_batch_size, pad, tcfg.seq_len, tcfg.seed)
    eval_batches = chat_batches(val_enc, tcfg.micro_batch_size, pad, tcfg.seq_len, tcfg.seed + 1) if val_enc else None
    if rank == 0:
        _write_rejected(rejected, job.out_dir / REJECTED_FILE)
        print(f"SFT examples: {len(train_enc)} train, {len(val_enc)} val, {len(rejected)} rejected "
              f"({dict(Counter(r['reason'] for r in rejected))})")

    ws = Workspace.locate(job.ws_root)
    tracking = contextlib.nullcontext()
    if rank == 0:
        from infra.tracking import stage_run

        tracking = stage_run(ws, "sft", config=cfg if job.mlflow_run_id is None else None, run_id=job.mlflow_run_id)
    with tracking as run:
        sink = MlflowSink(rank) if rank == 0 else ListSink()
        result = train(
            model, tcfg, train_batches, eval_batches, sft_loss, job.out_dir / "checkpoints", sink,
            batch_tokens=sft_batch_tokens, echo=print if rank == 0 else None,
        )
        with full_parameters(model, cfg.zero):
            if rank != 0:
                return None
            model_dir = export.save_model(model, job.out_dir / "model")
            hf_dir = None
            if cfg.export_hf:
                hf_dir = export.export_hf_llama(model, job.out_dir / "hf", tokenizer_json=_tokenizer_json(job.tokenizer_path))
        curve = loss_curve(result, job.out_dir / LOSS_CURVE_FILE, "SFT loss (assistant tokens)")
        out = SftResult(
            out_dir=job.out_dir,
            model_dir=model_dir,
            hf_dir=hf_dir,
            checkpoint=result.checkpoint,
            loss_curve=curve,
            rejected_path=job.out_dir / REJECTED_FILE,
            mlflow_run_id=run.info.run_id if run is not None else None,
            steps=result.steps,
            final_train_loss=result.final_loss,
            val_loss=result.final_val_loss,
            tokens_per_s=result.tokens_per_s,
            skipped_steps=result.skipped_steps,
            world_size=world,
            examples_train=len(train_enc),
            examples_val=len(val_enc),
            examples_by_source=dict(sorted(Counter(ex.source for ex in kept).items())),
            rejected=dict(sorted(Counter(r["reason"] for r in rejected).items())),
        )
        tmp = job.out_dir / (RESULT_FILE + ".tmp")
        tmp.write_text(out.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(job.out_dir / RESULT_FILE)
        if run is not None:
            import mlflow

            final = {k: v for k, v in {
                "final_train_loss": out.final_train_loss, "final_val_loss": out.val_loss,
                "examples_train": float(out.examples_train), "examples_val": float(out.examples_val),
                "examples_rejected": float(len(rejected)),
            }.items() if v is not None}
            mlflow.log_metrics(final, step=result.steps)
            mlflow.log_artifact(str(job.out_dir / RESULT_FILE))
            mlflow.log_artifact(str(job.out_dir / REJECTED_FILE))
            if curve is not None:
                mlflow.log_artifact(str(curve))
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=Path, required=True, help="job.json written by tasks.training.sft.stage.run_sft")
    args = parser.parse_args(argv)
    job = SftJob.model_validate_json(args.job.read_text(encoding="utf-8"))
    run_worker(job)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
