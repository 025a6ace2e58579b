"""Collect: every kind of source, and bad records quarantined with a reason, nothing lost."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source
from tests.conftest import ROOT
from tests.helpers.collect import collect_one, write

BAD_JSONL = b"\n".join(
    [
        b'{"text": "a good document", "id": 1}',
        b'{"text": "broken json',
        b'{"text": "bad \xff\xfe utf8"}',
        b'{"body": "no text field"}',
        b'{"text": 42}',
        b'{"text": "   "}',
        b'["not", "an", "object"]',
        b'{"text": "\\ud800 lone surrogate"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"text": "' + b"x" * 400_000 + b'"}',
        b"",
        b'{"text": "another good one"}',
    ]
)


def test_jsonl_bad_records_are_quarantined_with_reasons(tmp_path):
    write(tmp_path / "cat" / "d.jsonl", BAD_JSONL)
    res, kept, removed = collect_one(
        tmp_path, "name: s\nkind: jsonl\npath: d.jsonl\nlicence: MIT\nid_field: id\nmax_line_bytes: 300000\n"
    )
    assert [d["text"] for d in kept] == ["a good document", "another good one"]
    reasons = sorted(r["reason"] for r in removed)
    assert reasons == sorted(
        ["malformed_json", "invalid_utf8", "missing_field", "wrong_type", "empty_text",
         "not_an_object", "invalid_unicode", "malformed_json", "line_too_long"]
    )
    invalid = next(r for r in removed if r["reason"] == "invalid_utf8")
    assert invalid["raw"] is not None and b"\xff\xfe" in invalid["raw"]  # original bytes kept
    assert res.counts["s"]["in"] == 11 and res.counts["s"]["out"] == 2
    assert all(r["source"] == "s" and r["stage"] == "collect" and r["locator"].startswith("line:") for r in removed)
    assert kept[0]["locator"] == "line:1#id=1" and kept[0]["licence"] == "MIT"


def test_jsonl_gz_and_stable_ids(tmp_path):
    rows = [json.dumps({"text": f"doc {i}"}) for i in range(5)]
    write(tmp_path / "cat" / "d.jsonl.gz", gzip.compress("\n".join(rows).encode()))
    _, kept1, _ = collect_one(tmp_path, "name: s\nkind: jsonl\npath: d.jsonl.gz\nlicence: MIT\n")
    _, kept2, _ = collect_one(tmp_path, "name: s\nkind: jsonl\npath: d.jsonl.gz\nlicence: MIT\n")
    assert len(kept1) == 5 and [d["doc_id"] for d in kept1] == [d["doc_id"] for d in kept2]
    assert len({d["doc_id"] for d in kept1}) == 5


def test_truncated_gzip_is_quarantined(tmp_path):
    data = gzip.compress(b"".join(json.dumps({"text": f"doc {i} " * 50}).encode() + b"\n" for i in range(200)))
    write(tmp_path / "cat" / "d.jsonl.gz", data[: len(data) // 2])
    res, kept, removed = collect_one(tmp_path, "name: s\nkind: jsonl\npath: d.jsonl.gz\nlicence: MIT\n")
    assert kept and removed[-1]["reason"] in ("corrupt_file", "malformed_json")


def test_parquet_source(tmp_path):
    table = pa.table({"content": ["alpha", None, "gamma", ""], "uid": ["a", "b", "c", "d"]})
    (tmp_path / "cat").mkdir()
    pq.write_table(table, tmp_path / "cat" / "d.parquet")
    _, kept, removed = collect_one(tmp_path, "name: p\nkind: parquet\npath: d.parquet\ntext_field: content\nid_field: uid\nlicence: CC0\n")
    assert [d["text"] for d in kept] == ["alpha", "gamma"]
    assert sorted(r["reason"] for r in removed) == ["empty_text", "missing_field"]


def test_parquet_missing_column(tmp_path):
    (tmp_path / "cat").mkdir()
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "cat" / "d.parquet")
    _, kept, removed = collect_one(tmp_path, "name: p\nkind: parquet\npath: d.parquet\nlicence: CC0\n")
    assert not kept and removed[0]["reason"] == "missing_field"


def test_text_dir_with_binary_and_bad_files(tmp_path):
    d = tmp_path / "cat" / "texts"
    write(d / "a.txt", "first document")
    write(d / "sub" / "b.txt", "second document")
    write(d / "bin.txt", b"\x00\x01\x02binary")
    write(d / "latin1.txt", "caf\xe9".encode("latin-1"))
    write(d / "empty.txt", "")
    write(d / "skip.md", "not matched by the glob")
    _, kept, removed = collect_one(tmp_path, "name: t\nkind: text_dir\npath: texts\nlicence: MIT\n")
    assert sorted(d["text"] for d in kept) == ["first document", "second document"]
    assert sorted(r["reason"] for r in removed) == ["binary_file", "empty_text", "invalid_utf8"]
    assert {d["locator"] for d in kept} == {"file:a.txt", "file:sub/b.txt"}


def test_empty_source_is_counted_not_crashing(tmp_path):
    write(tmp_path / "cat" / "d.jsonl", "")
    res, kept, removed = collect_one(tmp_path, "name: e\nkind: jsonl\npath: d.jsonl\nlicence: MIT\n")
    assert not kept and not removed and res.counts["e"]["in"] == 0
    assert "no records" in res.stats["warning"]


def test_hf_dataset_local_json(tmp_path):
    write(tmp_path / "cat" / "d.json", "\n".join(json.dumps({"text": t}) for t in ["one", "two", ""]))
    _, kept, removed = collect_one(
        tmp_path, "name: h\nkind: hf_dataset\nlicence: MIT\nhf:\n  name: json\n  data_files: d.json\n"
    )
    assert [d["text"] for d in kept] == ["one", "two"] and removed[0]["reason"] == "empty_text"


def test_max_documents_cap(tmp_path):
    write(tmp_path / "cat" / "d.jsonl", "\n".join(json.dumps({"text": f"d{i}"}) for i in range(10)))
    res, kept, _ = collect_one(tmp_path, "name: s\nkind: jsonl\npath: d.jsonl\nlicence: MIT\nmax_documents: 3\n")
    assert len(kept) == 3 and res.counts["s"]["in"] == 3


def test_builtin_sources():
    cat = load_catalog(ROOT / "data_catalog")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        docs = collect_source(cat, cat.by_name()["python_docs"], Path(tmp))
        assert docs.counts["python_docs"]["out"] > 50
        rows = pq.read_table(docs.output).to_pylist()
        assert all(r["licence"] == "PSF-2.0" and r["locator"].startswith("topic:") for r in rows)
