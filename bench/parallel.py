"""Every layout two ranks allow, trained from one seed on one data order, against one process.

    DS_ACCELERATOR=cpu .venv/bin/python bench/parallel.py --json /tmp/parallel.json [--steps 30]

A tiny Llama (2 blocks, 64 wide, GQA 4/2 heads) pretrains through the real pipeline stage
(tasks/training/pretrain/stage.py: DeepSpeed's launcher, checkpoint, export) under each layout, in
fp32, with the same global batch of 8 sequences of 32 tokens a step:

    single   1 rank, micro-batch 4 x grad_accum 2
    dp2      2 ranks, data parallel (ZeRO-0), micro-batch 4 each
    zero3    2 ranks, ZeRO-3, micro-batch 4 each
    tp2      2 ranks, tensor parallel (models/tensor_parallel.py), both see micro-batch 4 x grad_accum 2
    pp2      2 ranks, pipeline parallel (models/pipeline.py, DeepSpeed's 1F1B), micro-batches 4 x 2

The batches are a pure function of (micro-batch index, data rank, data world) (tasks/training/batches.py),
so every layout sees the same sequences each step. Per layout the JSON holds the per-step losses (the
MLflow metric the loop logs each step), tokens/s (the loop's, checkpoints and export excluded), every
rank's peak memory (RSS on the CPU, max_memory_allocated on a GPU) and the memory plan's estimate per
device (models/memory_plan.py); the bench checks every layout's loss against the single process's at
every step (1e-4 relative) and exits 1 if one is off.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {
    "single": {"num_procs": 1, "grad_accum": 2},
    "dp2": {"num_procs": 2, "grad_accum": 1},
    "zero3": {"num_procs": 2, "grad_accum": 1, "zero": "zero3"},
    "tp2": {"num_procs": 2, "grad_accum": 2, "tp": 2},
    "pp2": {"num_procs": 2, "grad_accum": 2, "pp": 2},
}
MODEL = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128, "max_seq_len": 32}
VOCAB, SEQ_LEN, MICRO_BATCH = 256, 32, 4
TOLERANCE = 1e-4  # relative, every step


def write_inputs(root: Path) -> tuple[Path, Path]:
    """A word-level tokenizer of VOCAB ids and train/val token files of a noisy bigram chain (learnable, not trivial)."""
    import hashlib

    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers

    from models.special_tokens import SPECIAL_TOKENS
    from tasks.tokenizer.tokenize_shards import INDEX_FILE, SourceCount, TokenFile, TokenShards

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = root / "tokenizer.json"
    tok.save(str(tokenizer))
    tokens_dir = root / "tokens"
    tokens_dir.mkdir()
    rng = np.random.default_rng(0)
    first = len(SPECIAL_TOKENS)
    files, sources = {}, {}
    for split, n in (("train", 60_000), ("val", 6_000)):
        ids = np.empty(n, dtype="<u2")
        ids[0] = first
        jumps = rng.random(n) < 0.2
        for i in range(1, n):
            ids[i] = rng.integers(first, VOCAB) if jumps[i] else first + (ids[i - 1] - first + 7) % (VOCAB - first)
        path = tokens_dir / f"{split}.bin"
        ids.tofile(path)
        files[split] = TokenFile(file=path.name, tokens=n, bytes=path.stat().st_size,
                                 sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        sources[split] = {"bench": SourceCount(documents=1, tokens=n)}
    index = TokenShards(dtype="uint16", vocab_size=VOCAB, eos_id=2, val_fraction=0.1, tokenizer_sha256="bench",
                        manifest_sha256="bench", files=files, sources=sources)
    (tokens_dir / INDEX_FILE).write_text(index.model_dump_json())
    return tokenizer, tokens_dir


def layout_config(name: str, steps: int):
    from tasks.training.config import PretrainConfig

    spec = dict(LAYOUTS[name])
    grad_accum = spec.pop("grad_accum")
    return PretrainConfig.model_validate({
        "model": "demo", "model_overrides": MODEL, "steps": steps, "seed": 0, "export_hf": True,
        "batch": {"seq_len": SEQ_LEN, "micro_batch_size": MICRO_BATCH, "grad_accum": grad_accum},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "launch": {"precision": "fp32", "torch_threads": 1, **spec},
        "checkpoint": {"every": 0}, "log": {"every": 1, "eval_every": 0, "eval_batches": 2, "peak_flops": 1e11},
    })


def run_layout(name: str, steps: int, work: Path, tokenizer: Path, tokens: Path) -> dict:
    import mlflow

    from infra.stages import in_run
    from infra.tracking.store import tracking_uri
    from infra.workspace.paths import Workspace
    from tasks.training.pretrain.stage import Pretrain

    ws = Workspace.locate(work / "ws")
    t0 = time.perf_counter()
    result = in_run(Pretrain(layout_config(name, steps)), ws, work / name, log=lambda line: None,
                    tokens=tokens, tokenizer=tokenizer)
    history = mlflow.tracking.MlflowClient(tracking_uri(ws)).get_metric_history(result.mlflow_run_id, "loss")
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    return {"losses": losses, "tokens_per_s": result.tokens_per_s, "peak_bytes_per_rank": result.peak_bytes_per_rank,
            "plan_bytes_per_device": result.plan_bytes_per_device, "layout": result.layout,
            "wall_s": round(time.perf_counter() - t0, 1)}


def compare(layouts: dict[str, dict]) -> dict[str, float]:
    """Largest relative difference of each layout's loss from the single process's, over all steps."""
    base = layouts["single"]["losses"]
    out = {}
    for name, r in layouts.items():
        if len(r["losses"]) != len(base):
            out[name] = float("inf")
            continue
        out[name] = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    if "single" not in args.layouts:
        parser.error("--layouts must include single: every layout is compared with it")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the scratch workspace's own store
    # The ranks import this checkout's code, however the environment was installed.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    work = args.work or Path(tempfile.mkdtemp(prefix="llmforge-parallel-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tokenizer, tokens = write_inputs(work)
        layouts = {}
        for name in args.layouts:
            layouts[name] = run_layout(name, args.steps, work, tokenizer, tokens)
            print(f"{name}: final loss {layouts[name]['losses'][-1]:.6f}, {layouts[name]['tokens_per_s']:,.0f} tokens/s, "
                  f"peak RSS per rank {[round(p / 2**20) for p in layouts[name]['peak_bytes_per_rank']]} MiB", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    differences = compare(layouts)
    ok = all(d <= TOLERANCE for d in differences.values())
    report = {"steps": args.steps, "tolerance": TOLERANCE, "max_relative_difference": differences, "match": ok,
              "layouts": layouts}
    args.json.write_text(json.dumps(report, indent=1))
    print("\n| layout | tokens/s | peak RSS per rank (MiB) | plan's estimate per device (MiB) | max rel. loss diff |")
    print("|---|---:|---:|---:|---:|")
    for name, r in layouts.items():
        plan = f"{r['plan_bytes_per_device'] / 2**20:.1f}" if r["plan_bytes_per_device"] else "-"
        print(f"| {name} | {r['tokens_per_s']:,.0f} | {' / '.join(str(round(p / 2**20)) for p in r['peak_bytes_per_rank'])} "
              f"| {plan} | {differences[name]:.1e} |")
    print(f"\nlosses within {TOLERANCE} relative of single at every step: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
