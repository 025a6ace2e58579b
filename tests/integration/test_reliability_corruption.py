"""Corrupted or truncated shards and token files are refused with an error naming the file."""
from __future__ import annotations

import random

import pytest

from tasks.data.manifest import ChecksumError, load_manifest, shard_paths
from tasks.data.shards import ShardConfig, write_shards
from tasks.tokenizer.tokenize_shards import load_token_split
from tests.conftest import write_token_shards as _write_tokens
from tests.helpers.corpora import mixed_documents


@pytest.fixture
def shards(tmp_path):
    return write_shards(mixed_documents(tmp_path / "mixed.parquet", 2_000, "d"), tmp_path / "shards", ShardConfig(shard_mb=0.1), {}, {}, [])


def _flip_bit(path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def test_single_bit_flips_in_shards_are_caught(shards):
    """Same size, one bit different: only the sha256 can tell; 20 random flips, all caught."""
    rng = random.Random(0)
    paths = shard_paths(shards)
    for _ in range(20):
        victim = rng.choice(paths)
        original = victim.read_bytes()
        _flip_bit(victim, rng)
        with pytest.raises(ChecksumError, match=rf"{victim.name}: sha256"):
            shard_paths(shards)
        victim.write_bytes(original)
    shard_paths(shards)  # restored: verifies again


def test_missing_shard_and_truncated_manifest(shards):
    victim = shard_paths(shards)[-1]
    victim.unlink()
    with pytest.raises(ChecksumError, match=rf"{victim.name}: listed in the manifest but missing"):
        shard_paths(shards)
    shards.write_text(shards.read_text()[:50])
    with pytest.raises(ValueError):  # JSONDecodeError: refused, never read as an empty shard list
        load_manifest(shards)


def test_truncated_manifest_error_names_the_file(shards):
    shards.write_text(shards.read_text()[:50])
    with pytest.raises(ValueError, match="manifest.json"):
        load_manifest(shards)


@pytest.mark.parametrize("split", ["train", "val"])
def test_token_file_bit_flip_and_truncation(tmp_path, split):
    tokens = _write_tokens(tmp_path / "tokens", 120)
    path = tokens / f"{split}.bin"
    _flip_bit(path, random.Random(1))
    load_token_split(tokens, split)  # size-only check cannot see a flip (cheap default for memory-mapping)
    with pytest.raises(ChecksumError, match=rf"{split}.bin: sha256"):
        load_token_split(tokens, split, verify_sha256=True)
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ChecksumError, match=rf"{split}.bin: .*truncated"):
        load_token_split(tokens, split)
