"""Gopher (MassiveText) quality and repetition rules.

Thresholds from Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", appendix A (Table A1), as implemented in datatrove's
GopherQualityFilter and GopherRepetitionFilter. Words are whitespace tokens.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from pydantic import Field

from infra.config import StrictModel
from tasks.data.quality_rules.batch import Batch
from tasks.data.quality_rules.rule import Rule, duplicated_ngram_chars, failures, fraction, over, top_ngram_chars, under
from tasks.data.quality_rules.text import TextView

STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]
BULLETS = ("•", "-", "*", "‣", "◦", "·")
ELLIPSES = ("...", "…")



def max_fraction_params(default: float) -> type[StrictModel]:
    """The Params of a rule whose one parameter is `max_fraction`, defaulting to `default`."""

    class Params(StrictModel):
        max_fraction: float = Field(default=default, ge=0, le=1)

    return Params


# ---------------------------------------------------------------- gopher_quality


class GopherWordCount(Rule):
    """Too short to be a document, or too long to be one (a dump)."""

    name = "gopher_word_count"

    class Params(StrictModel):
        min_words: int = Field(default=50, ge=0)
        max_words: int = Field(default=100_000, ge=1)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        counts = batch.content_words
        return failures(todo, lambda i: self._judge(int(counts[i])))

    def _judge(self, n: int) -> str | None:
        return under("words", n, self.params, "min_words") or over("words", n, self.params, "max_words")


class GopherMeanWordLength(Rule):
    """Mean word length outside [3, 10] characters: gibberish, tables or concatenated tokens."""

    name = "gopher_mean_word_length"

    class Params(StrictModel):
        min_mean: float = Field(default=3.0, ge=0)
        max_mean: float = Field(default=10.0, gt=0)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        counts, chars = batch.content_words, batch.content_chars
        return failures(todo, lambda i: self._judge(int(chars[i]) / int(counts[i])) if counts[i] else None)

    def _judge(self, mean: float) -> str | None:
        return under("mean_word_length", mean, self.params, "min_mean", ".2f") or over(
            "mean_word_length", mean, self.params, "max_mean", ".2f"
        )


class GopherSymbolWordRatio(Rule):
    """Too many hash signs or ellipses per word (hashtag spam, truncated teasers)."""

    name = "gopher_symbol_word_ratio"

    class Params(StrictModel):
        max_ratio: float = Field(default=0.1, ge=0)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        counts = batch.word_counts
        return failures(todo, lambda i: self._judge(batch.texts[i], int(counts[i])) if counts[i] else None)

    def _judge(self, text: str, n: int) -> str | None:
        hashes = fraction(text.count("#"), n)
        if hashes > self.params.max_ratio:
            return f"hash_per_word={hashes:.3f} > max_ratio={self.params.max_ratio}"
        ellipses = fraction(sum(text.count(e) for e in ELLIPSES), n)
        return over("ellipsis_per_word", ellipses, self.params, "max_ratio", ".3f")


class GopherBulletLines(Rule):
    """Nearly every line is a bullet point: a menu or a list of links, not prose."""

    name = "gopher_bullet_lines"
    Params = max_fraction_params(0.9)

    def check_view(self, view: TextView) -> str | None:
        lines = view.lines
        bullets = sum(1 for ln in lines if ln.lstrip().startswith(BULLETS))
        frac = fraction(bullets, len(lines))
        return over("bullet_lines", frac, self.params, "max_fraction", ".3f")


class GopherEllipsisLines(Rule):
    """Many lines end in an ellipsis: truncated snippets (search results, feeds)."""

    name = "gopher_ellipsis_lines"
    Params = max_fraction_params(0.3)

    def check_view(self, view: TextView) -> str | None:
        lines = view.lines
        ends = sum(1 for ln in lines if ln.rstrip().endswith(ELLIPSES))
        frac = fraction(ends, len(lines))
        return over("ellipsis_lines", frac, self.params, "max_fraction", ".3f")


class GopherAlphaWords(Rule):
    """Too few words contain a letter: numbers, tables, markup."""

    name = "gopher_alpha_words"

    class Params(StrictModel):
        min_fraction: float = Field(default=0.8, ge=0, le=1)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        counts, alpha = batch.word_counts, batch.alpha_words
        return failures(todo, lambda i: under("alpha_words", int(alpha[i]) / int(counts[i]), self.params,
                                              "min_fraction", ".3f") if counts[i] else None)


class GopherStopWords(Rule):
    """Fewer than two *different* English stop words: not running English text.

    Rae et al. keep a document only if it "contains at least two of the following English
    words", so "the the the" has one. Words are compared in lower case, stripped of edge
    punctuation ("The," counts as "the"); datatrove compares the raw tokens.
    """

    name = "gopher_stop_words"

    class Params(StrictModel):
        min_stop_words: int = Field(default=2, ge=0)
        stop_words: list[str] = Field(default_factory=lambda: list(STOP_WORDS))

    def __init__(self, params=None):
        super().__init__(params)
        self._stop = frozenset(w.lower() for w in self.params.stop_words)

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        found = batch.distinct_stop_words(self._stop)
        return failures(todo, lambda i: under("distinct_stop_words", int(found[i]), self.params, "min_stop_words"))


GOPHER_QUALITY: list[type[Rule]] = [
    GopherWordCount,
    GopherMeanWordLength,
    GopherSymbolWordRatio,
    GopherBulletLines,
    GopherEllipsisLines,
    GopherAlphaWords,
    GopherStopWords,
]

# ---------------------------------------------------------------- gopher_repetition


class _DupUnits(Rule):
    """Many of the document's lines or paragraphs (by count, or by characters) repeat an earlier one."""

    unit: ClassVar[str]  # "line" or "paragraph"
    by_chars: ClassVar[bool]

    def check_view(self, view: TextView) -> str | None:
        units = view.lines if self.unit == "line" else view.paragraphs
        dup_items, dup_chars = view.line_duplicates if self.unit == "line" else view.paragraph_duplicates
        frac = fraction(dup_chars, len(view.text)) if self.by_chars else fraction(dup_items, len(units))
        label = f"dup_{self.unit}_chars" if self.by_chars else f"dup_{self.unit}s"
        return over(label, frac, self.params, "max_fraction", ".3f")


class GopherDupParagraphFrac(_DupUnits):
    """Many paragraphs repeat an earlier paragraph of the same document (boilerplate)."""

    name, unit, by_chars = "gopher_dup_para_frac", "paragraph", False
    Params = max_fraction_params(0.3)


class GopherDupParagraphCharFrac(_DupUnits):
    """Many characters sit in repeated paragraphs."""

    name, unit, by_chars = "gopher_dup_para_char_frac", "paragraph", True
    Params = max_fraction_params(0.2)


class GopherDupLineFrac(_DupUnits):
    """Many lines repeat an earlier line (navigation, repeated headers)."""

    name, unit, by_chars = "gopher_dup_line_frac", "line", False
    Params = max_fraction_params(0.3)


class GopherDupLineCharFrac(_DupUnits):
    """Many characters sit in repeated lines."""

    name, unit, by_chars = "gopher_dup_line_char_frac", "line", True
    Params = max_fraction_params(0.2)


class _TopNgram(Rule):
    """The most frequent word n-gram covers too many of the document's characters."""

    n: ClassVar[int]

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        todo = list(todo)
        if not todo:
            return {}
        top = batch.ngrams(self.n, todo).top_chars  # one sort for all of todo
        return failures(todo, lambda i: self._judge(int(top[i]), len(batch.texts[i])))

    def check_view(self, view: TextView) -> str | None:
        return self._judge(top_ngram_chars(view, self.n), len(view.text))

    def _judge(self, top_chars: int, text_chars: int) -> str | None:
        return over(f"top_{self.n}gram_chars", fraction(top_chars, text_chars), self.params, "max_fraction", ".3f")


class GopherTop2Gram(_TopNgram):
    name, n = "gopher_top_2gram", 2
    Params = max_fraction_params(0.20)


class GopherTop3Gram(_TopNgram):
    name, n = "gopher_top_3gram", 3
    Params = max_fraction_params(0.18)


class GopherTop4Gram(_TopNgram):
    name, n = "gopher_top_4gram", 4
    Params = max_fraction_params(0.16)


class _DupNgram(Rule):
    """Too many characters sit in word n-grams that repeat an earlier n-gram."""

    n: ClassVar[int]

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        todo = list(todo)
        if not todo:
            return {}
        repeats = batch.ngrams(self.n, todo).repeats  # one sort for all of todo
        return super().check_batch(batch, [i for i in todo if repeats[i]])  # no repeat: 0 chars, passes

    def check_view(self, view: TextView) -> str | None:
        frac = fraction(duplicated_ngram_chars(view, self.n), len(view.text))
        return over(f"dup_{self.n}gram_chars", frac, self.params, "max_fraction", ".3f")


class GopherDup5Gram(_DupNgram):
    name, n = "gopher_dup_5gram", 5
    Params = max_fraction_params(0.15)


class GopherDup6Gram(_DupNgram):
    name, n = "gopher_dup_6gram", 6
    Params = max_fraction_params(0.14)


class GopherDup7Gram(_DupNgram):
    name, n = "gopher_dup_7gram", 7
    Params = max_fraction_params(0.13)


class GopherDup8Gram(_DupNgram):
    name, n = "gopher_dup_8gram", 8
    Params = max_fraction_params(0.12)


class GopherDup9Gram(_DupNgram):
    name, n = "gopher_dup_9gram", 9
    Params = max_fraction_params(0.11)


class GopherDup10Gram(_DupNgram):
    name, n = "gopher_dup_10gram", 10
    Params = max_fraction_params(0.10)


GOPHER_REPETITION: list[type[Rule]] = [
    GopherDupParagraphFrac,
    GopherDupParagraphCharFrac,
    GopherDupLineFrac,
    GopherDupLineCharFrac,
    GopherTop2Gram,
    GopherTop3Gram,
    GopherTop4Gram,
    GopherDup5Gram,
    GopherDup6Gram,
    GopherDup7Gram,
    GopherDup8Gram,
    GopherDup9Gram,
    GopherDup10Gram,
]
