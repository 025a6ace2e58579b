"""GPU check of the gpt-124m preset: train its 124M model N steps on synthetic tokens, then one GRPO step.

    bench/gpu_check.sh                                     # on one CUDA GPU, at most 5 minutes
    .venv/bin/python bench/gpu_check.py --steps 30 --no-compile --json gpu.json
    .venv/bin/python bench/gpu_check.py --tiny --steps 2   # the same code path on a tiny model (CPU test)

The model, batch shape (micro-batch x seq x grad_accum, 0.5M tokens a step), precision, AdamW kernel and
torch.compile come from the preset; training runs through the one loop, `tasks.training.loop.fit` (DeepSpeed, as the
pretraining stage does) on a noisy bigram chain of tokens, so the loss has something to learn and no data
is needed. Then tokens/s and MFU: training FLOPs per token (`models.flops`) x tokens/s over the measured
torch.mm peak of the precision, and over the GPU's nominal dense bf16 peak where the name is known (the goal
is 40% of it). Last, one GRPO step (`tasks.training.grpo.steps.GrpoSteps` in the same loop: sampling with the KV cache, the
gsm8k_exact reward, two policy updates) on GSM8K-style word problems made up here, with a small tokenizer
trained on them.

Exit status: 0 when every loss is finite, 1 when a loss is NaN/inf (or a step was skipped for one),
2 when MFU is below --min-mfu (off unless given).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train import bigram_tokens  # noqa: E402
from flows.config import load_pipeline_config  # noqa: E402
from models.flops import flops_per_token, mfu, num_params  # noqa: E402
from models.llama import ModelConfig, Transformer, model_config  # noqa: E402
from tasks.eval.gsm8k import Gsm8kProblem  # noqa: E402
from tasks.training.batches import token_window_batches  # noqa: E402
from tasks.training.config import GrpoConfig, PretrainConfig  # noqa: E402
from tasks.training.distributed import init_distributed  # noqa: E402
from tasks.training.grpo.steps import GrpoSteps, grpo_shape  # noqa: E402
from tasks.training.loop import LossSteps, fit  # noqa: E402
from tasks.training.metrics import ListSink, measure_peak_flops  # noqa: E402
from tasks.training.pretrain.stage import lm_loss  # noqa: E402
from tasks.training.progress import NonFiniteLossError  # noqa: E402

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, in TFLOP/s, matched against
# torch.cuda.get_device_name() in this order (so "L40S" is tried before "L4", "H100 PCIe" before "H100").
NOMINAL_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("B200", 2250.0), ("GH200", 989.0), ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0),
    ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0),
)
MFU_GOAL = 0.40
# --tiny: the same code path on a model small enough for a CPU test to run in seconds.
TINY_MODEL = dict(dim=64, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden=128, max_seq_len=128)
TINY_SHAPE = dict(vocab=512, seq_len=64, micro_batch_size=4, grad_accum=2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt-124m", help="pipeline preset whose pretraining settings to check")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps of 0.5M tokens (default 30)")
    p.add_argument("--untimed", type=int, default=None,
                   help="first steps left out of tokens/s (compilation, warm-up); default steps // 5, at least 1")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: the preset's torch_compile on CUDA, off on the CPU)")
    p.add_argument("--grad-accum", type=int, default=None, help="micro-batches a step (default: the preset's)")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences a micro-batch (default: the preset's)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and batch: the same code path, on the CPU in seconds")
    p.add_argument("--grpo-tokens", type=int, default=None, help="new tokens per GRPO completion (default 128; tiny 8)")
    p.add_argument("--peak-tflops", type=float, default=None, help="nominal bf16 peak of this GPU, when its name is not known")
    p.add_argument("--min-mfu", type=float, default=None, help="exit 2 when MFU (nominal peak, else measured) is below this")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- setup


def check_setup(args: argparse.Namespace, cuda: bool) -> tuple[ModelConfig, PretrainConfig]:
    """The model and the loop's config: the preset's, for `args.steps` steps (tiny shapes with --tiny)."""
    cfg = load_pipeline_config(args.preset)
    pre = cfg.pretrain
    if args.tiny:
        mcfg = model_config(pre.model, TINY_SHAPE["vocab"], **TINY_MODEL)
        shape = {k: TINY_SHAPE[k] for k in ("seq_len", "micro_batch_size", "grad_accum")}
    else:
        mcfg = model_config(pre.model, cfg.tokenizer.vocab_size, **pre.model_overrides)
        shape = {}
    if args.micro_batch:
        shape["micro_batch_size"] = args.micro_batch
    if args.grad_accum:
        shape["grad_accum"] = args.grad_accum
    launch = pre.launch.model_copy(update=dict(
        # bf16 is what a GPU trains in; on the CPU fp32 keeps the tiny check fast wherever bf16 is emulated.
        precision=pre.launch.precision if cuda else "fp32",
        torch_compile=(pre.launch.torch_compile if cuda else False) if args.compile is None else args.compile,
    ))
    return mcfg, pre.model_copy(update=dict(
        steps=args.steps, batch=pre.batch.model_copy(update=shape), launch=launch,
        optim=pre.optim.model_copy(update={"warmup_steps": min(pre.optim.warmup_steps, max(1, args.steps // 3))}),
        log=pre.log.model_copy(update=dict(every=1, eval_every=0, eval_batches=0)),
        checkpoint=pre.checkpoint.model_copy(update={"every": 0}),
    ))


def nominal_peak(device_name: str, override_tflops: float | None) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s: the override, else the data-sheet figure of a known name, else None."""
    if override_tflops:
        return override_tflops * 1e12
    for key, tflops in NOMINAL_BF16_TFLOPS:
        if key in device_name:
            return tflops * 1e12
    return None


# ----------------------------------------------------------------------------- training


def train_steps(model: Transformer, tcfg: PretrainConfig, untimed: int) -> dict:
    """Train `model` through the pipeline's loop; losses, tokens/s after the untimed steps, skipped steps."""
    # Enough windows that the check does not learn them by heart; 2M tokens take a second or two to draw.
    wanted = tcfg.steps * tcfg.batch.tokens_per_step(1) + tcfg.batch.seq_len + 1
    data = bigram_tokens(model.cfg.vocab_size, min(max(wanted, 200_000), 2_000_000))
    batches = token_window_batches(data, tcfg.batch.seq_len, tcfg.batch.micro_batch_size, seed=tcfg.seed)
    sink = ListSink()
    ckpt = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    error = None
    try:
        b = tcfg.batch
        res = fit(model, tcfg, LossSteps(tcfg, batches, None, lm_loss), ckpt, sink, micro_batch_size=b.micro_batch_size,
                  grad_accum=b.grad_accum, seq_len=b.seq_len, echo=print)
        skipped = res.skipped_steps
    except NonFiniteLossError as exc:
        error, skipped = str(exc), tcfg.max_bad_steps
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)  # the end-of-run checkpoint: not part of the check
    steps, losses = sink.series("loss")
    _, tps = sink.series("tokens_per_s")
    timed = [t for s, t in zip(steps, tps) if s > untimed] or tps[-1:]
    # Equal tokens per step: total tokens over total time is the harmonic mean of the steps' rates.
    tokens_per_s = statistics.harmonic_mean(timed) if timed else None
    return {"losses": losses, "tokens_per_s": tokens_per_s, "timed_steps": len(timed), "skipped_steps": skipped,
            "error": error}


# ----------------------------------------------------------------------------- GRPO


def word_problems(n: int) -> list[Gsm8kProblem]:
    """GSM8K-style problems with their answers, made up here (the check downloads nothing)."""
    names, things = ["Ava", "Ben", "Chen", "Dara", "Eli", "Fay"], ["apples", "books", "coins", "pens", "shells"]
    out = []
    for i in range(n):
        a, b, c = 3 + i % 7, 2 + (i * 5) % 9, 1 + (i * 3) % 4
        who, what = names[i % len(names)], things[i % len(things)]
        question = (f"{who} has {a} {what} and buys {b} more, then gives away {c}. "
                    f"How many {what} does {who} have now?")
        out.append(Gsm8kProblem(question, str(a + b - c), f"{a} + {b} - {c} = {a + b - c}\n#### {a + b - c}"))
    return out


def small_tokenizer(problems: list[Gsm8kProblem], vocab_size: int = 512):
    """A byte-level BPE over the problems' text, with the project's special tokens at ids 0..5."""
    from tasks.tokenizer.train import train_bpe

    return train_bpe([f"{p.question}\n{p.solution}" for p in problems], vocab_size)


def grpo_check(trained: Transformer, precision: str, tiny: bool, new_tokens: int | None) -> dict:
    """One GRPO step on a fresh copy of the trained weights (uncompiled: the sampler's cache lengths vary)."""
    policy = Transformer(trained.cfg)
    policy.load_state_dict({k: v.float() for k, v in trained.state_dict().items()})
    reference = copy.deepcopy(policy)
    problems = word_problems(16)
    gcfg = GrpoConfig(
        group_size=4 if tiny else 8, prompts_per_step=2 if tiny else 8,
        max_new_tokens=new_tokens or (8 if tiny else 128), steps=1, eval_prompts=0,
        rewards={"gsm8k_exact": 1.0}, accuracy_reward="gsm8k_exact", launch={"precision": precision},
    )
    t0 = time.perf_counter()
    steps = GrpoSteps(reference, small_tokenizer(problems), problems, gcfg)
    res = fit(policy, gcfg, steps, None, ListSink(), **grpo_shape(gcfg))
    metrics = next(h for h in res.history if "reward_mean" in h)
    return {"loss": metrics["loss"], "kl": metrics["kl"], "reward_mean": metrics["reward_mean"],
            "completion_len": metrics["completion_len"], "seconds": time.perf_counter() - t0,
            "skipped_steps": res.skipped_steps}


# ----------------------------------------------------------------------------- the check


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    init_distributed()
    mcfg, tcfg = check_setup(args, cuda)
    device = torch.device("cuda") if cuda else torch.device("cpu")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    dtype = torch.bfloat16 if tcfg.launch.precision == "bf16" else torch.float32
    print(f"{device_name}: {mcfg.n_layers} layers, dim {mcfg.dim}, vocab {mcfg.vocab_size} "
          f"({num_params(mcfg) / 1e6:.1f}M params); {tcfg.batch.micro_batch_size} x {tcfg.batch.seq_len} x {tcfg.batch.grad_accum} = "
          f"{tcfg.batch.tokens_per_step(1):,} tokens a step, {tcfg.launch.precision}, AdamW {tcfg.optim.kernel}, "
          f"torch.compile {'on' if tcfg.launch.torch_compile else 'off'}", flush=True)

    # The tiny CPU check measures a small matmul briefly: its seconds matter more than its peak there.
    peak = (measure_peak_flops(device, dtype, n=512, min_seconds=0.2) if args.tiny and not cuda
            else measure_peak_flops(device, dtype))
    nominal = nominal_peak(device_name, args.peak_tflops) if cuda else None
    torch.manual_seed(tcfg.seed)
    model = Transformer(mcfg)
    untimed = args.untimed if args.untimed is not None else max(1, args.steps // 5)
    t0 = time.perf_counter()
    trained = train_steps(model, tcfg.model_copy(update={"log": tcfg.log.model_copy(update={"peak_flops": peak})}), untimed)
    train_seconds = time.perf_counter() - t0

    fpt = flops_per_token(mcfg, tcfg.batch.seq_len)
    tps = trained["tokens_per_s"]
    figures = {
        "device": device_name, "preset": args.preset, "tiny": args.tiny, "params": num_params(mcfg),
        "seq_len": tcfg.batch.seq_len, "micro_batch_size": tcfg.batch.micro_batch_size, "grad_accum": tcfg.batch.grad_accum,
        "tokens_per_step": tcfg.batch.tokens_per_step(1), "precision": tcfg.launch.precision, "torch_compile": tcfg.launch.torch_compile,
        "steps": args.steps, "timed_steps": trained["timed_steps"], "train_seconds": train_seconds,
        "first_loss": trained["losses"][0] if trained["losses"] else None,
        "last_loss": trained["losses"][-1] if trained["losses"] else None,
        "tokens_per_s": tps, "flops_per_token": fpt, "peak_flops_measured": peak, "peak_flops_nominal": nominal,
        "mfu_measured_peak": mfu(tps, fpt, peak) if tps else None,
        "mfu_nominal_peak": mfu(tps, fpt, nominal) if tps and nominal else None,
        "skipped_steps": trained["skipped_steps"],
    }
    finite = (trained["error"] is None and trained["skipped_steps"] == 0 and bool(trained["losses"])
              and all(math.isfinite(x) for x in trained["losses"]))
    if finite:
        grpo = grpo_check(model, tcfg.launch.precision, args.tiny, args.grpo_tokens)
        figures["grpo"] = grpo
        finite = math.isfinite(grpo["loss"]) and grpo["skipped_steps"] == 0

    print(report(figures, trained["error"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    if not finite:
        print("FAIL: a loss was NaN/inf (see above)", flush=True)
        return 1
    goal_mfu = figures["mfu_nominal_peak"] if figures["mfu_nominal_peak"] is not None else figures["mfu_measured_peak"]
    if args.min_mfu is not None and (goal_mfu is None or goal_mfu < args.min_mfu):
        print(f"FAIL: MFU {goal_mfu} is below --min-mfu {args.min_mfu}", flush=True)
        return 2
    return 0


def report(f: dict, error: str | None) -> str:
    """The figures as a few lines."""
    lines = [f"\n{f['device']}: {f['params'] / 1e6:.1f}M params, {f['steps']} steps of {f['tokens_per_step']:,} tokens "
             f"in {f['train_seconds']:.0f} s"]
    if error:
        lines.append(f"  training stopped: {error}")
    if f["first_loss"] is not None:
        lines.append(f"  loss {f['first_loss']:.3f} -> {f['last_loss']:.3f} (skipped steps: {f['skipped_steps']})")
    if f["tokens_per_s"]:
        lines.append(f"  {f['tokens_per_s']:,.0f} tokens/s over the last {f['timed_steps']} steps; "
                     f"{f['flops_per_token'] / 1e6:.0f} MFLOP a token")
        lines.append(f"  MFU {f['mfu_measured_peak']:.1%} of the measured torch.mm {f['precision']} peak "
                     f"({f['peak_flops_measured'] / 1e12:.3g} TFLOP/s)")
        if f["mfu_nominal_peak"] is not None:
            verdict = "meets" if f["mfu_nominal_peak"] >= MFU_GOAL else "is below"
            lines.append(f"  MFU {f['mfu_nominal_peak']:.1%} of the nominal dense bf16 peak "
                         f"({f['peak_flops_nominal'] / 1e12:.0f} TFLOP/s): {verdict} the {MFU_GOAL:.0%} goal")
    if "grpo" in f:
        g = f["grpo"]
        lines.append(f"  GRPO step: loss {g['loss']:.4f}, kl {g['kl']:.4f}, reward {g['reward_mean']:.3f}, "
                     f"completion {g['completion_len']:.0f} tokens, {g['seconds']:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
