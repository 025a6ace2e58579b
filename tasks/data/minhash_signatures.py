"""MinHash signatures of word n-gram shingles, a whole batch at a time.

Shingles are word n-grams of a text's dedup key (tasks/data/text_normalize.py: invisible
characters stripped, NFKC), the form exact dedup compares. Two families of schemes:

- "xxh3" (the default, fast): the batch's texts are split into words in C
  (`pyarrow.compute.utf8_split_whitespace`, which splits on exactly the characters
  Python's `str.split()` does), the distinct words are hashed once each with seeded
  XXH3-64, n consecutive word hashes are folded into one n-gram hash with numpy over the
  whole batch, and each shingle hash (upper 32 bits after a 64-bit finaliser; the exact
  check's shingle sets keep all 64) goes through
  `a*h + b mod 2^32` permutations. Signatures are uint32. 32-bit permutations, not
  64-bit multiply-shift: numpy has SIMD uint32 multiplies but emulates uint64 ones, which makes
  the permutation stage several times faster.
  Deterministic across processes and machines: no Python `hash()`, fixed seeds.
- "affine32", "affine64", "legacy": bit-identical to `datasketch.MinHash(num_perm, seed,
  scheme)` updated with the shingle strings as UTF-8 (SHA-1 per shingle, slower),
  for signatures that must match datasketch's.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from tasks.data.documents import text_byte_slices
from tasks.data.text_normalize import dedup_key

Scheme = Literal["xxh3", "affine32", "affine64", "legacy"]
DATASKETCH_SCHEMES = ("affine32", "affine64", "legacy")

_MERSENNE_PRIME = np.uint64((1 << 61) - 1)
_MAX_HASH = {
    "xxh3": np.uint32(0xFFFFFFFF),
    "affine32": np.uint32(0xFFFFFFFF),
    "affine64": np.uint64(0xFFFFFFFFFFFFFFFF),
    "legacy": np.uint64(0xFFFFFFFF),
}
DTYPE = {"xxh3": np.uint32, "affine32": np.uint32, "affine64": np.uint64, "legacy": np.uint64}
# MurmurHash3 finaliser (shift, multiplier, shift, multiplier, shift), as datasketch pre-mixes affine schemes.
_FMIX = {
    "affine32": (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16),
    "affine64": (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33),
}
# Cells of the [num_perm, shingles] permutation matrix computed at once: bounds worker memory
# (4-8 MB) and keeps it near the CPU caches.
_CHUNK_CELLS = 1 << 20
# Text bytes a signature job works on at once (see signature_job).
SUB_BATCH_BYTES = 1 << 20
# Odd multiplier of the n-gram fold (2^64 / golden ratio): any odd constant makes the fold
# order-sensitive and invertible per word; this one spreads bits well.
_FOLD = np.uint64(0x9E3779B97F4A7C15)
# ASCII characters dedup_key removes (C0 controls except \t \n \r, and DEL): in ASCII text
# without them, dedup_key only changes blanks and line ends, so the words are the same.
_ASCII_KEY_CHANGES = "[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]"


def shingles(text: str, n: int) -> list[str]:
    """Word n-grams of `text` (split on whitespace, joined by one space); a text of
    fewer than n words is one shingle, a text with no words has none."""
    words = text.split()
    if len(words) <= n:
        return [" ".join(words)] if words else []
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def permutations(num_perm: int, seed: int, scheme: Scheme) -> np.ndarray:
    """The (a, b) permutation parameters, shape [2, num_perm]: datasketch's draws for its
    schemes, odd `a` and any `b` below 2^32 for xxh3."""
    if scheme == "xxh3":
        rng = np.random.default_rng(seed)
        a = rng.integers(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
        b = rng.integers(0, 1 << 32, num_perm, dtype=np.uint32)
        return np.array([a, b])
    # Imported here: datasketch brings scipy (a costly import), which a worker of the xxh3 scheme never needs.
    from datasketch import MinHash

    return np.asarray(MinHash(num_perm, seed=seed, scheme=scheme).permutations, dtype=DTYPE[scheme])


def _fmix(h: np.ndarray, consts: tuple[int, ...]) -> np.ndarray:
    s1, m1, s2, m2, s3 = (h.dtype.type(c) for c in consts)
    h = h ^ (h >> s1)
    h *= m1
    h ^= h >> s2
    h *= m2
    return h ^ (h >> s3)


def _sha1_shingle_hashes(texts: Sequence[str], ngram: int, scheme: Scheme) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First 4 (8 for affine64) little-endian bytes of SHA-1 of each shingle of each text's
    dedup key, as datasketch's sha1_hash32/64, the number of shingles per text, and each
    shingle's first 8 bytes (uint64) for the shingle sets."""
    sha1 = hashlib.sha1
    digests: list[bytes] = []
    counts = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        grams = shingles(dedup_key(text), ngram)
        counts[i] = len(grams)
        digests.extend([sha1(g.encode("utf-8")).digest() for g in grams])
    raw = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 20)
    wide = np.ascontiguousarray(raw[:, :8]).view("<u8").ravel().astype(np.uint64, copy=False)
    if scheme == "affine64":
        hashes = wide
    else:
        hashes = np.ascontiguousarray(raw[:, :4]).view("<u4").ravel().astype(DTYPE[scheme], copy=False)
    if scheme != "legacy":
        with np.errstate(over="ignore"):
            hashes = _fmix(hashes, _FMIX[scheme])
    return hashes, counts, wide


def dedup_keys(texts: pa.Array) -> pa.Array:
    """`dedup_key` of each text, computed in Python only where it can change the words:
    non-ASCII texts and ASCII texts with control characters."""
    needs = pc.or_(pc.invert(pc.string_is_ascii(texts)), pc.match_substring_regex(texts, _ASCII_KEY_CHANGES))
    if not pc.any(needs).as_py():
        return texts
    keys = [dedup_key(t) for t in texts.filter(needs).to_pylist()]
    return pc.replace_with_mask(texts, needs, pa.array(keys, pa.string()))


def _xxh3_shingle_hashes(texts: pa.Array, ngram: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """32-bit hashes of each text's word n-grams (see the module docstring), flat, and the
    number of shingles per text (a text of 1..n-1 words has one, a text of none has none)."""
    wide, counts = _xxh3_shingle_hashes64(texts, ngram, seed)
    return (wide >> np.uint64(32)).astype(np.uint32), counts


def _xxh3_shingle_hashes64(texts: pa.Array, ngram: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit shingle hashes whose upper halves `_xxh3_shingle_hashes` gives: the shingle
    sets keep all 64 bits (see unique_shingle_sets)."""
    lists = pc.utf8_split_whitespace(dedup_keys(texts))
    flat = lists.flatten()
    # Leading or trailing whitespace gives empty "words": drop them and recount per text.
    nonempty = pc.greater(pc.binary_length(flat), 0)
    cum = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum(nonempty.to_numpy(zero_copy_only=False), out=cum[1:])
    offsets = lists.offsets.to_numpy()
    starts = cum[offsets[:-1]]
    n_words = cum[offsets[1:]] - starts
    encoded = pc.dictionary_encode(flat.filter(nonempty))
    unique = encoded.dictionary.to_pylist()
    hash64 = xxhash.xxh3_64_intdigest
    word_hashes = np.fromiter((hash64(w, seed) for w in unique), dtype=np.uint64, count=len(unique))
    h = word_hashes[encoded.indices.to_numpy()]
    total = len(h)
    # Fold h[i], ..., h[i+n-1] into position i; a word past the end of i's text counts as 0,
    # so a text shorter than n words folds all of its words into its first position.
    ends = np.repeat(starts + n_words, n_words)
    pos = np.arange(total)
    gram = h.copy()
    with np.errstate(over="ignore"):
        for k in range(1, ngram):
            nxt = np.zeros(total, dtype=np.uint64)
            nxt[: max(total - k, 0)] = h[k:]  # a batch of fewer than n words: nothing to shift in
            nxt[pos + k >= ends] = 0
            gram *= _FOLD
            gram += nxt
    counts = np.where(n_words >= ngram, n_words - ngram + 1, np.minimum(n_words, 1))
    first = np.repeat(starts - (np.cumsum(counts) - counts), counts)  # shingle k of a text sits at k + its start
    gram = gram[first + np.arange(len(first))]
    with np.errstate(over="ignore"):
        gram = _fmix(gram, _FMIX["affine64"])
    return gram, counts


def _min_over_permutations(hashes: np.ndarray, counts: np.ndarray, perms: np.ndarray, scheme: Scheme) -> np.ndarray:
    """Signatures [len(counts), num_perm]: per text, the minimum of each permutation of its shingle hashes."""
    num_perm = perms.shape[1]
    a, b = perms[0][:, None], perms[1][:, None]
    # Transposed [num_perm, shingles] layout: reduceat then runs along contiguous rows,
    # much faster than reducing over axis 0 of [shingles, num_perm].
    out = np.full((num_perm, len(counts)), _MAX_HASH[scheme], dtype=DTYPE[scheme])
    doc_of = np.repeat(np.arange(len(counts)), counts)
    step = max(1, _CHUNK_CELLS // num_perm)
    # Chunks of shingles may split a document; np.minimum into `out` merges the parts.
    with np.errstate(over="ignore"):
        for s0 in range(0, len(hashes), step):
            h = hashes[None, s0 : s0 + step]
            docs = doc_of[s0 : s0 + step]
            phv = a * h
            phv += b  # uint arithmetic wraps mod 2^width: for affine schemes that is the permutation
            if scheme == "legacy":
                # datasketch's uint64 products also wrap mod 2^64 before the prime modulus.
                phv %= _MERSENNE_PRIME
                phv &= _MAX_HASH["legacy"]
            starts = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
            seg_docs = docs[starts]
            out[:, seg_docs] = np.minimum(out[:, seg_docs], np.minimum.reduceat(phv, starts, axis=1))
    return np.ascontiguousarray(out.T)


def unique_shingle_sets(hashes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per text, its distinct 64-bit shingle hashes, sorted (flat, uint64), and how many per
    text: the sets whose Jaccard exact verification computes. 64 bits, not the signatures'
    32: among a million one-shingle texts 32-bit hashes collide about a hundred times
    (n^2 / 2^33), and a collision of one-shingle sets reads as Jaccard 1.0."""
    hashes = hashes.astype(np.uint64, copy=False)
    text = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    order = np.lexsort((hashes, text))  # by text, then hash: each text keeps its rows
    keys, text = hashes[order], text[order]
    first = np.ones(len(keys), dtype=np.bool_)  # first of its value within its text
    np.logical_or(keys[1:] != keys[:-1], text[1:] != text[:-1], out=first[1:])
    cum = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(first, out=cum[1:])
    ends = np.cumsum(counts)
    unique_counts = cum[ends] - cum[ends - counts]
    return keys[first], unique_counts


def distinct_sets(hashes: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """unique_shingle_sets' (flat, counts), sorted by one uint64 key instead of a two-key lexsort
    (far less CPU; verify="estimate" sorts every shingle), and each text's set digest: the
    wrapping sum of a 64-bit mix of its distinct hashes (equal sets, equal digests; different
    sets collide with chance ~2^-64)."""
    hashes = hashes.astype(np.uint64, copy=False)
    bits = max(1, (len(counts) - 1).bit_length())
    text = np.repeat(np.arange(len(counts), dtype=np.uint64), counts)
    # The text in the top bits, the hash's top 64 - bits below: sorted by text, then by hash, unless two
    # hashes of a text share those bits (chance ~k^2 / 2^(65 - bits) for k shingles), then sorted exactly.
    key = (text << np.uint64(64 - bits)) | (hashes >> np.uint64(bits))
    order = np.argsort(key, kind="stable")
    key, h = key[order], hashes[order]
    if np.any((key[1:] == key[:-1]) & (h[1:] != h[:-1])):
        h = hashes[np.lexsort((hashes, text))]
    first = np.ones(len(h), dtype=np.bool_)  # first of its value within its text (sorting keeps each text's rows)
    np.logical_or(h[1:] != h[:-1], text[1:] != text[:-1], out=first[1:])
    cum = np.zeros(len(h) + 1, dtype=np.int64)
    np.cumsum(first, out=cum[1:])
    ends = np.cumsum(counts)
    distinct = cum[ends] - cum[ends - counts]
    flat = h[first]
    with np.errstate(over="ignore"):
        mixed = np.zeros(len(flat) + 1, dtype=np.uint64)
        np.cumsum(_fmix(flat, _FMIX["affine64"]), out=mixed[1:])
        set_ends = np.cumsum(distinct)
        digests = mixed[set_ends] - mixed[set_ends - distinct]
    return flat, distinct, digests


def short_set_summaries(flat: np.ndarray, distinct: np.ndarray, digests: np.ndarray, short: int) -> tuple:
    """What verify="estimate" keeps of distinct_sets: the sets of texts of at most `short` distinct
    shingles (flat) with their sizes (0 for longer texts: no set kept), every text's size and digest."""
    keep = distinct <= short
    return flat[np.repeat(keep, distinct)], np.where(keep, distinct, 0), distinct, digests


def _extra(wide: np.ndarray, counts: np.ndarray, sets: bool, short: int | None) -> tuple | None:
    """The signature job's fourth result for the shingle hashes `wide` (see signature_job)."""
    if sets:
        return unique_shingle_sets(wide, counts)
    if short is not None:
        return short_set_summaries(*distinct_sets(wide, counts), short)
    return None


def signature_job(
    texts: Sequence[str] | pa.Array, ngram: int, perms: np.ndarray, scheme: Scheme, seed: int, sets: bool = False,
    short: int | None = None,
) -> tuple[np.ndarray, np.ndarray, float, tuple | None]:
    """Signatures [len(texts), num_perm] of one batch, shingles per text, the CPU seconds it took,
    and with `sets` each text's distinct shingle hashes (unique_shingle_sets: flat, counts), or with
    `short` short_set_summaries (flat, set sizes, distinct counts, digests), else None.

    Works through the batch SUB_BATCH_BYTES of text at a time: the word and shingle arrays
    cost ~25 bytes of memory per byte of text, so a job's memory is bounded by that, not
    by how long the batch's documents happen to be."""
    start = time.process_time()
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    parts = [_signature_part(texts[i:j], ngram, perms, scheme, seed, sets, short)
             for i, j in text_byte_slices(texts, SUB_BATCH_BYTES)]
    sigs = np.concatenate([p[0] for p in parts]) if parts else np.empty((0, perms.shape[1]), dtype=DTYPE[scheme])
    counts = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, dtype=np.int64)
    extra = _extra(np.empty(0, dtype=np.uint64), counts, sets, short) if not parts else parts[0][2]
    if extra is not None and len(parts) > 1:
        extra = tuple(np.concatenate([p[2][k] for p in parts]) for k in range(len(extra)))
    return sigs, counts, time.process_time() - start, extra


def _signature_part(
    texts: Sequence[str] | pa.Array, ngram: int, perms: np.ndarray, scheme: Scheme, seed: int, sets: bool,
    short: int | None,
) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    if scheme == "xxh3":
        if not isinstance(texts, pa.Array):
            texts = pa.array(texts, pa.string())
        wide, counts = _xxh3_shingle_hashes64(texts, ngram, seed)
        if sets or short is not None:
            if sets:
                flat, distinct = unique_shingle_sets(wide, counts)
            else:
                flat, distinct, digests = distinct_sets(wide, counts)
            # The minimum over a set is the minimum over its multiset: permute each distinct shingle
            # once (same signatures: the upper halves of distinct 64-bit hashes, repeats allowed).
            uppers = (flat >> np.uint64(32)).astype(np.uint32)
            extra = (flat, distinct) if sets else short_set_summaries(flat, distinct, digests, short)
            return _min_over_permutations(uppers, distinct, perms, scheme), counts, extra
        hashes = (wide >> np.uint64(32)).astype(np.uint32)
    else:
        if isinstance(texts, pa.Array):
            texts = texts.to_pylist()
        hashes, counts, wide = _sha1_shingle_hashes(texts, ngram, scheme)
    return _min_over_permutations(hashes, counts, perms, scheme), counts, _extra(wide, counts, sets, short)
