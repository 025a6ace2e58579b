"""Exact dedup and text normalisation on hand-made documents."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from infra.config import ConfigError, parse_config
from tasks.data.documents import REMOVED_SCHEMA, Document, documents_table
from tasks.data.exact_dedup import ExactDedupConfig, exact_dedup
from tasks.data.near_dedup import NearDedupConfig, near_dedup
from tasks.data.text_normalize import dedup_key, normalize_text
from tests.helpers.parquet import write_table_atomic


def write_docs(path: Path, docs: list[Document]) -> Path:
    return write_table_atomic(documents_table(docs), path)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  Hello   world \t ", "Hello world"),
        ("a\r\nb\rc\n", "a\nb\nc"),
        ("x\x00y\x07z\x1b\x7f\x85", "xyz"),
        ("e\u0301t\u00e9", "\u00e9t\u00e9"),  # NFC composes the accent
        ("e\x00\u0301", "\u00e9"),  # a control between letter and accent is removed before NFC
        ("a\n\n\n\n\n\nb", "a\n\n\nb"),  # at most two blank lines
        ("a\n  \n\t\n \n\nb", "a\n\n\nb"),  # blank-looking lines are blank
        ("a\n\n\nb", "a\n\n\nb"),
        ("def f():\n    return  1   \n\tx\t\ty", "def f():\n    return 1\n\tx y"),  # indentation kept
        ("tab\tinside", "tab inside"),
        ("\n \t\n", ""),
        ("non\u00a0breaking", "non\u00a0breaking"),
    ],
)
def test_normalize_text(raw, expected):
    assert normalize_text(raw) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" \t\n\r\x00\x0c\x85ab\u00e9\u0301e\u00a0\u200b\u202e\ufeff\u00b2\u3000")), max_size=40))
def test_normalize_is_idempotent_and_clean(text):
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert dedup_key(dedup_key(text)) == dedup_key(text)
    assert "\r" not in once and "\x00" not in once and "\n\n\n\n" not in once
    assert not {"\u200b", "\u202e", "\ufeff"} & set(once)
    assert once == once.strip()
    assert all(line == line.rstrip(" \t") for line in once.split("\n"))


def test_exact_dedup_hand_made(tmp_path):
    docs = [
        Document("d1", "web", "Hello   world\r\n", licence="cc-by"),
        Document("d2", "web", "Hello world"),  # same after normalisation
        Document("d3", "web", "hello world"),  # different case: different text
        Document("d4", "code", "  \n\t "),  # empty after normalisation
        Document("d5", "code", "caf\u00e9"),
        Document("d6", "code", "cafe\u0301"),  # same after NFC
        Document("d7", "code", " Hello world "),  # duplicate of a document of another source
        Document("d8", "code", "\x00"),
    ]
    src = write_docs(tmp_path / "in.parquet", docs)
    result = exact_dedup(src, tmp_path / "out.parquet", tmp_path / "removed.parquet", ExactDedupConfig())
    kept = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [(d["doc_id"], d["text"]) for d in kept] == [("d1", "Hello world"), ("d3", "hello world"), ("d5", "caf\u00e9")]
    assert kept[0]["licence"] == "cc-by"
    removed = pq.read_table(tmp_path / "removed.parquet")
    assert removed.schema.equals(REMOVED_SCHEMA)
    rows = {r["doc_id"]: r for r in removed.to_pylist()}
    assert {k: (r["reason"], r["duplicate_of"]) for k, r in rows.items()} == {
        "d2": ("exact_duplicate", "d1"),
        "d4": ("empty_after_normalize", None),
        "d6": ("exact_duplicate", "d5"),
        "d7": ("exact_duplicate", "d1"),
        "d8": ("empty_after_normalize", None),
    }
    assert rows["d7"]["text"] == " Hello world "  # removed rows keep the text as collected
    assert {r["stage"] for r in rows.values()} == {"exact_dedup"}
    assert result.counts == {
        "code": {"in": 5, "out": 1, "empty_after_normalize": 2, "exact_duplicate": 2},
        "web": {"in": 3, "out": 2, "exact_duplicate": 1},
    }
    result.check_conservation()


def test_without_normalisation_only_identical_texts_collide(tmp_path):
    docs = [Document("a", "s", "x  y"), Document("b", "s", "x y"), Document("c", "s", "x  y"), Document("d", "s", " ")]
    src = write_docs(tmp_path / "in.parquet", docs)
    result = exact_dedup(src, tmp_path / "out.parquet", tmp_path / "rem.parquet", ExactDedupConfig(normalize=False))
    assert pq.read_table(tmp_path / "out.parquet").column("text").to_pylist() == ["x  y", "x y"]
    assert result.counts == {"s": {"in": 4, "out": 2, "empty_after_normalize": 1, "exact_duplicate": 1}}


def test_duplicates_across_record_batches_and_empty_removed_file(tmp_path):
    # iter_batches reads 4096 rows at a time: copies 4500 rows apart sit in different batches.
    docs = [Document(f"d{i}", "s", f"document number {i % 4500}") for i in range(5000)]
    src = write_docs(tmp_path / "in.parquet", docs)
    result = exact_dedup(src, tmp_path / "out.parquet", tmp_path / "rem.parquet", ExactDedupConfig())
    rem = pq.read_table(tmp_path / "rem.parquet").to_pylist()
    assert len(rem) == 500 and all(r["duplicate_of"] == f"d{int(r['doc_id'][1:]) - 4500}" for r in rem)
    assert result.counts == {"s": {"in": 5000, "out": 4500, "exact_duplicate": 500}}
    unique = write_docs(tmp_path / "u.parquet", docs[:10])
    result = exact_dedup(unique, tmp_path / "u_out.parquet", tmp_path / "u_rem.parquet", ExactDedupConfig())
    assert pq.read_metadata(tmp_path / "u_rem.parquet").num_rows == 0
    assert result.counts == {"s": {"in": 10, "out": 10}}


def test_config_and_input_errors(tmp_path):
    with pytest.raises(ConfigError, match="normalise"):
        parse_config(ExactDedupConfig, {"normalise": True}, "preset.yaml:exact")
    with pytest.raises(FileNotFoundError, match="collect stage first"):
        exact_dedup(tmp_path / "missing.parquet", tmp_path / "o.parquet", tmp_path / "r.parquet", ExactDedupConfig())


@pytest.mark.parametrize("dedup, config", [(exact_dedup, ExactDedupConfig()), (near_dedup, NearDedupConfig())])
def test_empty_input_writes_both_files(tmp_path, dedup, config):
    """Both dedup stages, exact and near, on no documents."""
    src = write_docs(tmp_path / "in.parquet", [])
    result = dedup(src, tmp_path / "o.parquet", tmp_path / "r.parquet", config)
    assert result.counts == {}
    assert pq.read_metadata(tmp_path / "o.parquet").num_rows == 0
    assert pq.read_schema(tmp_path / "r.parquet").equals(REMOVED_SCHEMA)
