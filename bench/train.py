"""Training-step benchmark: our DeepSpeed loop vs a plain PyTorch loop, and MFU against measured matmul peak.

Same model (same init), same batches, same AdamW groups, same clipping, one process:

    DS_ACCELERATOR=cpu .venv/bin/python bench/train.py --preset small25m --steps 8

prints tokens/s of tasks.training.loop.train (ZeRO-0) and of a hand-written loop, their
ratio (goal >= 0.9), the fp32 torch.mm peak FLOP/s of this machine and the model FLOP/s
achieved (models.flops.flops_per_token x tokens/s), i.e. MFU (goal >= 30% on CPU).
Rounds alternate the two loops and the best round of each (and the best peak
measurement) counts, because a shared machine's background load only ever slows a
measurement down; run several short rounds on a busy machine.
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

import numpy as np
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")

from models.flops import flops_per_token, mfu, num_params  # noqa: E402
from models.llama import Transformer, model_config  # noqa: E402
from models.optim import build_adamw, build_scheduler  # noqa: E402
from tasks.training.pretrain.stage import lm_loss, token_window_batches  # noqa: E402
from tasks.training.engine import init_distributed  # noqa: E402
from tasks.training.loop import TrainConfig, train  # noqa: E402
from tasks.training.metrics import ListSink, measure_peak_flops  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small25m", help="models.llama preset (default small25m)")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="sequences per step (micro-batch, no accumulation)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per loop and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of (plain, deepspeed)")
    p.add_argument("--peak-n", type=int, default=2048,
                   help="torch.mm peak = best of square sizes n/2, n, 3n/2 (default n=2048)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def make_model(args: argparse.Namespace) -> Transformer:
    torch.manual_seed(0)
    return Transformer(model_config(args.preset, args.vocab, max_seq_len=max(args.seq_len, 16)))


def train_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        seq_len=args.seq_len, micro_batch_size=args.batch, grad_accum=1, lr=3e-4, warmup_steps=2,
        max_steps=args.warmup + args.steps, weight_decay=0.1, grad_clip=1.0, zero="zero0", precision="fp32",
        log_every=1, eval_batches=0, peak_flops=1.0, seed=0,
    )


def plain_loop(args: argparse.Namespace, batches) -> float:
    """tokens/s of the textbook loop: forward, backward, clip, AdamW step, zero_grad, loss.item()."""
    cfg = train_config(args)
    model = make_model(args)
    opt = build_adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
    sched = build_scheduler(opt, cfg)
    tokens = args.batch * args.seq_len
    elapsed = 0.0
    for step in range(cfg.max_steps):
        t0 = time.perf_counter()
        loss = lm_loss(model, batches(step, 0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if step >= args.warmup:
            elapsed += time.perf_counter() - t0
    return tokens * args.steps / elapsed


def deepspeed_loop(args: argparse.Namespace, batches) -> float:
    """tokens/s of tasks.training.loop.train (ZeRO-0, fp32), from its per-step timings after warm-up."""
    cfg = train_config(args)
    sink = ListSink()
    ckpt = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        train(make_model(args), cfg, batches, None, lm_loss, ckpt, sink)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    steps, tps = sink.series("tokens_per_s")
    tokens = args.batch * args.seq_len
    timed = [t for s, t in zip(steps, tps) if s > args.warmup]
    return tokens * len(timed) / sum(tokens / t for t in timed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    init_distributed()
    mcfg = make_model(args).cfg
    data = np.random.default_rng(0).integers(6, args.vocab, 2_000_000).astype(np.uint16)
    batches = token_window_batches(data, args.seq_len, args.batch, seed=0)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    plain, ds, peaks = [], [], []
    for r in range(args.rounds):
        # Peak is re-measured every round: on a shared machine it moves with the background load.
        peaks.append(max(measure_peak_flops(device, n=n) for n in (args.peak_n // 2, args.peak_n, args.peak_n * 3 // 2)))
        plain.append(plain_loop(args, batches))
        ds.append(deepspeed_loop(args, batches))
        print(f"round {r + 1}: peak {peaks[-1] / 1e9:.1f} GFLOP/s, plain {plain[-1]:,.0f} tok/s, "
              f"deepspeed {ds[-1]:,.0f} tok/s", flush=True)
    peak = max(peaks)
    fpt = flops_per_token(mcfg, args.seq_len)
    best_plain, best_ds = max(plain), max(ds)
    figures = {
        "preset": args.preset,
        "params": num_params(mcfg),
        "seq_len": args.seq_len,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "plain_tokens_per_s": best_plain,
        "deepspeed_tokens_per_s": best_ds,
        "ratio": best_ds / best_plain,
        "flops_per_token": fpt,
        "peak_flops": peak,
        "model_flops_deepspeed": fpt * best_ds,
        "mfu_deepspeed": mfu(best_ds, fpt, peak),
        "mfu_plain": mfu(best_plain, fpt, peak),
        "load_average_1m": os.getloadavg()[0],
    }
    print(
        f"\n{args.preset} ({figures['params'] / 1e6:.1f}M params), batch {args.batch} x {args.seq_len}, "
        f"{figures['threads']} threads\n"
        f"  plain PyTorch loop   {best_plain:10,.0f} tok/s\n"
        f"  DeepSpeed loop       {best_ds:10,.0f} tok/s   ratio {figures['ratio']:.3f} (goal >= 0.9)\n"
        f"  fp32 torch.mm peak   {peak / 1e9:10.1f} GFLOP/s\n"
        f"  model FLOP/s (DS)    {fpt * best_ds / 1e9:10.1f} GFLOP/s   MFU {figures['mfu_deepspeed']:.1%} "
        f"(plain {figures['mfu_plain']:.1%}; goal >= 30%)\n"
        f"  load average (1 min) {figures['load_average_1m']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
