"""Held-out targets: raw texts every model of a comparison is scored on, window by window, in bits per byte.

    texts = read_target(path)                                   tasks/eval/target_files.py
    windows = target_windows(texts, tokenizer, seq_len)         [n, seq_len + 1] token ids, EOS between texts
    scores = score_windows(model, windows, table)               [n, (nats, bytes)]: what seed_differences pairs

A target is read as it is, never through a data recipe's filters: it measures what a model learned, not what
a recipe kept. Each text is encoded with the comparison's one tokenizer (special-token text stays text) and
followed by EOS, the texts laid end to end and cut into whole windows of seq_len + 1 tokens (the tail that
does not fill a window is left out). A window's nats are summed over its predicted tokens and its bytes are
those tokens' UTF-8 bytes (models/bpb.py), so bits per byte compare across models and tokenizers.
"""
from __future__ import annotations

import numpy as np
import torch

from models.bpb import nats_and_bytes
from models.losses import token_logprobs
from models.special_tokens import EOS
from tasks.tokenizer.train import special_token_ids


def target_windows(texts: list[str], tokenizer, seq_len: int) -> np.ndarray:
    """int64 [n, seq_len + 1]: the texts' tokens, each text followed by EOS, cut into whole windows."""
    tokenizer.encode_special_tokens = True  # "<|eos|>" inside a text is text
    eos = special_token_ids(tokenizer, origin="the comparison's tokenizer")[EOS]
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids += encoding.ids
        ids.append(eos)
    n = len(ids) // (seq_len + 1)
    if n == 0:
        raise ValueError(f"the target's {len(ids)} tokens fill no window of {seq_len + 1}: give it more text")
    return np.asarray(ids[: n * (seq_len + 1)], dtype=np.int64).reshape(n, seq_len + 1)


@torch.no_grad()
def score_windows(model: torch.nn.Module, windows: np.ndarray, table: np.ndarray, batch: int = 16) -> np.ndarray:
    """float64 [n, 2]: each window's summed nats and bytes over its predicted tokens."""
    model.eval()
    table_t = torch.as_tensor(table, dtype=torch.long)
    out = np.zeros((len(windows), 2), dtype=np.float64)
    for start in range(0, len(windows), batch):
        rows = torch.as_tensor(windows[start:start + batch])
        inputs, targets = rows[:, :-1], rows[:, 1:]
        nats, n_bytes = nats_and_bytes(-token_logprobs(model(inputs), targets), targets, table_t, dim=-1)
        out[start:start + len(rows), 0] = nats.numpy()
        out[start:start + len(rows), 1] = n_bytes.numpy()
    return out
