"""FineWeb rules (Penedo et al. 2024; datatrove FineWebQualityFilter), with its defaults."""
from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from infra.config import StrictModel
from tasks.data.quality_rules.batch import Batch
from tasks.data.quality_rules.rule import Rule, failures, fraction, over
from tasks.data.quality_rules.text import TextView

# The original FineWeb stop characters, plus the CJK, Arabic and Devanagari sentence ends.
STOP_CHARS = [".", "'", '"', "!", "?", "。", "！", "？", "؟", "।"]


class FineWebLinePunct(Rule):
    """Fewer than 12% of lines end in punctuation: lists, menus, tables."""

    name = "fineweb_line_punct_ratio"

    class Params(StrictModel):
        min_ratio: float = Field(default=0.12, ge=0, le=1)
        exclude_zero: bool = False  # FineWeb's option: keep documents with no punctuated line at all
        stop_chars: list[str] = Field(default_factory=lambda: list(STOP_CHARS), min_length=1)

    def check_view(self, view: TextView) -> str | None:
        lines = view.lines
        if not lines:
            return None
        ends = tuple(self.params.stop_chars)
        ratio = sum(1 for ln in lines if ln.rstrip().endswith(ends)) / len(lines)
        if ratio < self.params.min_ratio and not (ratio == 0 and self.params.exclude_zero):
            return f"punct_lines={ratio:.3f} < min_ratio={self.params.min_ratio}"
        return None


class FineWebShortLines(Rule):
    """More than 67% of lines are at most 30 characters: lists and navigation."""

    name = "fineweb_short_line_ratio"

    class Params(StrictModel):
        max_ratio: float = Field(default=0.67, ge=0, le=1)
        short_line_length: int = Field(default=30, ge=0)

    def check_view(self, view: TextView) -> str | None:
        lines = view.lines
        if not lines:
            return None
        ratio = sum(1 for ln in lines if len(ln) <= self.params.short_line_length) / len(lines)
        return over("short_lines", ratio, self.params, "max_ratio", ".3f")


class FineWebDupLineChars(Rule):
    """More than 1% of characters sit in repeated lines (stricter than Gopher's 20%)."""

    name = "fineweb_dup_line_char_frac"

    class Params(StrictModel):
        max_fraction: float = Field(default=0.01, ge=0, le=1)

    def check_view(self, view: TextView) -> str | None:
        dup_chars = view.line_duplicates[1]
        frac = fraction(dup_chars, len(view.text) - view.text.count("\n"))
        return over("dup_line_chars", frac, self.params, "max_fraction", ".3f")


class FineWebListRatio(Rule):
    """More than 0.3 newlines per word: a list rather than running text."""

    name = "fineweb_list_ratio"

    class Params(StrictModel):
        max_newlines_per_word: float = Field(default=0.3, ge=0)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        counts = batch.word_counts  # the batch's word split: no str.split per document
        return failures(todo, lambda i: self._judge(batch.texts[i].count("\n") / int(counts[i])) if counts[i] else None)

    def _judge(self, ratio: float) -> str | None:
        if ratio > self.params.max_newlines_per_word:
            return f"newlines_per_word={ratio:.3f} > max={self.params.max_newlines_per_word}"
        return None


FINEWEB: list[type[Rule]] = [FineWebLinePunct, FineWebShortLines, FineWebDupLineChars, FineWebListRatio]
