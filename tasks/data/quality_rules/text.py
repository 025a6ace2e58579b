"""One document's text as the units quality rules measure: lines, paragraphs, words, word n-grams.

A `TextView` computes each unit on first use, once for all the rules that need it. Inside a batch
(tasks/data/quality_rules/batch.py) its words and n-gram counts come from the batch's arrays, computed
for every document at once (`NgramCounts`); a view built alone computes them itself, with the same result.
"""
from __future__ import annotations

import re
import string
from collections.abc import Iterable
from functools import cached_property
from typing import Protocol

import numpy as np


class WordBatch(Protocol):
    """What a view and the n-gram counts read of the batch they belong to (tasks/data/quality_rules/batch.py)."""

    offsets: np.ndarray  # offsets[i]: document i's first word in the flattened batch
    word_ids: np.ndarray
    word_lengths: np.ndarray
    word_positions: np.ndarray
    doc_of_word: np.ndarray
    doc_end_of_word: np.ndarray
    doc_salt: np.ndarray
    word_len_cumsum: np.ndarray

    def __len__(self) -> int: ...

    def ngram_keys(self, n: int) -> np.ndarray: ...

    def ngrams(self, n: int, index: int) -> NgramCounts: ...


PUNCTUATION = frozenset(string.punctuation + "«»„“”‘’…–—•·¡¿")
PUNCT_CHARS = "".join(sorted(PUNCTUATION))
# A paragraph break is a blank line, also when the blank line holds spaces.
PARAGRAPH_SPLIT = re.compile(r"\r?\n[ \t\r\f\v]*\n\s*")
LETTER = re.compile(r"[^\W\d_]")  # any Unicode letter
# 64-bit mixing constants of the n-gram hash (golden ratio; FNV prime).
MIX = np.uint64(0x9E3779B97F4A7C15)
STEP = np.uint64(0x100000001B3)


class TextView:
    """One document split into the units the rules measure, each computed on first use.

    A `Batch` fills `words`/`word_ids` from its batch-wide split; a view built alone
    (`TextView(text)`) computes them itself, with the same result.
    """

    def __init__(self, text: str, batch: WordBatch | None = None, index: int = 0):
        self.text = text
        self._batch, self._index = batch, index
        self._keys: dict[int, np.ndarray] = {}
        self._uniq: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.memo: dict[tuple, object] = {}  # measures that several rules of one family share

    @cached_property
    def lines(self) -> list[str]:
        """Lines that hold something other than whitespace ("\\r\\n" is one line end, so no line keeps a "\\r")."""
        # Same lines as splitting on runs of "\r?\n"; str.split is much faster than re.split.
        return [ln for ln in self.text.replace("\r\n", "\n").split("\n") if ln.strip()]

    @cached_property
    def all_lines(self) -> list[str]:
        """Every line, blank ones included (line-length statistics of code count them)."""
        return self.text.splitlines()

    @cached_property
    def paragraphs(self) -> list[str]:
        stripped = self.text.strip()
        if not stripped:
            return []
        if stripped.count("\n") < 2:  # a paragraph break needs two line ends: skip the regex
            return [stripped]
        # A break is a line end, then only [ \t\r\f\v], then a line end: without a line end
        # followed by one of those (or by "\n"), the regex cannot match; `in` runs at C speed.
        if not ("\n\n" in stripped or "\n " in stripped or "\n\t" in stripped or "\n\r" in stripped
                or "\n\f" in stripped or "\n\v" in stripped):
            return [stripped]
        return PARAGRAPH_SPLIT.split(stripped)

    @cached_property
    def line_duplicates(self) -> tuple[int, int]:
        """find_duplicates(lines), shared by the Gopher and FineWeb line rules."""
        return find_duplicates(self.lines)

    @cached_property
    def paragraph_duplicates(self) -> tuple[int, int]:
        return find_duplicates(self.paragraphs)

    @cached_property
    def words(self) -> list[str]:
        """Whitespace-separated tokens, as in the Gopher paper."""
        return self.text.split()

    @cached_property
    def content_words(self) -> list[str]:
        """Tokens with at least one non-punctuation character, stripped of edge punctuation."""
        return [c for c in (w.strip(PUNCT_CHARS) for w in self.words) if c]

    @cached_property
    def word_ids(self) -> np.ndarray:
        """Each word as an integer id (equal words, equal ids), for fast n-gram counting."""
        if self._batch is not None:
            a, b = self._batch.offsets[self._index : self._index + 2]
            return self._batch.word_ids[a:b]
        vocab: dict[str, int] = {}
        return np.fromiter((vocab.setdefault(w, len(vocab)) for w in self.words), dtype=np.int64, count=len(self.words))

    @cached_property
    def word_len_cumsum(self) -> np.ndarray:
        """cumsum[i] = characters in words[:i], so an n-gram's length is a difference."""
        if self._batch is not None:
            a, b = self._batch.offsets[self._index : self._index + 2]
            return np.concatenate(([0], np.cumsum(self._batch.word_lengths[a:b])))
        return np.concatenate(([0], np.cumsum(np.fromiter(map(len, self.words), dtype=np.int64, count=len(self.words)))))

    def ngram_keys(self, n: int) -> np.ndarray:
        """For each n-gram position, a 64-bit key equal for positions holding the same n words.

        A polynomial hash of the word ids (mod 2**64): two different n-grams of a document
        share a key with probability ~1e-19, and hashing in numpy keeps the sort 1-D. The
        keys of n words extend those of n - 1 words, so all nine Gopher sizes cost nine
        vector operations together.
        """
        if n in self._keys:
            return self._keys[n]
        ids = self.word_ids
        m = len(ids) - n + 1
        if m <= 0:
            keys = np.empty(0, dtype=np.uint64)
        elif n == 1:
            keys = (ids.astype(np.uint64) + np.uint64(1)) * MIX
        else:
            keys = self.ngram_keys(n - 1)[:m] * STEP + self.ngram_keys(1)[n - 1 :]
        self._keys[n] = keys
        return keys

    def ngram_chars(self, n: int) -> np.ndarray:
        """Characters of each n-gram written with single spaces."""
        c = self.word_len_cumsum
        return c[n:] - c[:-n] + (n - 1)

    def _unique(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(first position, count) of each distinct n-gram: one sort per size, shared by all rules."""
        if n not in self._uniq:
            _, first, counts = np.unique(self.ngram_keys(n), return_index=True, return_counts=True)
            self._uniq[n] = (first, counts)
        return self._uniq[n]

    @cached_property
    def _ngram_repeats(self) -> int:
        """The largest n (2..10) whose n-grams repeat at all, found from n = 2 up; 0 if none.

        A repeated n-gram holds a repeated (n-1)-gram, so once a size has no repeat no larger
        size has one, and the rules of the larger sizes are decided without a sort.
        """
        largest = 0
        for n in range(2, 11):
            keys = self.ngram_keys(n)
            if len(keys) == 0 or len(self._unique(n)[0]) == len(keys):
                break
            largest = n
        return largest

    def top_ngram_chars(self, n: int) -> int:
        """Characters covered by the most frequent n-gram (0 unless it occurs at least twice)."""
        if self._batch is not None:
            return int(self._batch.ngrams(n, self._index).top_chars[self._index])
        if n > self._ngram_repeats:
            return 0
        first, counts = self._unique(n)
        top = int(counts.max())
        # Among equally frequent n-grams take the one seen first, as Counter.most_common does.
        position = int(first[counts == top].min())
        return int(self.ngram_chars(n)[position]) * top

    def duplicated_ngram_chars(self, n: int) -> int:
        """Characters in n-grams that repeat an earlier n-gram, without counting a word twice.

        After a repeat the scan jumps past it, so overlapping repeats are not double counted
        (as in Gopher and datatrove's `find_all_duplicate`).
        """
        if self._batch is not None:
            grams = self._batch.ngrams(n, self._index)
            if not grams.repeats[self._index]:
                return 0
            a = self._batch.offsets[self._index]
            m = len(self.word_ids) - n + 1
            keys, later = grams.keys[a : a + m], grams.later[a : a + m]
        else:
            if n > self._ngram_repeats:
                return 0
            keys = self.ngram_keys(n)
            later = np.ones(len(keys), dtype=bool)
            later[self._unique(n)[0]] = False
        # Only positions holding an n-gram seen before can be repeats; the positions in
        # between are first occurrences, added to `seen` in bulk.
        chars = self.ngram_chars(n)
        ids = keys.tolist()
        seen: set[int] = set()
        repeated = i = 0
        for c in np.flatnonzero(later).tolist():
            if c < i:  # inside the span of a counted repeat
                continue
            seen.update(ids[i:c])
            if ids[c] in seen:
                repeated += int(chars[c])
                i = c + n
            else:  # its earlier occurrences were all inside counted repeats
                seen.add(ids[c])
                i = c + 1
        return repeated

    @cached_property
    def lower(self) -> str:
        return self.text.lower()

    @cached_property
    def lower_lines(self) -> list[str]:
        return [ln.lower() for ln in self.lines]


class NgramCounts:
    """Word n-grams of one size over a whole batch: one sort for every document and rule.

    keys[j] is the key of the n-gram starting at word j of the flattened batch (positions
    whose n-gram would cross into the next document hold a key nothing else uses, and no
    rule reads them); later[j] is True where that n-gram occurred earlier in its document.
    """

    def __init__(self, batch: WordBatch, n: int, docs: np.ndarray, covered: np.ndarray,
                 candidates: np.ndarray | None = None):
        """Count the n-grams of documents `docs`; `covered` marks those whose counts are known
        (`docs`, and documents known to repeat no n-gram: they keep zeros). `candidates`: the
        positions whose (n-1)-gram repeats (`in_repeat` of size n-1); an n-gram elsewhere
        cannot repeat, so only these are sorted."""
        n_docs = len(batch)
        total = len(batch.word_ids)
        self.covered = covered
        self.top_chars = np.zeros(n_docs, dtype=np.int64)
        self.repeats = np.zeros(n_docs, dtype=bool)
        keys = batch.ngram_keys(n)
        doc = batch.doc_of_word
        selected = np.zeros(n_docs, dtype=bool)
        selected[docs] = True
        mask = (batch.word_positions + n <= batch.doc_end_of_word) & selected[doc]
        if candidates is not None:
            mask &= candidates
        pos = np.flatnonzero(mask)
        self.keys = keys
        self.later = np.zeros(total, dtype=bool)
        self.in_repeat = np.zeros(total, dtype=bool)  # positions whose n-gram occurs more than once
        if len(pos) == 0:
            return
        # Equal n-grams of different documents must not meet: fold the document into the key.
        folded = keys[pos] + batch.doc_salt[pos]
        order = np.argsort(folded)
        sorted_keys = folded[order]
        starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
        counts = np.diff(np.append(starts, len(pos)))
        first = np.minimum.reduceat(pos[order], starts)  # each group's earliest position
        self.later[pos] = True
        self.later[first] = False
        group_doc = doc[first]
        repeated = counts > 1
        self.in_repeat[pos[order]] = np.repeat(repeated, counts)
        self.repeats[group_doc[repeated]] = True
        # The most frequent n-gram of each document; among equal counts the earliest, as
        # Counter.most_common picks.
        g = np.flatnonzero(repeated)
        if len(g):
            best = g[np.lexsort((first[g], -counts[g], group_doc[g]))]
            head = np.concatenate(([True], group_doc[best][1:] != group_doc[best][:-1]))
            best = best[head]
            c = batch.word_len_cumsum
            start = first[best]
            chars = c[start + n] - c[start] + (n - 1)
            self.top_chars[group_doc[best]] = chars * counts[best]


def find_duplicates(items: Iterable[str]) -> tuple[int, int]:
    """(number of items seen before, their total characters): every repeat after the first counts."""
    seen: set[str] = set()
    dup_items = dup_chars = 0
    for item in items:
        if item in seen:
            dup_items += 1
            dup_chars += len(item)
        else:
            seen.add(item)
    return dup_items, dup_chars
