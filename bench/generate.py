"""Generation speed with the KV cache vs without: same model, same prompts, greedy decoding.

    python bench/generate.py                      # demo preset, random init, CPU
    python bench/generate.py --model work/models/pretrain --new-tokens 200
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from models.export import load_model
from models.llama import Transformer, model_config
from models.presets import PRESETS
from models.sampling import generate


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="folder written by models.export.save_model (default: random init)")
    p.add_argument("--preset", default="demo", choices=sorted(PRESETS), help="preset when --model is not given")
    p.add_argument("--vocab-size", type=int, default=4096, help="vocab size when --model is not given")
    p.add_argument("--batch", type=int, default=4, help="prompts decoded together")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=192)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def timed(model: Transformer, prompt: torch.Tensor, new_tokens: int, use_cache: bool):
    """Tokens/s of one greedy generation run (after a short warm-up), and its output."""
    generate(model, prompt, min(4, new_tokens), temperature=0.0, use_cache=use_cache)  # warm up kernels
    if prompt.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = generate(model, prompt, new_tokens, temperature=0.0, use_cache=use_cache)
    if prompt.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return out.new_tokens.numel() / seconds, seconds, out


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.model:
        model = load_model(args.model, map_location=args.device)
    else:
        model = Transformer(model_config(args.preset, args.vocab_size))
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    cfg = model.cfg
    prompt = torch.randint(6, cfg.vocab_size, (args.batch, args.prompt_len), device=args.device)

    cached_tps, cached_s, cached = timed(model, prompt, args.new_tokens, use_cache=True)
    plain_tps, plain_s, plain = timed(model, prompt, args.new_tokens, use_cache=False)
    n_params = sum(p.numel() for p in model.parameters())
    agree = (cached.new_tokens == plain.new_tokens).float().mean().item()
    print(f"model: {args.model or args.preset} ({n_params / 1e6:.1f}M params, {args.dtype}, {args.device}, "
          f"{torch.get_num_threads()} CPU threads)")
    print(f"batch {args.batch} x prompt {args.prompt_len} -> {args.new_tokens} new tokens, greedy")
    print(f"with KV cache   : {cached_tps:9.1f} tokens/s ({cached_s:.2f} s)")
    print(f"without KV cache: {plain_tps:9.1f} tokens/s ({plain_s:.2f} s)")
    print(f"speed-up        : {cached_tps / plain_tps:9.2f}x   (greedy tokens identical: {agree:.1%})")


if __name__ == "__main__":
    main()
