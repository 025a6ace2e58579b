"""What a quality rule is, and the measurements that several rules share.

A rule is a small class with a `name`, typed `Params` (defaults from the paper or the
reference implementation it comes from) and `check(text) -> None | detail`. The filter
builds one `TextView` per document so that lines, words and paragraphs are split once,
not once per rule.
"""
from __future__ import annotations

import re
import string
from collections.abc import Iterable
from functools import cached_property
from typing import ClassVar, Generic, TypeVar

import numpy as np

from infra.config import StrictModel

P = TypeVar("P", bound=StrictModel)

PUNCTUATION = frozenset(string.punctuation + "«»„“”‘’…–—•·¡¿")
_PUNCT_CHARS = "".join(sorted(PUNCTUATION))
_LINE_SPLIT = re.compile(r"(?:\r?\n)+")  # Windows line ends too, so no line keeps a "\r"
# A paragraph break is a blank line, also when the blank line holds spaces.
_PARAGRAPH_SPLIT = re.compile(r"\r?\n[ \t\r\f\v]*\n\s*")


class TextView:
    """One document split into the units the rules measure, each computed on first use."""

    def __init__(self, text: str):
        self.text = text

    @cached_property
    def lines(self) -> list[str]:
        """Lines that hold something other than whitespace."""
        return [ln for ln in _LINE_SPLIT.split(self.text) if ln.strip()]

    @cached_property
    def all_lines(self) -> list[str]:
        """Every line, blank ones included (line-length statistics of code count them)."""
        return self.text.splitlines()

    @cached_property
    def paragraphs(self) -> list[str]:
        stripped = self.text.strip()
        return _PARAGRAPH_SPLIT.split(stripped) if stripped else []

    @cached_property
    def words(self) -> list[str]:
        """Whitespace-separated tokens, as in the Gopher paper."""
        return self.text.split()

    @cached_property
    def content_words(self) -> list[str]:
        """Tokens with at least one non-punctuation character, stripped of edge punctuation."""
        out = []
        for w in self.words:
            core = w.strip(_PUNCT_CHARS)
            if core:
                out.append(core)
        return out

    @cached_property
    def word_ids(self) -> np.ndarray:
        """Each word as an integer id (equal words, equal ids), for fast n-gram counting."""
        vocab: dict[str, int] = {}
        return np.fromiter((vocab.setdefault(w, len(vocab)) for w in self.words), dtype=np.int64, count=len(self.words))

    @cached_property
    def word_len_cumsum(self) -> np.ndarray:
        """cumsum[i] = characters in words[:i], so an n-gram's length is a difference."""
        return np.concatenate(([0], np.cumsum(np.fromiter(map(len, self.words), dtype=np.int64, count=len(self.words)))))

    def ngram_keys(self, n: int) -> np.ndarray:
        """For each n-gram position, a 64-bit key equal for positions holding the same n words.

        A polynomial hash of the word ids (mod 2**64): two different n-grams of a document
        share a key with probability ~1e-19, and hashing in numpy keeps the sort 1-D.
        """
        ids = self.word_ids
        m = len(ids) - n + 1
        if m <= 0:
            return np.empty(0, dtype=np.uint64)
        mixed = (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        keys = np.zeros(m, dtype=np.uint64)
        for k in range(n):
            keys = keys * np.uint64(0x100000001B3) + mixed[k : k + m]
        return keys

    def ngram_chars(self, n: int) -> np.ndarray:
        """Characters of each n-gram written with single spaces."""
        c = self.word_len_cumsum
        return c[n:] - c[:-n] + (n - 1)

    @cached_property
    def lower(self) -> str:
        return self.text.lower()

    @cached_property
    def lower_lines(self) -> list[str]:
        return [ln.lower() for ln in self.lines]


class Rule(Generic[P]):
    """Base of every quality rule: `check` returns None when the document passes, else why not."""

    name: ClassVar[str]
    Params: ClassVar[type[StrictModel]]

    def __init__(self, params: P | None = None):
        self.params: P = params if params is not None else self.Params()  # type: ignore[assignment]

    def check(self, text: str) -> str | None:
        """None when `text` passes this rule, else a short detail with the measured value."""
        return self.check_view(TextView(text))

    def check_view(self, view: TextView) -> str | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


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


def top_ngram_chars(view: TextView, n: int) -> int:
    """Characters covered by the most frequent n-gram (0 unless it occurs at least twice)."""
    keys = view.ngram_keys(n)
    if len(keys) == 0:
        return 0
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    top = int(counts.max())
    if top < 2:
        return 0
    # Among equally frequent n-grams take the one seen first, as Counter.most_common does.
    position = int(first[counts == top].min())
    return int(view.ngram_chars(n)[position]) * top


def duplicated_ngram_chars(view: TextView, n: int) -> int:
    """Characters in n-grams that repeat an earlier n-gram, without counting a word twice.

    After a repeat the scan jumps past it, so overlapping repeats are not double counted
    (as in Gopher and datatrove's `find_all_duplicate`).
    """
    keys = view.ngram_keys(n)
    if len(keys) == 0:
        return 0
    _, first = np.unique(keys, return_index=True)
    if len(first) == len(keys):  # no n-gram repeats: the common case, decided at C speed
        return 0
    # Only positions holding an n-gram seen before can be repeats; the positions in
    # between are first occurrences, added to `seen` in bulk.
    later = np.ones(len(keys), dtype=bool)
    later[first] = False
    chars = view.ngram_chars(n)
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


def fraction(part: float, whole: float) -> float:
    """part / whole, and 0 for an empty whole (an empty document has nothing to be too much of)."""
    return part / whole if whole else 0.0


def over(measure: str, value: float, params: StrictModel, limit: str, fmt: str = "") -> str | None:
    """The detail "measure=value > limit=bound" when `value` exceeds the parameter `limit`, else None."""
    bound = getattr(params, limit)
    return f"{measure}={value:{fmt}} > {limit}={bound}" if value > bound else None


def under(measure: str, value: float, params: StrictModel, limit: str, fmt: str = "") -> str | None:
    """The detail "measure=value < limit=bound" when `value` is below the parameter `limit`, else None."""
    bound = getattr(params, limit)
    return f"{measure}={value:{fmt}} < {limit}={bound}" if value < bound else None
