"""The named model shapes of models/llama.py, in a module without torch.

Configs check a name against them without importing torch.
"""
from __future__ import annotations

# Sizes are quoted at the vocabulary named in each comment; embeddings scale with vocab_size.
# ffn_hidden is about 8/3 * dim (SwiGLU keeps the MLP at ~8 dim^2 weights), rounded up to a multiple
# of 64; llama1b uses Llama 3.2-1B's own 8192.
PRESETS: dict[str, dict] = {
    # ~2.4M params at vocab 4096 (1.6M non-embedding): trains on a laptop CPU in minutes.
    "demo": dict(dim=192, n_layers=4, n_heads=6, n_kv_heads=2, ffn_hidden=512, max_seq_len=256),
    # ~25.7M params at vocab 4096 (23.6M non-embedding).
    "small25m": dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, ffn_hidden=1408, max_seq_len=512),
    # ~124M at vocab 50304, GPT-2 small shape.
    "gpt124m": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_hidden=2048, max_seq_len=1024),
    # ~360M at vocab 50304, GPT-2 medium shape.
    "gpt350m": dict(dim=1024, n_layers=24, n_heads=16, n_kv_heads=16, ffn_hidden=2816, max_seq_len=1024),
    # ~1.24B at vocab 128256, Llama-3.2-1B shape.
    "llama1b": dict(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_hidden=8192, max_seq_len=2048, rope_theta=500000.0
    ),
}


# The keys of a shape (models/llama.py ModelConfig's, vocab_size aside: the tokenizer gives it).
SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len", "rope_theta", "norm_eps",
              "tie_embeddings", "init_std")
_SIZES = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len")


def shape_problem(shape: dict) -> str | None:
    """What makes `shape` a model that cannot be built (None: nothing): ModelConfig's checks, without torch."""
    for name in _SIZES:
        if name in shape and (isinstance(shape[name], bool) or not isinstance(shape[name], int) or shape[name] <= 0):
            return f"{name}={shape[name]} must be a positive integer"
    if shape["dim"] % shape["n_heads"]:
        return f"dim={shape['dim']} must be divisible by n_heads={shape['n_heads']}"
    if shape["n_heads"] % shape["n_kv_heads"]:
        return f"n_kv_heads={shape['n_kv_heads']} must divide n_heads={shape['n_heads']} (grouped-query attention)"
    if (shape["dim"] // shape["n_heads"]) % 2:
        return f"head_dim={shape['dim'] // shape['n_heads']} must be even for rotary embeddings"
    return None
