"""C4 rules (Raffel et al. 2020, section 2.2; TFDS c4_utils; datatrove C4QualityFilter),
applied at document level: C4 deletes offending *lines*, but a stage here never rewrites
text, so a rule removes the whole document when too much of it is what C4 would delete.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from infra.config import StrictModel
from tasks.data.quality_rules.rule import Rule, TextView, over, under

TERMINAL_PUNCTUATION = (".", "?", "!", '"', "'")
POLICY_PHRASES = ["terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies"]
# A sentence ends at terminal punctuation, possibly followed by closing quotes or brackets.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s|$)")


def c4_line_kept(line: str, min_words: int) -> bool:
    """Whether C4 would keep this line: ends in terminal punctuation (not an ellipsis), enough words."""
    line = line.strip()
    return line.endswith(TERMINAL_PUNCTUATION) and not line.endswith("...") and len(line.split()) >= min_words


def c4_units(view: TextView, unit: str) -> list[str]:
    """C4's units: lines, or for hard-wrapped text, paragraphs unwrapped into one line each."""
    if unit == "line":
        return view.lines
    return [" ".join(p.split()) for p in view.paragraphs]


class C4TerminalPunct(Rule):
    """Too few lines end in terminal punctuation: C4 would delete most of the document.

    C4 assumes one paragraph per line (extracted web text). For hard-wrapped text (plain
    text docs, books) set `unit: paragraph` so a paragraph is judged by its last line.
    The document-level cut-off is ours: C4 keeps the lines, we drop the document when
    C4 would delete more than half of it.
    """

    name = "c4_terminal_punct"

    class Params(StrictModel):
        min_fraction: float = Field(default=0.5, ge=0, le=1)
        unit: Literal["line", "paragraph"] = "line"
        min_words: int = Field(default=3, ge=0)  # C4: lines with fewer words are removed

    def check_view(self, view: TextView) -> str | None:
        units = c4_units(view, self.params.unit)
        if not units:
            return None
        kept = sum(1 for u in units if c4_line_kept(u, self.params.min_words))
        frac = kept / len(units)
        if frac < self.params.min_fraction:
            return f"terminal_{self.params.unit}s={frac:.3f} < min_fraction={self.params.min_fraction}"
        return None


class C4MinSentences(Rule):
    """Fewer than 5 sentences in the lines C4 would keep (C4 drops such pages)."""

    name = "c4_min_sentences"

    class Params(StrictModel):
        min_sentences: int = Field(default=5, ge=0)
        unit: Literal["line", "paragraph"] = "line"
        min_words: int = Field(default=3, ge=0)

    def check_view(self, view: TextView) -> str | None:
        n = 0
        for unit in c4_units(view, self.params.unit):
            if c4_line_kept(unit, self.params.min_words):
                n += len(_SENTENCE_END.findall(unit.strip()))
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
