"""Invisible characters: zero-width and bidi controls are stripped before dedup, NFKC folds
compatibility variants for comparison, and a text with nothing visible is `empty_text`.

Through the real stages on files the tests write: collect → exact dedup → near dedup →
quality → mix, so what reaches the shards is checked, not only what is hashed.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source
from tasks.data.documents import Document, documents_table
from tasks.data.exact_dedup import ExactDedupConfig, exact_dedup
from tasks.data.mix import MixConfig, rebalance_mix
from tasks.data.near_dedup import NearDedupConfig, near_dedup
from tasks.data.quality_filter import quality_filter
from tasks.data.text_normalize import dedup_key, has_visible_text, normalize_text
from tests.conftest import prose
from tests.helpers.parquet import write_table_atomic

# The brief's set (U+200B-U+200F, U+202A-U+202E, U+2060-U+2064, U+FEFF) and the rest of the
# Trojan Source family (U+061C, U+2066-U+2069), written out rather than taken from the module.
INVISIBLE = (
    [chr(c) for c in range(0x200B, 0x2010)] + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2060, 0x2065)] + [chr(c) for c in range(0x2066, 0x206A)] + ["\u061c", "\ufeff"]
)
ANY_INVISIBLE = re.compile("[" + "".join(INVISIBLE) + "]")


def pad(text: str, rng: random.Random) -> str:
    """`text` with invisible characters inserted inside and between its words."""
    return "".join(c + (rng.choice(INVISIBLE) if rng.random() < 0.3 else "") for c in text)


@pytest.mark.parametrize("ch", INVISIBLE)
def test_each_invisible_character_is_stripped(ch):
    assert normalize_text(f"in{ch}visible {ch}text{ch}") == "invisible text"
    assert dedup_key(f"in{ch}visible") == "invisible"
    assert not has_visible_text(f" {ch}\n{ch}\t")


def test_kept_form_is_nfc_and_the_compared_form_nfkc():
    # NFKC changes meaning (x² is not x2), so it is what dedup compares, not what is kept.
    assert normalize_text("x\u00b2 + \ufb01le\u00a0here") == "x\u00b2 + \ufb01le\u00a0here"
    assert dedup_key("x\u00b2 + \ufb01le\u00a0here") == "x2 + file here"
    assert dedup_key("\uff26\uff55\uff4c\uff4c\u3000width") == "Full width"
    for text in ("caf\u00e9 x\u00b2", "\u202ereversed\u202c", "a\u00a0 b", "a\n\u3000\tb"):
        assert dedup_key(dedup_key(text)) == dedup_key(text)
    for text in ("plain  ascii\t text\r\n", "def f():\n    return 1\x00"):
        assert dedup_key(text) == normalize_text(text)  # the ASCII shortcut exact dedup takes


def test_visible_text():
    assert has_visible_text("\u200ba") and has_visible_text("\u00e9") and has_visible_text("\u3042")
    assert not has_visible_text("") and not has_visible_text("\u00a0\u3000\u2028\x00\x1b\x85\ufeff")


def _pipeline(tmp_path: Path, records: list[str]):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in records))
    (tmp_path / "cat" / "s.yaml").write_text("name: s\nkind: jsonl\npath: d.jsonl\nlicence: MIT\nfilters: {filter_set: none}\n")
    cat = load_catalog(tmp_path / "cat")
    col = collect_source(cat, cat.sources[0], tmp_path / "collect")
    ex = exact_dedup(col.output, tmp_path / "e.parquet", tmp_path / "e.rm.parquet", ExactDedupConfig())
    nd = near_dedup(ex.output, tmp_path / "n.parquet", tmp_path / "n.rm.parquet", NearDedupConfig(workers=1))
    qf = quality_filter(nd.output, tmp_path / "q.parquet", tmp_path / "q.rm.parquet", cat.filter_specs())
    mx = rebalance_mix(qf.output, tmp_path / "m.parquet", tmp_path / "m.rm.parquet", cat.weights(), {"s": 1}, MixConfig())
    removed = {stage: pq.read_table(r.removed).to_pylist() for stage, r in (("collect", col), ("exact", ex), ("near", nd))}
    return pq.read_table(mx.output).to_pylist(), removed


def test_invisible_copies_are_duplicates_and_never_reach_the_shards(tmp_path):
    rng = random.Random(5)
    base = prose(rng, 120)
    near = base.split()
    near[60] = "changed"
    near = " ".join(near)
    records = [
        base,
        pad(base, rng),  # the same document, zero-width padded: an exact duplicate
        "\u202e" + pad(near, rng),  # one word changed, padded, with an RTL override: a near duplicate
        "\u200b\u200c\u200d\ufeff",  # nothing visible
        " \u2060\u202e\u2066 \n\u200f",  # nothing visible, with bidi controls
        "\u202eevil.exe\u202c is " + prose(rng, 80),  # kept, without its override
    ]
    shards, removed = _pipeline(tmp_path, records)
    assert [(r["locator"], r["reason"]) for r in removed["collect"]] == [("line:4", "empty_text"), ("line:5", "empty_text")]
    assert [(r["locator"], r["reason"]) for r in removed["exact"]] == [("line:2", "exact_duplicate")]
    assert [(r["locator"], r["reason"]) for r in removed["near"]] == [("line:3", "near_duplicate")]
    assert removed["exact"][0]["text"] == records[1]  # removed rows keep what was collected
    texts = {d["locator"]: d["text"] for d in shards}
    assert set(texts) == {"line:1", "line:6"}
    assert not any(ANY_INVISIBLE.search(t) for t in texts.values())
    assert texts["line:6"].startswith("evil.exe is ")


def test_near_dedup_compares_the_stripped_form_on_its_own(tmp_path):
    # Without exact dedup before it (exact.normalize off, or a standalone run), zero-width
    # padding inside words must not hide a near copy.
    rng = random.Random(2)
    base = prose(rng, 150)
    near = base.split()
    near[75] = "changed"
    docs = [Document("a", "s", base), Document("b", "s", pad(" ".join(near), rng)), Document("c", "s", prose(rng, 150))]
    path = write_table_atomic(documents_table(docs), tmp_path / "in.parquet")
    res = near_dedup(path, tmp_path / "n.parquet", tmp_path / "n.rm.parquet", NearDedupConfig(workers=1))
    gone = pq.read_table(res.removed).to_pylist()
    assert [(r["doc_id"], r["duplicate_of"]) for r in gone] == [("b", "a")]


def test_exact_dedup_folds_compatibility_variants_but_keeps_the_first_form(tmp_path):
    docs = [
        Document("a", "s", "Area is x\u00b2 in \ufb01eld units"),
        Document("b", "s", "Area is x2 in field units"),  # same under NFKC
        Document("c", "s", "\uff21rea is x2 in field\u00a0units"),  # full-width A, no-break space
    ]
    path = write_table_atomic(documents_table(docs), tmp_path / "in.parquet")
    res = exact_dedup(path, tmp_path / "e.parquet", tmp_path / "e.rm.parquet", ExactDedupConfig())
    assert pq.read_table(res.output).column("text").to_pylist() == ["Area is x\u00b2 in \ufb01eld units"]
    assert res.counts["s"] == {"in": 3, "out": 1, "exact_duplicate": 2}
