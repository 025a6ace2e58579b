"""Bits per byte against an independent count (decode the targets, count their UTF-8), and across tokenizers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.bpb import LN2, bits_per_byte, byte_level_alphabet, nats_and_bytes, token_bytes
from models.losses import IGNORE_INDEX, token_logprobs
from models.special_tokens import BOS, EOS, SPECIAL_TOKENS
from tasks.tokenizer.train import train_bpe

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Multi-byte characters on purpose: a BPE token may then hold part of a character, whose
# bytes must still count (decoding that token alone gives U+FFFD, 3 bytes, whatever it holds).
_DOCS = ["Grüße aus Köln, 25 + 38 = 63.", "日本語のテキスト and plain text", "naïve café ø ß", "x = y\n\tz"]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(_DOCS * 30, vocab_size=320)


def test_byte_level_alphabet_is_the_tokenizers_one() -> None:
    from tokenizers import pre_tokenizers

    alphabet = byte_level_alphabet()
    assert set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n") and alphabet["a"] == ord("a")


def test_token_bytes_sum_to_the_utf8_length_and_specials_are_zero(bpe) -> None:
    table = token_bytes(bpe)
    assert table.shape == (bpe.get_vocab_size(with_added_tokens=True),)
    assert table[: len(SPECIAL_TOKENS)].tolist() == [0] * len(SPECIAL_TOKENS)
    assert (table[len(SPECIAL_TOKENS):] >= 1).all()
    for text in [*_DOCS, "unseen: Ærø 東京"]:
        ids = bpe.encode(text).ids
        assert int(table[ids].sum()) == len(text.encode("utf-8")), text


def test_a_tokenizer_that_is_not_byte_level_counts_the_utf8_of_each_decoded_token(tmp_path) -> None:
    from tokenizers import Tokenizer

    from tests.conftest import write_word_tokenizer

    words = Tokenizer.from_file(str(write_word_tokenizer(tmp_path / "tokenizer.json", vocab_size=12)))
    table = token_bytes(words)
    assert table.tolist() == [0] * len(SPECIAL_TOKENS) + [len(f"w{i}") for i in range(len(SPECIAL_TOKENS), 12)]


def _batch(bpe) -> tuple[torch.Tensor, list[str]]:
    """Rows of [BOS doc EOS BOS doc EOS ...] as next-token targets, the first document of each row masked
    (IGNORE_INDEX, as SFT masks a prompt); returns the targets and, per row, the text that is scored."""
    bos, eos = bpe.token_to_id(BOS), bpe.token_to_id(EOS)
    rows, scored = [], []
    for r in range(len(_DOCS)):
        docs = [_DOCS[(r + k) % len(_DOCS)] for k in range(3)]
        ids = [[bos, *bpe.encode(d).ids, eos] for d in docs]
        rows.append([IGNORE_INDEX] * len(ids[0]) + ids[1] + ids[2])
        scored.append(docs[1] + docs[2])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [IGNORE_INDEX] * (width - len(r)) for r in rows]), scored


def test_nats_and_bytes_match_an_independent_count(bpe) -> None:
    targets, scored = _batch(bpe)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(*targets.shape, bpe.get_vocab_size(), generator=gen)
    token_nats = -token_logprobs(logits, targets)
    nats, n_bytes = nats_and_bytes(token_nats, targets, token_bytes(bpe))

    # By hand: decode each row's scored targets (the tokenizer drops the special tokens) and
    # count their UTF-8; add up -log softmax at every position whose target is text.
    special = {bpe.token_to_id(t) for t in SPECIAL_TOKENS}
    want_bytes, want_nats = 0, 0.0
    for b, row in enumerate(targets.tolist()):
        kept = [t for t in row if t != IGNORE_INDEX]
        text = bpe.decode(kept)
        assert text == scored[b]
        want_bytes += len(text.encode("utf-8"))
        for t, target in enumerate(row):
            if target != IGNORE_INDEX and target not in special:
                want_nats -= float(torch.log_softmax(logits[b, t].double(), dim=-1)[target])
    assert int(n_bytes) == want_bytes
    assert float(nats) == pytest.approx(want_nats, rel=1e-6)
    assert nats.dtype == torch.float64 and n_bytes.dtype == torch.int64
    assert bits_per_byte(float(nats), int(n_bytes)) == pytest.approx(want_nats / math.log(2) / want_bytes, rel=1e-6)


def test_masked_positions_with_infinite_nats_count_nothing(bpe) -> None:
    targets = torch.tensor([[IGNORE_INDEX, bpe.token_to_id(EOS), bpe.encode("a").ids[0]]])
    token_nats = torch.tensor([[math.inf, math.inf, 2.0]])
    nats, n_bytes = nats_and_bytes(token_nats, targets, token_bytes(bpe))
    assert (float(nats), int(n_bytes)) == (2.0, 1)


def test_errors_name_the_input(bpe) -> None:
    table = token_bytes(bpe)
    with pytest.raises(ValueError, match="n_bytes must be positive"):
        bits_per_byte(1.0, 0)
    with pytest.raises(ValueError, match="outside the byte table"):
        nats_and_bytes(torch.ones(1, 1), torch.tensor([[len(table)]]), table)
    with pytest.raises(ValueError, match="one shape"):
        nats_and_bytes(torch.ones(1, 2), torch.tensor([[7]]), table)


# ----------------------------------------------------------------------------- across tokenizers

# Characters drawn independently (Zipf weights, some of them 2 and 3 bytes long): no model over
# any tokenization can beat the source's entropy per byte, and a unigram model over BPE tokens
# comes close to it, so its bits per byte should hardly depend on the vocabulary, while its
# nats per token grow with the tokens' length.
_CHARS = list("etaoinshrdlu ") + ["é", "ü", "ß", "日"]
_P = 1.0 / np.arange(1, len(_CHARS) + 1)
_P /= _P.sum()


def _source_text(seed: int, n_chars: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(np.asarray(_CHARS)[rng.choice(len(_CHARS), size=n_chars, p=_P)])


def _unigram_scores(tokenizer, train: str, heldout: str) -> tuple[float, float]:
    """(nats per token, bits per byte) on `heldout` of unigram frequencies fitted on `train` (add-1/2)."""
    table = token_bytes(tokenizer)
    counts = np.bincount(tokenizer.encode(train).ids, minlength=table.size).astype(np.float64) + 0.5
    counts[table == 0] = 0.0  # special tokens are never text
    logp = torch.from_numpy(np.log(np.maximum(counts, 1e-300) / counts.sum()))
    ids = torch.tensor([tokenizer.encode(heldout).ids])
    nats, n_bytes = nats_and_bytes(-logp[ids], ids, table)
    return float(nats) / ids.numel(), bits_per_byte(float(nats), int(n_bytes))


def test_two_tokenizers_give_comparable_bits_per_byte_for_a_unigram_model() -> None:
    train, heldout = _source_text(1, 60_000), _source_text(2, 20_000)
    chunks = [train[i : i + 1000] for i in range(0, len(train), 1000)]
    small, large = train_bpe(chunks, vocab_size=300), train_bpe(chunks, vocab_size=1500)
    nats_small, bpb_small = _unigram_scores(small, train, heldout)
    nats_large, bpb_large = _unigram_scores(large, train, heldout)
    bytes_per_char = float(_P @ np.array([len(c.encode("utf-8")) for c in _CHARS]))
    source_bpb = float(-(_P * np.log(_P)).sum()) / LN2 / bytes_per_char

    assert nats_large / nats_small > 1.5  # per token, the two runs cannot be compared
    assert abs(bpb_large - bpb_small) / bpb_small < 0.10  # per byte, they can
    for bpb in (bpb_small, bpb_large):
        assert source_bpb <= bpb < 1.15 * source_bpb  # and both are near the source's entropy, never below it
