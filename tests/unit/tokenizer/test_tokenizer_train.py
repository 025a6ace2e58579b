"""The byte-level BPE: special tokens at 0..5, any text round-trips, loads in transformers with the same ids."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from models.special_tokens import EOS, SPECIAL_TOKENS
from tasks.data.documents import Document
from tasks.data.manifest import ChecksumError
from tasks.tokenizer.train import TokenizerConfig, load_tokenizer, special_token_ids, train_tokenizer
from tests.helpers.corpora import random_docs, write_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    docs = random_docs(120)
    manifest = write_corpus(root / "shards", [docs[:70], docs[70:]])
    return train_tokenizer(manifest, root / "tokenizer", TokenizerConfig(vocab_size=300))


def test_special_tokens_take_ids_0_to_5(trained):
    tok = load_tokenizer(trained)
    assert trained.name == "tokenizer.json"
    assert special_token_ids(tok) == {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    assert 262 < tok.get_vocab_size() <= 300  # 6 specials + 256 bytes + some merges
    assert not list(trained.parent.glob(".*tmp"))  # no leftover temp file


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_any_unicode_text_round_trips(trained_tokenizer, text):
    ids = trained_tokenizer.encode(text).ids
    assert trained_tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.fixture(scope="module")
def trained_tokenizer(trained):
    return load_tokenizer(trained)


SAMPLES = [
    "the cat sat on a mat",
    "  leading spaces, tabs\tand\nnewlines\r\n",
    "naïve café — 日本語のテキスト 🎉🧪 emoji, Ελληνικά, עברית, \u200bzero-width",
    "a literal <|eos|> inside text",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_loads_in_transformers_with_identical_ids(trained, trained_tokenizer, text):
    hf = PreTrainedTokenizerFast(tokenizer_file=str(trained))
    ids = trained_tokenizer.encode(text).ids
    assert hf.encode(text, add_special_tokens=False) == ids
    assert hf.decode(ids) == text
    assert hf.convert_tokens_to_ids(EOS) == 2


def test_training_is_deterministic(tmp_path):
    manifest = write_corpus(tmp_path / "s", [random_docs(60, seed=3)])
    a = train_tokenizer(manifest, tmp_path / "a", TokenizerConfig(vocab_size=300))
    b = train_tokenizer(manifest, tmp_path / "b", TokenizerConfig(vocab_size=300))
    assert a.read_bytes() == b.read_bytes()


def test_digits_are_single_tokens_unless_turned_off(tmp_path):
    # A corpus full of the same numbers: a plain BPE merges them, the digit split must not.
    docs = [Document(f"d{i}", "s", f"port 8080 year 2024 item {i} costs 1999") for i in range(200)]
    manifest = write_corpus(tmp_path / "s", [docs])

    def pieces(split_digits: bool) -> list[str]:
        tok = load_tokenizer(train_tokenizer(manifest, tmp_path / str(split_digits), TokenizerConfig(vocab_size=400, split_digits=split_digits)))
        enc = tok.encode("port 8080 costs 1999")
        assert tok.decode(enc.ids) == "port 8080 costs 1999"
        return [tok.id_to_token(i) for i in enc.ids]

    digit_pieces = [p for p in pieces(True) if any(c.isdigit() for c in p)]
    assert digit_pieces == list("80801999")
    assert any(sum(c.isdigit() for c in p) > 1 for p in pieces(False))


def test_max_documents_caps_the_training_sample(tmp_path):
    # Each document is one letter pair repeated, so each one teaches exactly one merge.
    docs = [Document(f"d{i}", "s", " ".join([c + c] * 50)) for i, c in enumerate("abcdefgh")]
    manifest = write_corpus(tmp_path / "s", [docs[:4], docs[4:]])

    def merges(cfg: TokenizerConfig) -> set[str]:
        vocab = load_tokenizer(train_tokenizer(manifest, tmp_path / "t", cfg)).get_vocab()
        return {t for t, i in vocab.items() if i >= len(SPECIAL_TOKENS) + 256}

    every = merges(TokenizerConfig(vocab_size=400))
    assert {c + c for c in "abcdefgh"} <= every
    capped = merges(TokenizerConfig(vocab_size=400, max_documents=2, seed=5))
    assert len({c + c for c in "abcdefgh"} & capped) == 2
    assert capped == merges(TokenizerConfig(vocab_size=400, max_documents=2, seed=5))  # same seed, same sample


def test_missing_special_token_is_named():
    bare = Tokenizer(models.BPE())
    bare.add_special_tokens(SPECIAL_TOKENS[:2])
    with pytest.raises(ValueError, match=r"<\|eos\|>.*retrain"):
        special_token_ids(bare)


def test_load_missing_tokenizer_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="train one first"):
        load_tokenizer(tmp_path)


def test_corrupted_shard_is_refused(tmp_path):
    manifest = write_corpus(tmp_path / "s", [random_docs(10), random_docs(10, seed=1, source="b")])
    shard = tmp_path / "s" / "shard-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="shard-00001.parquet"):
        train_tokenizer(manifest, tmp_path / "t", TokenizerConfig(vocab_size=300))


def test_empty_corpus_and_bad_config_are_refused(tmp_path):
    manifest = write_corpus(tmp_path / "s", [])
    with pytest.raises(ValueError, match="no documents"):
        train_tokenizer(manifest, tmp_path / "t", TokenizerConfig(vocab_size=300))
    with pytest.raises(ValidationError, match="vocab_size"):
        TokenizerConfig(vocab_size=100)
    with pytest.raises(ValidationError, match="vocabsize"):
        TokenizerConfig.model_validate({"vocabsize": 300})
