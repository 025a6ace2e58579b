"""C4 rules (Raffel et al. 2020, section 2.2; TFDS c4_utils; datatrove C4QualityFilter), in two modes.

* `lines` (family `c4_lines`, rule `C4LineFilter`): C4 as published. The page is
  rewritten: lines without terminal punctuation, with fewer than 3 words, with a word over
  1,000 characters, mentioning javascript or a policy phrase are deleted; then the page is
  dropped for lorem ipsum, a curly brace (in a kept line) or fewer than 5 sentences.
* `judge` (family `c4`, the default): the page is never rewritten; each rule removes
  the whole document when too much of it is what C4 would delete.

The default is `judge`, chosen by measurement (bench/quality_crosscheck.py, BENCHMARKS.md
"Quality filters"): on one-paragraph-per-line prose `lines` matches datatrove's
C4QualityFilter (decisions and rewritten text; sentences split as its
English default, spaCy, splits them: its regex fallback splits inside URLs and drops a
line's last sentence without a mark), but the catalog's only prose source, python_docs, is
hard-wrapped reference text, where `lines` deletes most lines of every page (each wrapped
line lacks terminal punctuation) and all code samples; judged per paragraph it keeps
whole topics. A source of extracted web text (one paragraph per line) should set
`c4_mode: lines` in its catalog filters.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from infra.config import StrictModel
from tasks.data.quality_rules.batch import Batch
from tasks.data.quality_rules.rule import Rule, failures, over, under
from tasks.data.quality_rules.text import TextView

TERMINAL_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY_PHRASES = ["terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies"]
# A sentence ends at terminal punctuation, possibly followed by closing quotes or brackets.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s|$)")
# The same in RE2 (pyarrow), which has no lookahead: the whitespace after a mark is consumed,
# which never starts another match. Python's \s (str.isspace) spelled out: RE2's \s is ASCII only.
_SPACE = r"[\t\n\x0b\x0c\r\x1c-\x1f\x{85}\p{Z}]"
_SENTENCE_END_RE2 = r"[.!?][\"')\]]*(?:" + _SPACE + "|$)"
_LINE_END_RE2 = r"[.!?][\"')\]]*" + _SPACE + "*$"


def c4_line_kept(line: str, min_words: int) -> bool:
    """Whether C4 would keep this line: ends in terminal punctuation (not an ellipsis), enough words."""
    line = line.strip()
    return line.endswith(TERMINAL_PUNCTUATION) and not line.endswith("...") and len(line.split()) >= min_words


def c4_kept_units(view: TextView, unit: str, min_words: int) -> list[tuple[str, bool]]:
    """(unit, whether C4 keeps it) for each unit of the view, computed once for both rules that ask."""
    key = ("c4_kept", unit, min_words)
    if key not in view.memo:
        view.memo[key] = [(u, c4_line_kept(u, min_words)) for u in c4_units(view, unit)]
    return view.memo[key]  # type: ignore[return-value]


def c4_line_counts(batch: Batch, min_words: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per document: its lines holding more than whitespace (TextView.lines), how many of
    them C4 keeps (c4_line_kept) and the sentences in those (count_sentences), for all lines
    of the batch in pyarrow kernels."""
    key = ("c4_line_counts", min_words)
    if key not in batch.memo:
        texts = pa.array(batch.texts, pa.large_string())
        lines = pc.split_pattern(pc.replace_substring(texts, "\r\n", "\n"), "\n")
        doc = np.repeat(np.arange(len(batch)), pc.list_value_length(lines).to_numpy(zero_copy_only=False))
        line = pc.utf8_trim_whitespace(lines.flatten())
        nonblank = pc.greater(pc.binary_length(line), 0)
        ends = pc.ends_with(line, TERMINAL_PUNCTUATION[0])
        for mark in TERMINAL_PUNCTUATION[1:]:
            ends = pc.or_(ends, pc.ends_with(line, mark))
        ends = pc.and_(nonblank, pc.and_not(ends, pc.ends_with(line, "...")))
        # Words are counted only on lines that end well, and only up to min_words (max_splits).
        ending = np.flatnonzero(ends.to_numpy(zero_copy_only=False))
        candidates = line.take(pa.array(ending))
        words = pc.list_value_length(pc.utf8_split_whitespace(candidates, max_splits=max(min_words - 1, 0)))
        enough = pc.greater_equal(words, min_words).to_numpy(zero_copy_only=False)
        kept_lines = candidates.filter(pa.array(enough))
        kept_np = np.zeros(len(line), dtype=bool)
        kept_np[ending[enough]] = True
        # count_sentences of each kept line: its sentence ends, plus one unless one ends the line.
        marks = pc.count_substring_regex(kept_lines, _SENTENCE_END_RE2).to_numpy(zero_copy_only=False)
        closed = pc.match_substring_regex(kept_lines, _LINE_END_RE2).to_numpy(zero_copy_only=False)
        sentences = np.zeros(len(line), dtype=np.int64)
        sentences[kept_np] = marks + ~closed
        n = len(batch)
        batch.memo[key] = (
            np.bincount(doc, weights=nonblank.to_numpy(zero_copy_only=False), minlength=n).astype(np.int64),
            np.bincount(doc, weights=kept_np, minlength=n).astype(np.int64),
            np.bincount(doc, weights=sentences, minlength=n).astype(np.int64),
        )
    return batch.memo[key]  # type: ignore[return-value]


def c4_units(view: TextView, unit: str) -> list[str]:
    """C4's units: lines, or for hard-wrapped text, paragraphs unwrapped into one line each."""
    if unit == "line":
        return view.lines
    return [" ".join(p.split()) for p in view.paragraphs]


class C4TerminalPunct(Rule):
    """Too few lines end in terminal punctuation: C4 would delete most of the document.

    C4 assumes one paragraph per line (extracted web text). For hard-wrapped text (plain
    text docs, books) set `unit: paragraph` so a paragraph is judged by its last line.
    The document-level cut-off `min_fraction` is ours, and exists only in `judge` mode:
    there the page is never rewritten, so without a cut-off a page of which C4 would
    delete nearly every line would be kept whole. In `lines` mode (C4LineFilter) the
    lines are deleted instead and there is no such cut-off, as in the paper and datatrove.
    """

    name = "c4_terminal_punct"

    class Params(StrictModel):
        min_fraction: float = Field(default=0.5, ge=0, le=1)
        unit: Literal["line", "paragraph"] = "line"
        min_words: int = Field(default=3, ge=0)  # C4: lines with fewer words are removed

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        if self.params.unit != "line":
            return super().check_batch(batch, todo)
        lines, kept, _ = c4_line_counts(batch, self.params.min_words)  # every line of the batch at once
        return failures(todo, lambda i: self._judge(int(kept[i]) / int(lines[i])) if lines[i] else None)

    def check_view(self, view: TextView) -> str | None:
        units = c4_kept_units(view, self.params.unit, self.params.min_words)
        if not units:
            return None
        return self._judge(sum(1 for _, k in units if k) / len(units))

    def _judge(self, frac: float) -> str | None:
        if frac < self.params.min_fraction:
            return f"terminal_{self.params.unit}s={frac:.3f} < min_fraction={self.params.min_fraction}"
        return None


def count_sentences(line: str) -> int:
    """Sentences of a kept line: one per terminal mark, plus the text after the last one.

    A sentence tokenizer (punkt in the reference C4 code, spaCy in datatrove) returns the
    text after the last sentence end as one more sentence, so a kept line whose last mark
    is a quote the sentence regex does not see holds one: `break_stmt ::= "break"` is 1,
    `It is. Say "no"` is 2. Never 0 for a non-empty line.
    """
    n = end = 0
    for m in _SENTENCE_END.finditer(line):
        n, end = n + 1, m.end()
    return n + (1 if line[end:].strip() else 0)


class C4MinSentences(Rule):
    """Fewer than 5 sentences in the lines C4 would keep (C4 drops such pages)."""

    name = "c4_min_sentences"

    class Params(StrictModel):
        min_sentences: int = Field(default=5, ge=0)
        unit: Literal["line", "paragraph"] = "line"
        min_words: int = Field(default=3, ge=0)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        if self.params.unit != "line":
            return super().check_batch(batch, todo)
        sentences = c4_line_counts(batch, self.params.min_words)[2]
        return failures(todo, lambda i: under("sentences", int(sentences[i]), self.params, "min_sentences"))

    def check_view(self, view: TextView) -> str | None:
        n = 0
        for unit, kept in c4_kept_units(view, self.params.unit, self.params.min_words):
            if kept:
                n += count_sentences(unit.strip())
                if n >= self.params.min_sentences:
                    return None
        return under("sentences", n, self.params, "min_sentences")


class C4LoremIpsum(Rule):
    """Placeholder text: C4 drops any page containing "lorem ipsum"."""

    name = "c4_lorem_ipsum"

    class Params(StrictModel):
        phrase: str = "lorem ipsum"

    def check_view(self, view: TextView) -> str | None:
        if self.params.phrase.lower() in view.lower:
            return f"contains '{self.params.phrase}'"
        return None


class C4Javascript(Rule):
    """Lines mentioning javascript ("please enable JavaScript"): C4 deletes each such line."""

    name = "c4_javascript"

    class Params(StrictModel):
        max_lines: int = Field(default=0, ge=0)

    def check_view(self, view: TextView) -> str | None:
        if "javascript" not in view.lower:
            return None
        n = sum(1 for ln in view.lower_lines if "javascript" in ln)
        return over("javascript_lines", n, self.params, "max_lines")


class C4CurlyBrace(Rule):
    """Curly braces mark code or templates: C4 drops any page containing one."""

    name = "c4_curly_brace"

    class Params(StrictModel):
        max_count: int = Field(default=0, ge=0)

    def check_view(self, view: TextView) -> str | None:
        n = view.text.count("{") + view.text.count("}")
        return over("curly_braces", n, self.params, "max_count")


class C4Policy(Rule):
    """Cookie banners and legal boilerplate: C4 deletes lines with these phrases."""

    name = "c4_policy"

    class Params(StrictModel):
        max_lines: int = Field(default=0, ge=0)
        phrases: list[str] = Field(default_factory=lambda: list(POLICY_PHRASES))

    def check_view(self, view: TextView) -> str | None:
        phrases = [p.lower() for p in self.params.phrases]
        if not any(p in view.lower for p in phrases):
            return None
        n = sum(1 for ln in view.lower_lines if any(p in ln for p in phrases))
        return over("policy_lines", n, self.params, "max_lines")


C4: list[type[Rule]] = [C4TerminalPunct, C4MinSentences, C4LoremIpsum, C4Javascript, C4CurlyBrace, C4Policy]


# ---------------------------------------------------------------- c4_lines: C4 as published

CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
ELLIPSIS = "..."
# Why C4 deletes a line, in the order the reference code tests them; each is a key of
# PageCleaning.chars_removed and of the stage's `chars_removed:c4_lines_<why>:<source>` stats.
LINE_REASONS = ("long_word", "no_terminal_punct", "few_words", "javascript", "policy")


class PageCleaning(StrictModel):
    """What C4LineFilter did to one page: the kept text, or why the page is dropped."""

    text: str | None  # None: the page is dropped
    reason: str | None = None  # c4_lines_<lorem_ipsum|curly_brace|min_sentences> when dropped
    detail: str | None = None
    chars_removed: dict[str, int] = Field(default_factory=dict)  # per LINE_REASONS entry (and "citation")


class C4LineFilter(Rule):
    """C4's page cleaning as published (TFDS c4_utils.clean_page, datatrove C4QualityFilter).

    Each line is stripped; a line is deleted when it has a word over `max_word_length`
    characters, does not end in terminal punctuation (or ends in "..."), has fewer than
    `min_words` words, mentions javascript or holds a policy phrase. Citation marks ("[1]",
    "[edit]") are cut from the lines. The page is dropped when a kept line holds "lorem
    ipsum" or a curly brace, or the kept lines hold fewer than `min_sentences` sentences;
    otherwise the kept lines, joined by newlines, are the page's new text.
    """

    name = "c4_lines"

    class Params(StrictModel):
        min_words: int = Field(default=3, ge=0)
        max_word_length: int = Field(default=1000, ge=1)
        min_sentences: int = Field(default=5, ge=0)
        remove_citations: bool = True
        lorem_ipsum: bool = True
        curly_brace: bool = True
        javascript: bool = True
        policy_phrases: list[str] = Field(default_factory=lambda: list(POLICY_PHRASES))

    def clean(self, text: str) -> PageCleaning:
        """The page C4 would keep from `text`, with the characters each line rule deleted."""
        p = self.params
        phrases = [ph.lower() for ph in p.policy_phrases]
        removed = dict.fromkeys(LINE_REASONS, 0)
        kept: list[str] = []
        sentences = 0
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            words = line.split()
            if any(len(w) > p.max_word_length for w in words):
                removed["long_word"] += len(line)
                continue
            if p.remove_citations and "[" in line:
                cut = CITATION.sub("", line)
                if cut != line:
                    removed["citation"] = removed.get("citation", 0) + len(line) - len(cut)
                    line = cut
            if not line.endswith(TERMINAL_PUNCTUATION) or line.endswith(ELLIPSIS):
                removed["no_terminal_punct"] += len(line)
                continue
            if len(words) < p.min_words:
                removed["few_words"] += len(line)
                continue
            low = line.lower()
            if p.lorem_ipsum and "lorem ipsum" in low:
                return PageCleaning(text=None, reason="c4_lines_lorem_ipsum", detail=f"line {len(kept) + 1} of the kept lines contains 'lorem ipsum'")
            if p.javascript and "javascript" in low:
                removed["javascript"] += len(line)
                continue
            if p.curly_brace and "{" in line:
                return PageCleaning(text=None, reason="c4_lines_curly_brace", detail="a kept line contains '{'")
            if any(ph in low for ph in phrases):
                removed["policy"] += len(line)
                continue
            sentences += count_sentences(line)
            kept.append(line)
        if sentences < p.min_sentences:
            return PageCleaning(
                text=None, reason="c4_lines_min_sentences", detail=f"sentences={sentences} < min_sentences={p.min_sentences}"
            )
        return PageCleaning(text="\n".join(kept).strip(), chars_removed={k: v for k, v in removed.items() if v})

    def check_view(self, view: TextView) -> str | None:
        """Whether the page survives C4's cleaning (the rewrite itself is `clean`)."""
        cleaned = self.clean(view.text)
        return None if cleaned.text is not None else f"{cleaned.reason}: {cleaned.detail}"


C4_LINES: list[type[Rule]] = [C4LineFilter]
