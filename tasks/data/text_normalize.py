"""Text normalisation shared by the dedup stages: one canonical form per document.

Two documents that differ only in Unicode composition, line endings, control
characters or runs of blanks normalise to the same string, so exact dedup catches
them. Leading indentation is kept: much of the corpus is source code, where
indentation is meaning, and collapsing it would merge different programs.
"""
from __future__ import annotations

import re
import unicodedata

# C0/C1 control characters except \t (\x09) and \n (\x0a); \r is handled before this.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A run of blanks inside a line: two or more, or any containing a tab.
_BLANK_RUN = re.compile(r"[ \t]*\t[ \t]*|  +")
# Four newlines are three blank lines; keep at most two.
_BLANK_LINES = re.compile(r"\n{4,}")


def normalize_text(text: str) -> str:
    """Canonical form of a document: NFC, no control characters, \\n line endings,
    single blanks between words, no trailing blanks, at most two blank lines in a
    row, stripped. Leading indentation of each line (except the first) is kept."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    # NFC after removing controls: a control between a letter and its accent blocks composition.
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    # A per-line loop with str methods is ~3x faster than look-behind regexes over the text.
    lines = text.split("\n")
    for i, line in enumerate(lines):
        body = line.strip(" \t")
        if "  " in body or "\t" in body:
            body = _BLANK_RUN.sub(" ", body)
        lines[i] = (line[: len(line) - len(line.lstrip(" \t"))] + body) if body else ""
    text = "\n".join(lines)
    if "\n\n\n\n" in text:
        text = _BLANK_LINES.sub("\n\n\n", text)
    return text.strip()
