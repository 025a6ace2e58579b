"""A batch of documents judged together: per-word measures computed for all of them at once.

A `Batch` splits every document into words once, with pyarrow kernels over the whole batch,
so a rule whose measure is a per-word count (`Rule.check_batch`) reads those arrays instead
of looping over words in Python; each document's `TextView` (tasks/data/quality_rules/text.py)
is made when a rule first asks for it.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.data.quality_rules.text import LETTER, MIX, PUNCT_CHARS, STEP, NgramCounts, TextView


class Batch:
    """Documents judged together: their views, and per-word measures computed for all at once.

    Words come from pyarrow's `utf8_split_whitespace`, which splits exactly where `str.split()`
    does (checked for every code point in tests/unit/data/test_quality_batch.py). Where a
    measure depends on Unicode tables (letters, lower case), ASCII words are judged by
    pyarrow and the rest by Python, so no verdict depends on which Unicode version each uses.
    """

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)
        self.views: dict[int, TextView] = {}  # made when a rule first asks for a document's view
        self._stop_cache: dict[frozenset[str], np.ndarray] = {}
        self._ngrams: dict[int, NgramCounts] = {}
        self._keys: dict[int, np.ndarray] = {}
        self.memo: dict[tuple, object] = {}  # batch-wide measures a rule module computes for its rules

    def __len__(self) -> int:
        return len(self.texts)

    def release(self) -> None:
        """Drop the views: each refers back to this batch, and a cycle of numpy arrays waits
        for the garbage collector's rare full pass (memory grew with the corpus without this)."""
        for view in self.views.values():
            view._batch = None
        self.views = {}

    @cached_property
    def _split(self) -> pa.LargeListArray:
        lists = pc.utf8_split_whitespace(pa.array(self.texts, type=pa.large_string()))
        flat = lists.flatten()
        # Leading or trailing whitespace gives empty "words" (runs inside a text do not):
        # drop them, so each document holds exactly str.split()'s words.
        nonempty = pc.greater(pc.binary_length(flat), 0)
        if pc.all(nonempty).as_py() is not False:
            return lists
        cum = np.zeros(len(flat) + 1, dtype=np.int64)
        np.cumsum(nonempty.to_numpy(zero_copy_only=False), out=cum[1:])
        offsets = cum[np.asarray(lists.offsets, dtype=np.int64)]
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), flat.filter(nonempty))

    @cached_property
    def words(self) -> pa.Array:
        """Every word of the batch, document after document."""
        return self._split.flatten()

    @cached_property
    def offsets(self) -> np.ndarray:
        """Words of document i are words[offsets[i]:offsets[i + 1]]."""
        return np.asarray(self._split.offsets, dtype=np.int64)

    @cached_property
    def word_counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @cached_property
    def doc_of_word(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.texts), dtype=np.int64), self.word_counts)

    def per_doc(self, mask_or_weights: np.ndarray) -> np.ndarray:
        """Sum over each document's words (a bool mask counts, integer weights add up)."""
        return np.bincount(self.doc_of_word, weights=mask_or_weights, minlength=len(self.texts)).astype(np.int64)

    @cached_property
    def _ascii(self) -> np.ndarray:
        return pc.string_is_ascii(self.words).to_numpy(zero_copy_only=False)

    @cached_property
    def _trimmed(self) -> pa.Array:
        return pc.utf8_trim(self.words, characters=PUNCT_CHARS)

    @cached_property
    def content_lengths(self) -> np.ndarray:
        """Characters of each word once stripped of edge punctuation (0: not a content word)."""
        return pc.utf8_length(self._trimmed).to_numpy(zero_copy_only=False).astype(np.int64)

    @cached_property
    def content_words(self) -> np.ndarray:
        """Content words per document (TextView.content_words' lengths)."""
        return self.per_doc(self.content_lengths > 0)

    @cached_property
    def content_chars(self) -> np.ndarray:
        """Characters of each document's content words."""
        return self.per_doc(self.content_lengths)

    @cached_property
    def alpha_words(self) -> np.ndarray:
        """Words holding a letter, per document."""
        # An ASCII word holds a letter iff its lower and upper case differ (two kernels, no regex).
        has = pc.not_equal(pc.ascii_lower(self.words), pc.ascii_upper(self.words)).to_numpy(zero_copy_only=False)
        other = np.flatnonzero(~self._ascii)
        if len(other):
            has = has.copy()
            has[other] = [LETTER.search(w) is not None for w in self.words.take(pa.array(other)).to_pylist()]
        return self.per_doc(has)

    def distinct_stop_words(self, stop_words: frozenset[str]) -> np.ndarray:
        """How many different `stop_words` (lower case) each document's content words hold."""
        if stop_words not in self._stop_cache:
            vocab = sorted(stop_words)
            lowered = pc.ascii_lower(self._trimmed)
            index = pc.index_in(lowered, value_set=pa.array(vocab, type=pa.large_string()))
            which = index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            other = np.flatnonzero(~self._ascii)
            if len(other):  # str.lower may map a non-ASCII letter into ASCII (the Kelvin sign to "k")
                position = {w: i for i, w in enumerate(vocab)}
                which[other] = [position.get(w.lower(), -1) for w in self._trimmed.take(pa.array(other)).to_pylist()]
            hit = np.flatnonzero(which >= 0)
            pairs = np.unique(self.doc_of_word[hit] * len(vocab) + which[hit])
            self._stop_cache[stop_words] = np.bincount(pairs // max(len(vocab), 1), minlength=len(self.texts))
        return self._stop_cache[stop_words]

    @cached_property
    def word_ids(self) -> np.ndarray:
        """Each word's id in the batch's dictionary (equal words, equal ids)."""
        return pc.dictionary_encode(self.words).indices.to_numpy(zero_copy_only=False).astype(np.int64)

    def ngrams(self, n: int, todo: Iterable[int] | int) -> NgramCounts:
        """The n-gram counts of size n, covering at least the documents `todo`.

        Computed once per size for the documents a rule asks about, and only for those
        whose (n-1)-grams repeat: a document without a repeated (n-1)-gram has no repeated
        n-gram, so the larger sizes of clean text cost no sort.
        """
        if isinstance(todo, (int, np.integer)):
            known = self._ngrams.get(n)
            if known is not None and known.covered[todo]:
                return known
        todo = np.atleast_1d(np.asarray(todo if not isinstance(todo, range) else list(todo), dtype=np.int64))
        known = self._ngrams.get(n)
        if known is not None and known.covered[todo].all():
            return known
        want = np.zeros(len(self), dtype=bool)
        want[todo] = True
        if known is not None:
            want |= known.covered
        covered = want.copy()
        candidates = None
        if n > 2:
            shorter = self.ngrams(n - 1, np.flatnonzero(want))
            want &= shorter.repeats
            candidates = shorter.in_repeat
        self._ngrams[n] = NgramCounts(self, n, np.flatnonzero(want), covered, candidates)
        return self._ngrams[n]

    def ngram_keys(self, n: int) -> np.ndarray:
        """keys[j]: a 64-bit key of the n words from word j of the flattened batch (as
        TextView.ngram_keys); positions whose n-gram would cross a document's end hold a
        shorter n-gram's key, which no rule reads. Each size extends the one below it."""
        if n not in self._keys:
            if n == 1:
                self._keys[1] = (self.word_ids.astype(np.uint64) + np.uint64(1)) * MIX
            else:
                keys = self.ngram_keys(n - 1).copy()
                total, k = len(keys), n - 1
                if k < total:
                    keys[: total - k] = keys[: total - k] * STEP + self.ngram_keys(1)[k:]
                self._keys[n] = keys
        return self._keys[n]

    @cached_property
    def word_positions(self) -> np.ndarray:
        return np.arange(len(self.word_ids), dtype=np.int64)

    @cached_property
    def doc_end_of_word(self) -> np.ndarray:
        """For each word, the index one past its document's last word."""
        return self.offsets[self.doc_of_word + 1]

    @cached_property
    def doc_salt(self) -> np.ndarray:
        """A per-document constant added to n-gram keys so that equal n-grams of two documents differ."""
        return (self.doc_of_word.astype(np.uint64) + np.uint64(1)) * np.uint64(0xD6E8FEB86659FD93)

    @cached_property
    def word_len_cumsum(self) -> np.ndarray:
        """cumsum[j] = characters of the batch's first j words."""
        return np.concatenate(([0], np.cumsum(self.word_lengths)))

    def view(self, i: int) -> TextView:
        """Document i's view; its word ids and lengths come from the batch's split."""
        view = self.views.get(i)
        if view is None:
            view = self.views[i] = TextView(self.texts[i], self, i)
        return view

    @cached_property
    def word_lengths(self) -> np.ndarray:
        return pc.utf8_length(self.words).to_numpy(zero_copy_only=False).astype(np.int64)
