"""Evaluation items found in training text: an index of word n-grams over each item's question and gold answer.

An item is its question and gold answer joined (the wrong choices of a multiple-choice item are left out: they are
often ordinary sentences). Text is normalised for case, punctuation and whitespace: a word is a run of letters or
digits, and an arithmetic sign (+ - * =) standing between spaces or digits is a word of its own, so `12 + 7`
and `12 - 7` differ while `well-known` reads as `well known` and a `=====` rule as nothing. Numbers become `0` only
where the task allows it: a task whose items collapse onto each other when their numbers are normalised (the
arithmetic questions, a template filled with other numbers) keeps its digits, a document is then read both ways,
and only the n-grams that hold two of an item's numbers (or all, where it has fewer) are its keys: an n-gram of
the template's words around one number would match the same template filled with other numbers.

An item of `n` words or more is indexed by its word n-grams; a shorter one is matched whole. A document's n-grams
(and its m-grams, for each length m of a short item) are hashed the same way (64-bit xxh3 per word, combined as a
polynomial) and looked up in sorted arrays. An n-gram found in more than `common_docs` documents is ignored as common
(licence boilerplate, famous quotations): `DocumentMatches` keeps what each document hit so the second pass can leave
those out without reading the corpus's text twice for documents that hit nothing.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import xxhash

TOKEN = re.compile(r"[^\W_]+|(?<=[\s\d])[-+*=](?=[\s\d])")
DIGITS = re.compile(r"[0-9]+")
_PRIME = np.uint64(0x100000001B3)  # FNV's 64-bit prime: the n-gram hash is a polynomial in the word hashes
COLLAPSE_SHARE = 0.9  # items that keep fewer than this share distinct once numbers are normalised keep their digits


def words(text: str, keep_numbers: bool) -> tuple[list[str], list[tuple[int, int]]]:
    """The normalised words of `text` and each one's character span in it."""
    out, spans = [], []
    for m in TOKEN.finditer(text):
        w = m.group().lower()
        out.append(w if keep_numbers else DIGITS.sub("0", w))
        spans.append(m.span())
    return out, spans


def word_hashes(ws: Sequence[str]) -> np.ndarray:
    return np.fromiter((xxhash.xxh3_64_intdigest(w) for w in ws), dtype=np.uint64, count=len(ws))


def gram_hashes(h: np.ndarray, n: int) -> np.ndarray:
    """The hash of every run of `n` consecutive words (none when there are fewer), salted by `n`."""
    count = len(h) - n + 1
    if count <= 0:
        return np.empty(0, np.uint64)
    g = h[:count].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):
            g = g * _PRIME + h[j:j + count]
    return g ^ np.uint64(n)


def holds_numbers(ws: Sequence[str], n: int) -> np.ndarray:
    """Which n-grams of `ws` hold at least two of its numbers (all of them, where it has fewer than two)."""
    is_number = np.fromiter((w.isdigit() for w in ws), dtype=np.int64, count=len(ws))
    need = min(2, int(is_number.sum()))
    within = np.convolve(is_number, np.ones(n, np.int64), mode="valid")  # numbers in each window of n words
    return within >= need


def keeps_numbers(items: Sequence[str]) -> bool:
    """Whether normalising numbers would merge `items` that differ (a task whose items differ only in their numbers)."""
    raw = {" ".join(words(t, True)[0]) for t in items}
    normalised = {" ".join(words(t, False)[0]) for t in items}
    return len(raw) > 1 and len(normalised) < COLLAPSE_SHARE * len(raw)


@dataclass(frozen=True)
class TaskItems:
    """One evaluation task's items, each its question and gold answer joined."""

    name: str
    items: list[str]
    keep_numbers: bool | None = None  # None: decided from the items (`keeps_numbers`)

    def resolved(self) -> "TaskItems":
        if self.keep_numbers is not None:
            return self
        return TaskItems(self.name, self.items, keeps_numbers(self.items))


@dataclass
class _Table:
    """The index's keys of one (numbers mode, gram length): sorted unique hashes, their ids from `base`."""

    hashes: np.ndarray
    base: int


@dataclass
class Hit:
    key: int  # the index key (one n-gram of one or more items)
    start: int  # first word
    length: int  # words
    keep_numbers: bool  # which reading of the document


class ContaminationIndex:
    """Every item's n-grams (or the whole item, when shorter than `n` words), each key owned by the items it came from."""

    def __init__(self, tasks: Sequence[TaskItems], n: int = 13) -> None:
        if n < 1:
            raise ValueError(f"n={n}: an n-gram needs at least one word")
        self.n = n
        self.tasks = [t.resolved() for t in tasks]
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must differ: {names}")
        entries: dict[tuple[bool, int], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.item_task: list[int] = []  # global item id -> task index
        self.item_words: list[int] = []
        for ti, task in enumerate(self.tasks):
            for text in task.items:
                item = len(self.item_task)
                self.item_task.append(ti)
                ws = words(text, task.keep_numbers)[0]
                self.item_words.append(len(ws))
                if not ws:
                    continue
                length = min(n, len(ws))
                grams = gram_hashes(word_hashes(ws), length)
                if task.keep_numbers:
                    grams = grams[holds_numbers(ws, length)]
                    if not len(grams):  # its numbers lie further apart than n words: the item whole
                        length, grams = len(ws), gram_hashes(word_hashes(ws), len(ws))
                grams = np.unique(grams)
                hashes, owners = entries.setdefault((bool(task.keep_numbers), length), ([], []))
                hashes.append(grams)
                owners.append(np.full(len(grams), item, np.int64))
        self.tables: dict[tuple[bool, int], _Table] = {}
        owner_keys, owner_items, base = [], [], 0
        for mode_length in sorted(entries):
            hashes, owners = (np.concatenate(a) for a in entries[mode_length])
            unique, inverse = np.unique(hashes, return_inverse=True)
            self.tables[mode_length] = _Table(unique, base)
            owner_keys.append(inverse + base)
            owner_items.append(owners)
            base += len(unique)
        self.n_keys = base
        keys = np.concatenate(owner_keys) if owner_keys else np.empty(0, np.int64)
        items = np.concatenate(owner_items) if owner_items else np.empty(0, np.int64)
        order = np.lexsort((items, keys))
        self._owner_keys, self._owner_items = keys[order], items[order]
        self.key_task = np.full(self.n_keys, -1, np.int64)  # a key's task (the first, when tasks share it)
        self.key_task[self._owner_keys[::-1]] = np.asarray(self.item_task, np.int64)[self._owner_items[::-1]]
        self.modes = sorted({mode for mode, _ in self.tables})

    def items_of(self, keys: np.ndarray) -> np.ndarray:
        """The items that own any of `keys`."""
        keys = np.asarray(keys, np.int64)
        lo = np.searchsorted(self._owner_keys, keys, "left")
        hi = np.searchsorted(self._owner_keys, keys, "right")
        return np.unique(np.concatenate([self._owner_items[a:b] for a, b in zip(lo, hi)] or [np.empty(0, np.int64)]))

    def task_keys(self, task: int) -> np.ndarray:
        """The keys an item of task `task` owns."""
        mine = np.asarray(self.item_task, np.int64)[self._owner_items] == task
        return np.unique(self._owner_keys[mine])

    def hits(self, text: str) -> list[Hit]:
        """Every place `text` holds a key of the index."""
        out: list[Hit] = []
        for mode in self.modes:
            h = word_hashes(words(text, mode)[0])
            for (m, length), table in self.tables.items():
                if m != mode or len(h) < length:
                    continue
                g = gram_hashes(h, length)
                pos = np.searchsorted(table.hashes, g)
                pos[pos == len(table.hashes)] = 0
                for start in np.flatnonzero(table.hashes[pos] == g):
                    out.append(Hit(int(table.base + pos[start]), int(start), length, mode))
        return out


@dataclass
class DocumentMatches:
    """Pass one over a corpus: the keys each document hit, and in how many documents each key occurs."""

    index: ContaminationIndex
    doc_keys: dict[int, np.ndarray] = field(default_factory=dict)  # document number -> the keys it holds
    doc_frequency: np.ndarray | None = None
    seen: int = 0

    def __post_init__(self) -> None:
        self.doc_frequency = np.zeros(self.index.n_keys, np.int64)

    def add(self, texts: Iterable[str]) -> None:
        for text in texts:
            hits = self.index.hits(text)
            if hits:
                keys = np.unique([h.key for h in hits])
                self.doc_keys[self.seen] = keys
                self.doc_frequency[keys] += 1
            self.seen += 1

    def common(self, common_docs: int) -> np.ndarray:
        """Whether each key occurs in more than `common_docs` documents."""
        return self.doc_frequency > common_docs


@dataclass
class Verdict:
    """What to do with one document: keep it as it is, cut spans out of it, or drop it, for the task it matched."""

    task: str | None = None  # None: clean
    spans: list[tuple[int, int]] = field(default_factory=list)  # merged character spans to cut
    drop: bool = False
    detail: str = ""


def judge(index: ContaminationIndex, text: str, common: np.ndarray, action: str, window: int,
          max_cuts: int, min_chars_left: int) -> Verdict:
    """The verdict on `text` given the keys that are common: `drop` it for its task (the one most of its uncommon
    keys belong to), or `cut` each match plus `window` characters either side, dropping it when that takes more
    than `max_cuts` spans or leaves fewer than `min_chars_left` characters."""
    hits = [h for h in index.hits(text) if not common[h.key]]
    if not hits:
        return Verdict()
    tasks = index.key_task[[h.key for h in hits]]
    counts = np.bincount(tasks, minlength=len(index.tasks))
    task = index.tasks[int(np.argmax(counts))].name  # argmax: the lowest index among ties, so stable
    spans_by_mode = {mode: words(text, mode)[1] for mode in {h.keep_numbers for h in hits}}
    spans = []
    for h in hits:
        ws = spans_by_mode[h.keep_numbers]
        spans.append((max(0, ws[h.start][0] - window), min(len(text), ws[h.start + h.length - 1][1] + window)))
    merged = merge_spans(spans)
    first = min(hits, key=lambda h: h.start)
    detail = " ".join(words(text, first.keep_numbers)[0][first.start:first.start + first.length])
    if action == "drop" or len(merged) > max_cuts:
        return Verdict(task, merged, True, detail)
    left = cut(text, merged)
    return Verdict(task, merged, len(left) < min_chars_left or not TOKEN.search(left), detail)


def merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def cut(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """`text` without `spans` (merged, sorted), the pieces left joined by a blank line."""
    pieces, at = [], 0
    for a, b in spans:
        pieces.append(text[at:a])
        at = b
    pieces.append(text[at:])
    return "\n\n".join(p.strip("\n") for p in pieces if p.strip())
