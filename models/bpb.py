"""Bits per byte: a next-token loss that does not depend on the tokenizer.

A loss per token (and so perplexity) changes with the vocabulary: a tokenizer with longer
tokens predicts fewer, harder tokens for the same text. Dividing the nats summed over the
predicted tokens by the UTF-8 bytes those tokens decode to, and by ln 2, gives bits per byte
of text, which two runs with different tokenizers can compare (nanochat reports it for this
reason).

    table = token_bytes(tokenizer)                       # once per tokenizer: bytes of each id
    nats, n_bytes = nats_and_bytes(token_nats, targets, table)   # per batch, summed (tensors)
    bits_per_byte(total_nats, total_bytes)               # at the end, over all batches

Special tokens (BOS, EOS, the chat markers) decode to no text: their table entry is 0, and a
position whose target has 0 bytes counts neither its nats nor its bytes.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from tokenizers import decoders

from models.losses import IGNORE_INDEX
from models.special_tokens import SPECIAL_TOKENS

LN2 = math.log(2.0)


def byte_level_alphabet() -> dict[str, int]:
    """The byte each character of a byte-level (GPT-2) token stands for.

    Byte-level BPE writes a byte as a printable character: bytes that are printable latin-1
    stand for themselves, the other 68 are shifted to U+0100 and up, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return {c: b for b, c in chars.items()}


def _is_byte_level(tokenizer) -> bool:
    return isinstance(tokenizer.decoder, decoders.ByteLevel)


def _special_ids(tokenizer) -> set[int]:
    ids = {tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    ids |= {i for i, added in tokenizer.get_added_tokens_decoder().items() if added.special}
    return {i for i in ids if i is not None}


def token_bytes(tokenizer) -> np.ndarray:
    """int64 [vocab]: the UTF-8 bytes of each token id's text; 0 for special tokens.

    For a byte-level BPE each character of a token is one byte (byte_level_alphabet), so a
    token holding half of a multi-byte character counts its own bytes: decoding it alone
    would give U+FFFD (3 bytes) instead. Other tokenizers count the UTF-8 of the decoded token.
    """
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    special = _special_ids(tokenizer)
    alphabet = byte_level_alphabet() if _is_byte_level(tokenizer) else {}
    table = np.zeros(vocab, dtype=np.int64)
    for i in range(vocab):
        if i in special:
            continue
        piece = tokenizer.id_to_token(i)
        if piece is None:
            continue  # a hole in the ids: never predicted as text
        if alphabet and all(c in alphabet for c in piece):
            table[i] = len(piece)
        else:
            table[i] = len(tokenizer.decode([i], skip_special_tokens=False).encode("utf-8"))
    return table


def bits_per_byte(nats_sum: float, n_bytes: int) -> float:
    """Nats summed over predicted tokens / ln 2 / the UTF-8 bytes of those tokens."""
    if n_bytes <= 0:
        raise ValueError(f"n_bytes must be positive (the bytes of the predicted text); got {n_bytes}")
    return float(nats_sum) / LN2 / float(n_bytes)


def nats_and_bytes(token_nats: torch.Tensor, targets: torch.Tensor, table: torch.Tensor | np.ndarray,
                   dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(nats summed, bytes summed), float64 and int64 on `token_nats`' device: scalars, or per row with dim=-1.

    token_nats[b, t] is -log p(targets[b, t]) in nats (e.g. -models.losses.token_logprobs);
    positions with target IGNORE_INDEX (-100), or a target of 0 bytes in `table` (token_bytes:
    the special tokens), count neither. Tensors, not floats, so a distributed validation loop
    can all_reduce both before dividing with bits_per_byte; give `table` as a tensor on that
    device to save a copy per batch.
    """
    if token_nats.shape != targets.shape:
        raise ValueError(f"token_nats {tuple(token_nats.shape)} and targets {tuple(targets.shape)} must have one shape")
    table = torch.as_tensor(table, dtype=torch.long, device=targets.device)
    valid = targets != IGNORE_INDEX
    ids = targets.masked_fill(~valid, 0)
    if valid.any() and int(ids.max()) >= table.numel():
        raise ValueError(f"target id {int(ids.max())} is outside the byte table of {table.numel()} ids; "
                         "build the table with token_bytes of the tokenizer that made these targets")
    n_bytes = table[ids] * valid
    counted = n_bytes > 0
    # where, not a product: a masked position's nats may be inf or NaN, and inf * 0 is NaN.
    nats = torch.where(counted, token_nats.double(), 0.0)
    if dim is None:
        return nats.sum(), n_bytes.sum()
    return nats.sum(dim), n_bytes.sum(dim)
