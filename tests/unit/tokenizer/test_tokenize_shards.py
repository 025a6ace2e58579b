"""Token shards: counts add up, the split is stable and order-free, files are atomic and verified."""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from pydantic import ValidationError

import tasks.tokenizer.tokenize_shards
from models.special_tokens import EOS
from tasks.data.documents import Document
from tasks.data.manifest import ChecksumError, load_manifest
from tasks.tokenizer.tokenize_shards import (INDEX_FILE, TokenizeConfig, load_token_index, load_token_split,
                                             token_dtype, tokenize_shards, unigram_perplexity, unigram_perplexity_of,
                                             val_mask)
from tasks.tokenizer.train import TokenizerConfig, load_tokenizer, special_token_ids, train_tokenizer
from tests.helpers.corpora import random_docs, write_corpus

CFG = TokenizeConfig(val_fraction=0.25, batch_size=16)


def corpus() -> list[Document]:
    """Two sources; some documents up-sampled (same doc_id, several rows); one holds a literal "<|eos|>"."""
    docs = random_docs(150, seed=0, source="web") + random_docs(60, seed=1, source="code")
    docs += [docs[i] for i in range(0, 30, 3)] * 2  # ten web documents appear three times
    docs.append(Document("web-eos", "web", f"text that mentions {EOS} literally"))
    docs.append(Document("web-empty", "web", ""))
    return docs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokshards")
    docs = corpus()
    manifest = write_corpus(root / "shards", [docs[:100], docs[100:180], docs[180:]])
    tokenizer = train_tokenizer(manifest, root / "tokenizer", TokenizerConfig(vocab_size=300))
    index = tokenize_shards(manifest, tokenizer, root / "tokens", CFG)
    return root, manifest, tokenizer, index, docs


def split_texts(out_dir, tokenizer_path, split: str) -> list[str]:
    """Decode a split back into its documents by cutting at EOS."""
    tok = load_tokenizer(tokenizer_path)
    eos = special_token_ids(tok)[EOS]
    ids = np.asarray(load_token_split(out_dir, split))
    assert len(ids) == 0 or ids[-1] == eos  # every document, the last included, ends in EOS
    cuts = np.flatnonzero(ids == eos)
    starts = np.concatenate([[0], cuts[:-1] + 1]) if len(cuts) else []
    return [tok.decode(ids[a:b].tolist(), skip_special_tokens=False) for a, b in zip(starts, cuts)]


def test_counts_add_up(built):
    root, manifest, _, index, docs = built
    for split in ("train", "val"):
        per_source = index.sources[split]
        assert sum(c.tokens for c in per_source.values()) == index.tokens(split) == len(load_token_split(root / "tokens", split))
    rows_by_source = Counter(d.source for d in docs)
    for source, rows in rows_by_source.items():
        assert sum(index.sources[s][source].documents for s in ("train", "val") if source in index.sources[s]) == rows
    assert index.documents("train") + index.documents("val") == sum(s.rows for s in load_manifest(manifest).shards)
    assert 0.15 < index.documents("val") / len(docs) < 0.35  # val_fraction 0.25, roughly


def test_eos_separates_documents_and_text_round_trips(built):
    root, _, tokenizer, index, docs = built
    decoded = Counter(split_texts(root / "tokens", tokenizer, "train") + split_texts(root / "tokens", tokenizer, "val"))
    assert decoded == Counter(d.text for d in docs)  # one EOS per document, and nothing else is an EOS
    assert index.eos_id == 2


def test_upsampled_copies_share_a_split(built):
    root, _, tokenizer, _, docs = built
    copies = Counter(d.text for d in docs)
    for split in ("train", "val"):
        for text, n in Counter(split_texts(root / "tokens", tokenizer, split)).items():
            assert n == copies[text], f"{text[:30]!r}: {n} of {copies[text]} copies in {split}"


def test_split_is_stable_and_independent_of_shard_order(built, tmp_path):
    root, _, tokenizer, index, docs = built
    again = tokenize_shards(root / "shards" / "manifest.json", tokenizer, tmp_path / "again", CFG)
    assert again == index  # same files, byte for byte (sha256), same counts

    shuffled = [docs[i] for i in np.random.default_rng(9).permutation(len(docs))]
    other = write_corpus(tmp_path / "reshard", [shuffled[:40], shuffled[40:]])
    moved = tokenize_shards(other, tokenizer, tmp_path / "moved", CFG)
    assert moved.sources == index.sources and moved.manifest_sha256 != index.manifest_sha256
    for split in ("train", "val"):
        assert Counter(split_texts(tmp_path / "moved", tokenizer, split)) == Counter(split_texts(root / "tokens", tokenizer, split))


def test_val_mask_is_a_pure_function_of_doc_id():
    ids = [f"doc-{i}" for i in range(2000)]
    mask = val_mask(ids, 0.1)
    assert (val_mask(ids[::-1], 0.1) == mask[::-1]).all()
    assert 120 < mask.sum() < 280
    assert not val_mask(ids, 0.0).any()
    assert (val_mask(ids, 0.5) >= mask).all()  # a larger fraction only adds documents to val


def test_memmap_dtype_size_and_index(built):
    root, manifest, tokenizer, index, _ = built
    out = root / "tokens"
    train = load_token_split(out, "train", verify_sha256=True)
    assert isinstance(train, np.memmap) and train.dtype == np.uint16 and not train.flags.writeable
    assert (out / "train.bin").stat().st_size == 2 * index.tokens("train") == 2 * len(train)
    assert int(train.max()) < index.vocab_size == load_tokenizer(tokenizer).get_vocab_size()
    on_disk = json.loads((out / INDEX_FILE).read_text())
    assert on_disk["dtype"] == "uint16" and set(on_disk["files"]) == {"train", "val"}
    assert len(on_disk["tokenizer_sha256"]) == len(on_disk["manifest_sha256"]) == 64
    assert token_dtype(300) == np.uint16 and token_dtype(1 << 16) == np.uint16 and token_dtype((1 << 16) + 1) == np.uint32
    with pytest.raises(ValueError, match="choose one of"):
        load_token_split(out, "test")


def test_truncated_bin_is_refused(built, tmp_path):
    root, _, tokenizer, _, _ = built
    out = tmp_path / "t"
    tokenize_shards(root / "shards", tokenizer, out, CFG)
    with open(out / "val.bin", "r+b") as fh:
        fh.truncate((out / "val.bin").stat().st_size - 2)
    with pytest.raises(ChecksumError, match="val.bin"):
        load_token_split(out, "val")


def test_index_is_the_completion_marker(built, tmp_path, monkeypatch):
    root, _, tokenizer, _, docs = built
    out = tmp_path / "t"
    tokenize_shards(root / "shards", tokenizer, out, CFG)
    index_mtime = (out / INDEX_FILE).stat().st_mtime_ns
    assert all((out / f).stat().st_mtime_ns <= index_mtime for f in ("train.bin", "val.bin"))
    (out / INDEX_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        load_token_split(out, "train")

    # A rerun that fails part-way leaves the folder marked incomplete and no temp files behind.
    tokenize_shards(root / "shards", tokenizer, out, CFG)
    bad = write_corpus(tmp_path / "bad", [docs[:50], docs[50:]])
    (tmp_path / "bad" / "shard-00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(ChecksumError, match="shard-00001.parquet"):
        tokenize_shards(bad, tokenizer, out, CFG)
    # The checksum failure comes before anything is touched: the previous complete run stands.
    assert load_token_index(out).documents("train") > 0

    def explode(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tasks.tokenizer.tokenize_shards, "_count", explode)
    with pytest.raises(RuntimeError, match="disk full"):
        tokenize_shards(root / "shards", tokenizer, out, CFG)
    assert not (out / INDEX_FILE).exists()
    assert sorted(p.name for p in out.iterdir()) == ["train.bin", "val.bin"]


def test_unigram_perplexity_by_hand():
    # vocab 4, train [0, 0, 1]: add-one p = (3, 2, 1, 1) / 7; val [0, 2]: ppl = (3/7 * 1/7) ** -1/2 = 7 / sqrt(3)
    ppl = unigram_perplexity_of(np.array([0, 0, 1], np.uint16), np.array([0, 2], np.uint16), vocab_size=4)
    assert ppl == pytest.approx(7 / math.sqrt(3), rel=1e-12)
    # No training data: uniform over the vocabulary.
    assert unigram_perplexity_of(np.array([], np.uint16), np.array([3, 1], np.uint16), vocab_size=4) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="outside vocab_size"):
        unigram_perplexity_of(np.array([0, 5], np.uint16), np.array([0], np.uint16), vocab_size=4)
    with pytest.raises(ValueError, match="no validation tokens"):
        unigram_perplexity_of(np.array([0], np.uint16), np.array([], np.uint16), vocab_size=4)


def test_unigram_perplexity_of_token_shards(built):
    root, _, _, index, _ = built
    train = Counter(np.asarray(load_token_split(root / "tokens", "train")).tolist())
    val = np.asarray(load_token_split(root / "tokens", "val")).tolist()
    total = sum(train.values())
    nll = -sum(math.log((train[t] + 1) / (total + index.vocab_size)) for t in val) / len(val)
    ppl = unigram_perplexity(root / "tokens")
    assert ppl == pytest.approx(math.exp(nll), rel=1e-9)
    assert 1 < ppl < index.vocab_size  # better than uniform on this repetitive corpus


def test_config_is_validated():
    with pytest.raises(ValidationError, match="val_fraction"):
        TokenizeConfig(val_fraction=1.0)
    with pytest.raises(ValidationError, match="batch_size"):
        TokenizeConfig(batch_size=0)
