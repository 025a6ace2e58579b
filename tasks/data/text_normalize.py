"""Text normalisation shared by the dedup stages: one canonical form per document.

Two documents that differ only in Unicode composition, line endings, control
characters, invisible (zero-width, bidi control) characters or runs of blanks
normalise to the same string, so exact dedup catches them. Leading indentation is
kept: much of the corpus is source code, where indentation is meaning, and
collapsing it would merge different programs.

Two forms, because compatibility folding (NFKC) loses meaning that training text needs
("x²" becomes "x2", "ℝ" becomes "R", "½" becomes "1⁄2"):
- `normalize_text`: the form that is kept (exact dedup writes it for every later stage):
  invisible characters stripped, NFC.
- `dedup_key`: the form that is compared (hashed by exact dedup, shingled by near dedup):
  the same steps with NFKC in place of NFC, so full-width, ligature or no-break-space
  variants of a document are duplicates of it too.
"""
from __future__ import annotations

import re
import unicodedata

# C0/C1 control characters except \t (\x09) and \n (\x0a); \r is handled before this.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Characters that render as nothing but change what a text hashes to, or (bidi controls)
# the order it displays in: zero-width space/non-joiner/joiner, LRM/RLM, the embedding and
# override controls U+202A-U+202E, word joiner and invisible operators U+2060-U+2064, byte
# order mark / zero-width no-break space U+FEFF, and the same family's other members (the
# Trojan Source set, CVE-2021-42574): the isolates U+2066-U+2069 and the Arabic letter
# mark U+061C. Stripping ZWNJ/ZWJ also joins Persian and Indic spellings that differ only in
# them and splits emoji ZWJ sequences into their parts; a copy padded with them is the
# commoner case in web text, and the words survive.
INVISIBLE = "\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
_INVISIBLE = re.compile(f"[{INVISIBLE}]")
# The first character that shows: not whitespace, not a C0/C1 control, not invisible.
_VISIBLE = re.compile(rf"[^\s\x00-\x1f\x7f-\x9f{INVISIBLE}]")
# A run of blanks inside a line: two or more, or any containing a tab.
_BLANK_RUN = re.compile(r"[ \t]*\t[ \t]*|  +")
# Four newlines are three blank lines; keep at most two.
_BLANK_LINES = re.compile(r"\n{4,}")


def has_visible_text(text: str) -> bool:
    """Whether `text` has a character that shows (not whitespace, control or invisible)."""
    return _VISIBLE.search(text) is not None


def normalize_text(text: str) -> str:
    """Canonical kept form of a document: NFC, no control or invisible characters, \\n line
    endings, single blanks between words, no trailing blanks, at most two blank lines in a
    row, stripped. Leading indentation of each line (except the first) is kept."""
    return _normalize(text, "NFC")


def dedup_key(text: str) -> str:
    """The form dedup compares: `normalize_text` with NFKC in place of NFC (see the module
    docstring). For ASCII text the two forms are the same string."""
    return _normalize(text, "NFKC")


def _normalize(text: str, form: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _INVISIBLE.sub("", text)
    # Normalise after removing controls and invisibles: one between a letter and its accent
    # blocks composition. Before the blank handling: NFKC turns no-break and other wide
    # spaces into plain blanks.
    if not unicodedata.is_normalized(form, text):
        text = unicodedata.normalize(form, text)
    # A per-line loop with str methods is faster than look-behind regexes over the text.
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
