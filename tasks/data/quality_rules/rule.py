"""What a quality rule is, and the helpers its checks share.

A rule is a small class with a `name`, typed `Params` (defaults from the paper or the
reference implementation it comes from) and `check_view(view) -> None | detail`. The filter
judges a batch of documents at a time (tasks/data/quality_rules/batch.py), and a rule whose
measure is a per-word count (`check_batch`) reads the batch's arrays instead of looping over
words in Python. Each document's `TextView` (tasks/data/quality_rules/text.py) computes its
lines, paragraphs and n-gram statistics on first use, once for all the rules that need them.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar, Generic, TypeVar

from infra.config import StrictModel
from tasks.data.quality_rules.batch import Batch
from tasks.data.quality_rules.text import TextView

P = TypeVar("P", bound=StrictModel)


class Rule(Generic[P]):
    """Base of every quality rule: `check` returns None when the document passes, else why not."""

    name: ClassVar[str]
    Params: ClassVar[type[StrictModel]]

    def __init__(self, params: P | None = None):
        self.params: P = params if params is not None else self.Params()  # type: ignore[assignment]

    def check(self, text: str) -> str | None:
        """None when `text` passes this rule, else a short detail with the measured value."""
        batch = Batch([text])
        try:
            return self.check_batch(batch, [0]).get(0)
        finally:
            batch.release()

    def check_batch(self, batch: Batch, todo: Iterable[int]) -> dict[int, str]:
        """{document index: detail} for the documents of `todo` that fail this rule."""
        return failures(todo, lambda i: self.check_view(batch.view(i)))

    def check_view(self, view: TextView) -> str | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"


def failures(todo: Iterable[int], detail_of: Callable[[int], str | None]) -> dict[int, str]:
    """{i: detail_of(i)} for the documents i of `todo` whose detail is not None (they fail)."""
    out = {}
    for i in todo:
        detail = detail_of(i)
        if detail is not None:
            out[i] = detail
    return out


def top_ngram_chars(view: TextView, n: int) -> int:
    """Characters covered by the most frequent n-gram (0 unless it occurs at least twice)."""
    return view.top_ngram_chars(n)


def duplicated_ngram_chars(view: TextView, n: int) -> int:
    """Characters in n-grams that repeat an earlier n-gram (see TextView.duplicated_ngram_chars)."""
    return view.duplicated_ngram_chars(n)


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
