"""The batch-wise quality rules decide exactly as the rules judged one document at a time.

The filter judges 512 documents at once (tasks/data/quality_rules/rule.py: one pyarrow
word split per batch, one n-gram sort per size for all documents); these tests hold that to
per-document references written plainly in Python.
"""
from __future__ import annotations

import random
import string
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tasks.data.quality_rules import RULES, FilterSpec, build_rules, judge_texts
from tasks.data.quality_rules.batch import Batch
from tasks.data.quality_rules.gopher import STOP_WORDS
from tasks.data.quality_rules.text import TextView

_PUNCT = set(string.punctuation + "«»„“”‘’…–—•·¡¿")
# Words that stress the Unicode paths: non-ASCII letters, a Kelvin sign that lowers to "k",
# digits only, punctuation only, stop words in several cases.
VOCAB = (
    STOP_WORDS + ["The", "AND,", "(of)", "to."]
    + ["river", "valley", "Straße", "naïve", "\u212aelvin", "İstanbul", "ﬁsh", "東京", "42", "3.14", "—", "...", "#tag", "…"]
    + [f"w{i}" for i in range(40)]
)


def random_doc(rng: random.Random) -> str:
    kind = rng.random()
    words = [rng.choice(VOCAB) for _ in range(rng.randint(0, 120))]
    if kind < 0.3 and words:  # a repeated passage: the n-gram rules fire
        k = rng.randint(2, 12)
        words = words[:k] * rng.randint(2, 6) + words
    lines, i = [], 0
    while i < len(words):
        step = rng.randint(1, 15)
        end = rng.choice([".", "", "!", "?", '"', "...", ":", ". It is.", '." Yes', "! \u00a0", ".\u2003So."])
        lines.append(" ".join(words[i : i + step]) + end)
        i += step
    sep = rng.choice(["\n", "\n\n", "\r\n", " \u00a0\n", "\u2028"])
    return sep.join(lines)


def docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [random_doc(rng) for _ in range(n)] + ["", " ", "\n\n", "the", "the the the " * 20]


def test_pyarrow_splits_words_where_str_split_does_for_every_code_point():
    """Every code point between two letters: pyarrow's whitespace split must agree with str.split."""
    points = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = [f"a{chr(c)}b" for c in points]
    split = pc.utf8_split_whitespace(pa.array(texts, type=pa.large_string()))
    counts = np.diff(np.asarray(split.offsets))
    expected = np.array([len(t.split()) for t in texts])
    wrong = [hex(points[i]) for i in np.flatnonzero(counts != expected)]
    assert not wrong, f"pyarrow and str.split disagree on {wrong[:20]}"


def test_pyarrow_trims_whitespace_where_str_strip_does_for_every_code_point():
    points = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = [f"{chr(c)}a{chr(c)}" for c in points]
    trimmed = pc.utf8_trim_whitespace(pa.array(texts, type=pa.large_string())).to_pylist()
    wrong = [hex(points[i]) for i, (t, x) in enumerate(zip(texts, trimmed)) if t.strip() != x]
    assert not wrong, f"pyarrow and str.strip disagree on {wrong[:20]}"


def _content(words: list[str]) -> list[str]:
    return [c for c in (w.strip("".join(sorted(_PUNCT))) for w in words) if c]


def reference(name: str, text: str) -> bool:
    """Whether the rule `name` at its default params fails `text`, measured word by word in Python."""
    p = RULES[name].Params()
    words = text.split()
    content = _content(words)
    if name == "gopher_word_count":
        return not p.min_words <= len(content) <= p.max_words
    if name == "gopher_mean_word_length":
        return bool(content) and not p.min_mean <= sum(map(len, content)) / len(content) <= p.max_mean
    if name == "gopher_alpha_words":
        return bool(words) and sum(any(ch.isalpha() for ch in w) for w in words) / len(words) < p.min_fraction
    if name == "gopher_stop_words":
        stop = {w.lower() for w in p.stop_words}
        return len({w.lower() for w in content} & stop) < p.min_stop_words
    raise KeyError(name)


@pytest.mark.parametrize("name", ["gopher_word_count", "gopher_mean_word_length", "gopher_alpha_words", "gopher_stop_words"])
def test_batch_word_rules_match_a_per_word_reference(name):
    texts = docs(400, seed=1)
    failed = RULES[name]().check_batch(Batch(texts), range(len(texts)))
    for i, text in enumerate(texts):
        assert (i in failed) == reference(name, text), (name, text, failed.get(i))


NGRAM_RULES = [f"gopher_top_{n}gram" for n in (2, 3, 4)] + [f"gopher_dup_{n}gram" for n in range(5, 11)]
# Rules with a batch-wide path beside their per-document one (check_view).
BATCH_PATH_RULES = NGRAM_RULES + ["c4_terminal_punct", "c4_min_sentences"]


@pytest.mark.parametrize("name", BATCH_PATH_RULES)
def test_batch_rules_match_the_single_document_path(name):
    """One sort over the batch gives each document the verdict of its own TextView (no batch)."""
    texts = docs(400, seed=2)
    rule = RULES[name]()
    failed = rule.check_batch(Batch(texts), range(len(texts)))
    alone = {i: d for i, t in enumerate(texts) if (d := rule.check_view(TextView(t))) is not None}
    assert failed == alone
    assert len(alone) > 5, "the corpus must exercise the rule"


@pytest.mark.parametrize("filter_set", ["prose", "code"])
def test_judging_a_batch_equals_judging_each_document_alone(filter_set):
    texts = docs(300, seed=3)
    rules = build_rules(FilterSpec(filter_set=filter_set))
    together = judge_texts(rules, texts).verdicts
    assert together == [judge_texts(rules, [t]).verdicts[0] for t in texts]


def test_stop_words_must_be_distinct():
    """Rae et al.: at least two of the stop words; "the the the" holds one."""
    rule = RULES["gopher_stop_words"]()
    assert rule.check("the the the cat sat on a mat " * 10) is not None
    assert rule.check("the cat and the dog " * 10) is None
    assert rule.check("The, cat; AND dog " * 10) is None  # case and edge punctuation do not matter
