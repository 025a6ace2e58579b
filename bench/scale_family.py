"""Training speed of a sweep's family members against the demo model, in the same run (tokens per CPU-second).

    DS_ACCELERATOR=cpu .venv/bin/python bench/scale_family.py --preset tiny      # ~1 minute

For each member the `scale:` section of the preset can choose, a few optimizer steps of the
model, cross-entropy and torch's AdamW on random tokens of the preset's batch shape, one thread,
fp32, timed by CPU time (which holds better than wall time on a shared machine); then the demo
model the same way. The ratio to the demo carries over to a machine where the demo's speed is
known (BENCHMARKS.md "Training step"), to estimate a sweep's time there.
"""
from __future__ import annotations

import argparse
import time

import torch


def tokens_per_cpu_s(model: torch.nn.Module, vocab: int, rows: int, seq: int, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, vocab, (rows, seq + 1), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        logits = model(x[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), x[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad()

    step()  # first-call allocations out of the timing
    start = time.process_time()
    for _ in range(steps):
        step()
    return steps * rows * seq / (time.process_time() - start)


def main() -> None:
    from flows.config import load_pipeline_config
    from models.llama import Transformer, model_config
    from tasks.training.scaling.sweep import sweep_members

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--depths", type=int, nargs="*", help="members to time (default: the first 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_pipeline_config(args.preset)
    vocab, rows, seq = cfg.tokenizer.vocab_size, cfg.pretrain.batch.micro_batch_size, cfg.pretrain.batch.seq_len
    members = sweep_members(cfg.scale, cfg.pretrain, vocab)
    chosen = [m for m in members if m.depth in args.depths] if args.depths else members[:4]
    demo = tokens_per_cpu_s(Transformer(model_config("demo", vocab)), vocab, rows, seq, args.steps)
    print(f"demo: {demo:,.0f} tokens/CPU-s")
    for m in chosen:
        torch.manual_seed(0)
        speed = tokens_per_cpu_s(Transformer(m.config), vocab, rows, seq, args.steps)
        print(f"depth {m.depth}: N={m.n_params:,}, {m.flops_per_token:.3g} FLOPs/token: {speed:,.0f} tokens/CPU-s, "
              f"{speed / demo:.2f}x the demo")


if __name__ == "__main__":
    main()
