"""Training-step benchmark: the untuned CPU settings vs the tuned ones, our loop vs a plain PyTorch loop, MFU.

Same model (same init), same batches, same AdamW groups, same clipping, one process:

    DS_ACCELERATOR=cpu .venv/bin/python bench/train.py --preset small25m --steps 6

Measures, in alternating rounds (the best round of each counts, because a shared machine's
background load only ever slows a measurement down):
- `before`: the one loop, tasks/training/loop.py `fit` (DeepSpeed ZeRO-0) in fp32 with torch's default AdamW
  on the CPU (the for-loop kernel): the untuned settings;
- `after`: the same loop with `launch.precision: auto` (bf16 where infra/launch/precision.py measured it
  faster) and `optim.kernel: auto` (fused AdamW): the speed-up is after / before (goal >= 1.5);
- `plain` vs `loop-fp32`: a hand-written loop and ours, both fp32 with fused AdamW: the
  loop's overhead (goal >= 0.9);
then MFU of `after` against the measured torch.mm peak of the precision it used (and fp32's).
Last, `--curve-steps` steps of `before` and `after` on learnable synthetic tokens (a noisy
bigram chain) show the loss curve unchanged within noise: the noise floor is `before` again
with another batch order (`--curve-only` runs just this part).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")

from infra.launch.precision import choose_precision  # noqa: E402
from models.flops import flops_per_token, mfu, num_params  # noqa: E402
from models.llama import Transformer, model_config  # noqa: E402
from models.optim import build_adamw, build_scheduler  # noqa: E402
from tasks.training.batches import token_window_batches  # noqa: E402
from tasks.training.config import PretrainConfig  # noqa: E402
from tasks.training.distributed import init_distributed  # noqa: E402
from tasks.training.engine import Schedule  # noqa: E402
from tasks.training.loop import LossSteps, fit  # noqa: E402
from tasks.training.metrics import ListSink, measure_peak_flops  # noqa: E402
from tasks.training.pretrain.stage import lm_loss  # noqa: E402

PEAK_MATMUL_S = 0.5  # the longest one timed matmul may take: the peak's sizes shrink to fit it


def peak_sizes(device: str, dtype: torch.dtype, n: int) -> list[int]:
    """The sizes n/2, n, 3n/2 of the peak measurement, less those whose one matmul would take over PEAK_MATMUL_S
    at this precision's speed here (probed on a 256 matmul): where bf16 is emulated it runs far slower than
    fp32, and the largest sizes would keep the bench for many minutes before its first step."""
    rate = measure_peak_flops(device, dtype, n=256, min_seconds=0.2)
    largest = (rate * PEAK_MATMUL_S / 2) ** (1 / 3)
    fitting = [size for size in (n // 2, n, n * 3 // 2) if size <= largest]
    return fitting or [max(256, int(largest) // 64 * 64)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small25m", help="models.llama preset (default small25m)")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="sequences per step (micro-batch, no accumulation)")
    p.add_argument("--steps", type=int, default=6, help="timed steps per loop and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before the timed ones")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the four loops")
    p.add_argument("--curve-steps", type=int, default=60, help="steps of the loss-curve comparison (0: skip)")
    p.add_argument("--curve-only", action="store_true", help="skip the speed rounds, run the loss-curve comparison only")
    p.add_argument("--peak-n", type=int, default=2048,
                   help="torch.mm peak = best of square sizes n/2, n, 3n/2 (default n=2048)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def make_model(args: argparse.Namespace) -> Transformer:
    torch.manual_seed(0)
    return Transformer(model_config(args.preset, args.vocab, max_seq_len=max(args.seq_len, 16)))


def train_config(args: argparse.Namespace, precision: str = "fp32", kernel: str = "auto", steps: int | None = None,
                 lr: float = 3e-4) -> PretrainConfig:
    return PretrainConfig(
        steps=steps or args.warmup + args.steps, seed=0,
        batch={"seq_len": args.seq_len, "micro_batch_size": args.batch, "grad_accum": 1},
        optim={"lr": lr, "warmup_steps": 2, "weight_decay": 0.1, "grad_clip": 1.0, "kernel": kernel},
        launch={"zero": "zero0", "precision": precision}, log={"every": 1, "eval_batches": 0, "peak_flops": 1.0},
    )


def bigram_tokens(vocab: int, n: int, seed: int = 0, stay: float = 0.8) -> np.ndarray:
    """Tokens of a noisy bigram chain: each token is followed by its fixed successor with
    probability `stay`, else by a random token, so a model's loss falls well below ln(vocab)."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(np.arange(6, vocab))
    noise = rng.integers(6, vocab, n)
    keep = rng.random(n) < stay
    out = np.empty(n, dtype=np.uint16)
    out[0] = 6
    for i in range(1, n):
        out[i] = successor[out[i - 1] - 6] if keep[i] else noise[i]
    return out


def plain_loop(args: argparse.Namespace, batches) -> float:
    """tokens/s of the textbook loop: forward, backward, clip, AdamW step, zero_grad, loss.item()."""
    cfg = train_config(args)
    model = make_model(args)
    o = cfg.optim
    opt = build_adamw(model, lr=o.lr, weight_decay=o.weight_decay, betas=o.betas, kernel=o.kernel)
    sched = build_scheduler(opt, Schedule.of(o, cfg.steps))
    tokens = args.batch * args.seq_len
    elapsed = 0.0
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        loss = lm_loss(model, batches(step, 0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if step >= args.warmup:
            elapsed += time.perf_counter() - t0
    return tokens * args.steps / elapsed


def deepspeed_loop(args: argparse.Namespace, batches, cfg: PretrainConfig) -> tuple[float, list[float]]:
    """tokens/s of the one loop (tasks/training/loop.py `fit`, ZeRO-0) after warm-up, and its loss per step."""
    sink = ListSink()
    ckpt = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        b = cfg.batch
        fit(make_model(args), cfg, LossSteps(cfg, batches, None, lm_loss), ckpt, sink,
            micro_batch_size=b.micro_batch_size, grad_accum=b.grad_accum, seq_len=b.seq_len)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    steps, tps = sink.series("tokens_per_s")
    # Equal tokens per step: total tokens over total time is the harmonic mean of the steps' rates.
    return statistics.harmonic_mean([t for s, t in zip(steps, tps) if s > args.warmup]), sink.series("loss")[1]


def loss_curves(args: argparse.Namespace) -> dict:
    """`before` and `after` on the same bigram batches, and `before` on another batch order: the noise floor."""
    curve_data = bigram_tokens(args.vocab, 400_000)
    runs = {"before": ("fp32", "for_loop", 0), "after": ("auto", "auto", 0), "before, other batch order": ("fp32", "for_loop", 1)}
    curves = {name: deepspeed_loop(args, token_window_batches(curve_data, args.seq_len, args.batch, seed=seed),
                                   train_config(args, prec, kern, args.curve_steps, lr=1e-3))[1]
              for name, (prec, kern, seed) in runs.items()}
    tail = max(1, args.curve_steps // 4)
    end = {k: float(np.mean(v[-tail:])) for k, v in curves.items()}
    diff = end["after"] - end["before"]
    noise = end["before, other batch order"] - end["before"]
    out = {"steps": args.curve_steps, "curves": curves, "final": end, "difference": diff, "noise_floor": noise,
           "within_noise": abs(diff) <= max(abs(noise), 1e-9)}
    print(f"  loss curve over {args.curve_steps} steps (bigram tokens, ln(vocab) = {np.log(args.vocab):.2f}): "
          f"start {curves['before'][0]:.3f}; mean of the last {tail} steps: before {end['before']:.3f}, "
          f"after {end['after']:.3f} (difference {diff:+.3f}); noise floor, before with another batch order: "
          f"{end['before, other batch order']:.3f} ({noise:+.3f}): "
          + ("within noise" if out["within_noise"] else "NOT within noise"), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    init_distributed()
    mcfg = make_model(args).cfg
    data = np.random.default_rng(0).integers(6, args.vocab, 2_000_000).astype(np.uint16)
    batches = token_window_batches(data, args.seq_len, args.batch, seed=0)
    choice = choose_precision("auto")
    print(f"precision auto -> {choice.precision}: {choice.reason}", flush=True)

    if args.curve_only:
        figures = {"preset": args.preset, "precision_after": choice.precision, "curve": loss_curves(args)}
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runs: dict[str, list[float]] = {"before": [], "after": [], "plain": [], "loop-fp32": []}
    peaks: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for r in range(args.rounds):
        # Peaks are re-measured every round: on a shared machine they move with the background load.
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            peaks[name].append(max(measure_peak_flops(device, dtype, n=n, min_seconds=0.5)
                                   for n in peak_sizes(device, dtype, args.peak_n)))
        runs["before"].append(deepspeed_loop(args, batches, train_config(args, "fp32", "for_loop"))[0])
        runs["after"].append(deepspeed_loop(args, batches, train_config(args, "auto", "auto"))[0])
        runs["plain"].append(plain_loop(args, batches))
        runs["loop-fp32"].append(deepspeed_loop(args, batches, train_config(args, "fp32", "auto"))[0])
        print(f"round {r + 1}: peak fp32 {peaks['fp32'][-1] / 1e9:.1f} / bf16 {peaks['bf16'][-1] / 1e9:.1f} GFLOP/s; "
              + ", ".join(f"{k} {v[-1]:,.0f} tok/s" for k, v in runs.items()), flush=True)
    best = {k: max(v) for k, v in runs.items()}
    peak = {k: max(v) for k, v in peaks.items()}
    fpt = flops_per_token(mcfg, args.seq_len)
    figures = {
        "preset": args.preset,
        "params": num_params(mcfg),
        "seq_len": args.seq_len,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "precision_after": choice.precision,
        "precision_reason": choice.reason,
        **{f"{k}_tokens_per_s": v for k, v in best.items()},
        "speedup": best["after"] / best["before"],
        "ratio": best["loop-fp32"] / best["plain"],
        "flops_per_token": fpt,
        "peak_flops_fp32": peak["fp32"],
        "peak_flops_bf16": peak["bf16"],
        "mfu_after": mfu(best["after"], fpt, peak[choice.precision]),
        "mfu_after_vs_fp32_peak": mfu(best["after"], fpt, peak["fp32"]),
        "mfu_before": mfu(best["before"], fpt, peak["fp32"]),
        "load_average_1m": os.getloadavg()[0],
    }
    print(
        f"\n{args.preset} ({figures['params'] / 1e6:.1f}M params), batch {args.batch} x {args.seq_len}, "
        f"{figures['threads']} threads\n"
        f"  before (fp32, for-loop AdamW)     {best['before']:10,.0f} tok/s   MFU {figures['mfu_before']:.1%} of fp32 peak\n"
        f"  after ({choice.precision}, fused AdamW)".ljust(36) + f"{best['after']:10,.0f} tok/s   speed-up {figures['speedup']:.2f}x "
        f"(goal >= 1.5)\n"
        f"                                                   MFU {figures['mfu_after']:.1%} of the {choice.precision} peak "
        f"({figures['mfu_after_vs_fp32_peak']:.1%} of fp32's)\n"
        f"  plain PyTorch loop (fp32, fused)  {best['plain']:10,.0f} tok/s\n"
        f"  our loop (fp32, fused)            {best['loop-fp32']:10,.0f} tok/s   ratio {figures['ratio']:.3f} (goal >= 0.9)\n"
        f"  torch.mm peak                     fp32 {peak['fp32'] / 1e9:.1f}, bf16 {peak['bf16'] / 1e9:.1f} GFLOP/s\n"
        f"  load average (1 min)              {figures['load_average_1m']:.1f}", flush=True
    )
    if args.curve_steps:
        figures["curve"] = loss_curves(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
