"""Fuzz the JSONL reader: random bytes, huge lines, deep nesting, wrong types.

Every non-blank line becomes exactly one kept document or one quarantined row with a known
reason; kept text is exactly the line's `text` value. (tests/test_conservation.py fuzzes the
later stages end to end with a fixed list of bad records; this one generates the bad bytes.)
"""
from __future__ import annotations

import json
import tempfile
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source
from tasks.data.input_files import HEAD_BYTES, sniff

MAX_LINE = 1 << 16  # deep nesting below it reaches the JSON parser (RecursionError), above it is cut
REASONS = {"malformed_json", "invalid_utf8", "invalid_unicode", "missing_field", "wrong_type", "empty_text",
           "not_an_object", "line_too_long"}
# Characters that show nothing (zero-width, bidi controls), listed here rather than taken from
# tasks/data/text_normalize.py, so the oracle stays independent of the reader.
INVISIBLE = {chr(c) for r in ((0x200B, 0x2010), (0x202A, 0x202F), (0x2060, 0x2065), (0x2066, 0x206A)) for c in range(*r)}
INVISIBLE |= {"\u061c", "\ufeff"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=10,
)

line = st.one_of(
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" ")),  # arbitrary bytes
    st.text(max_size=60).map(lambda t: json.dumps({"text": t}).encode()),  # good or empty text
    st.text(alphabet=st.sampled_from(sorted(INVISIBLE) + [" ", "\n", "\x00", "a", "\u00e9"]), max_size=8).map(
        lambda t: json.dumps({"text": t}).encode()),  # invisible only, or nearly
    st.text(max_size=60).map(lambda t: json.dumps({"text": t}, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps({"text": v}).encode()),  # wrong types for the field
    json_values.map(lambda v: json.dumps(v).encode()),  # not an object / no field
    st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting (RecursionError territory)
    st.integers(MAX_LINE, 4 * MAX_LINE).map(lambda n: json.dumps({"text": "x" * n}).encode()),  # over-long
    st.binary(min_size=1, max_size=40).map(lambda b: b'{"text": "' + b.replace(b"\n", b"") + b'"}'),
)


def _expected_text(raw: bytes) -> str | None:
    """The text a line must yield if it is a valid record (the oracle, independent of the reader)."""
    if len(raw) + 1 > MAX_LINE:
        return None
    try:
        obj = json.loads(raw.decode("utf-8"))
        text = obj["text"]
        text.encode("utf-8")
    except Exception:  # noqa: BLE001 (anything wrong means "quarantined")
        return None
    # Kept only with a character that shows: not whitespace, not a control (Cc), not invisible.
    visible = isinstance(text, str) and any(
        not (c.isspace() or unicodedata.category(c) == "Cc" or c in INVISIBLE) for c in text)
    return text if visible else None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(line, max_size=30))
@example(lines=[b"[" * 30_000 + b"]" * 30_000, b'{"text": "ok"}', b"x" * 300_000, b"\xff\xfe", b'{"text": "\\ud800"}'])
@example(lines=[b"Rar!\x1a\x07", b"\x00"])  # found by Hypothesis: a first line that spells RAR's magic bytes
@example(lines=[b"BZh9 not bz2", b'{"text": "ok"}'])
def test_every_line_is_kept_or_quarantined_with_a_reason(lines):
    data = b"\n".join(lines) + b"\n"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "cat").mkdir()
        (root / "data.jsonl").write_bytes(data)
        (root / "cat" / "src.yaml").write_text(
            f"name: fuzz\nkind: jsonl\npath: ../data.jsonl\nlicence: cc0\nmax_line_bytes: {MAX_LINE}\n"
        )
        cat = load_catalog(root / "cat", data_roots=[root])
        res = collect_source(cat, cat.sources[0], root / "out")
        res.check_conservation()
        kept = pq.read_table(res.output).to_pylist()
        removed = pq.read_table(res.removed).to_pylist()

    records = [raw for raw in lines if raw.strip()]  # blank lines are layout, not records
    if sniff(data[:HEAD_BYTES]) is not None:
        # The file's first bytes spell a compression's magic: it is read as that format, not as plain JSONL, and
        # what cannot be read is quarantined whole, never kept as text.
        assert kept == [] and len(removed) == res.counts["fuzz"]["in"] >= 1
        assert {r["reason"] for r in removed} <= {"unsupported_compression", "corrupt_file"}
        return
    assert len(kept) + len(removed) == len(records) == res.counts["fuzz"]["in"]
    assert {r["reason"] for r in removed} <= REASONS
    assert all(r["stage"] == "collect" and r["locator"].startswith("line:") for r in removed)
    expected = [t for t in map(_expected_text, records) if t is not None]
    assert [d["text"] for d in kept] == expected
    assert len({d["doc_id"] for d in kept} | {r["doc_id"] for r in removed}) == len(records)  # ids unique
