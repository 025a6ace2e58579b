"""Property: every collected record ends in exactly one place, for any mix of good and bad input."""
from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings, strategies as st

from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source, merge_results
from tasks.data.exact_dedup import ExactDedupConfig, exact_dedup
from tasks.data.funnel import build_funnel
from tasks.data.mix import MixConfig, rebalance_mix
from tasks.data.near_dedup import NearDedupConfig, near_dedup
from tasks.data.quality_filter import quality_filter
from tests.conftest import words

BAD = [
    b'{"text": "unterminated',
    b'{"text": "bad \xc3\x28 bytes"}',
    b'{"other": 1}',
    b'{"text": null}',
    b'{"text": ["list"]}',
    b'{"text": "  \\n\\t "}',
    b'"just a string"',
    b'{"text": "\\udfff"}',
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
]

record = st.one_of(
    st.tuples(st.just("good"), st.integers(5, 300)),  # a document of n words
    st.tuples(st.just("dup"), st.integers(0, 50)),  # exact copy of an earlier good document
    st.tuples(st.just("near"), st.integers(0, 50)),  # near copy of an earlier good document
    st.tuples(st.just("bad"), st.integers(0, len(BAD) - 1)),
    st.tuples(st.just("text"), st.text(max_size=200)),  # arbitrary unicode, possibly empty
)


def render(records, seed: int) -> bytes:
    rng = random.Random(seed)
    goods: list[str] = []
    lines: list[bytes] = []
    for kind, arg in records:
        if kind == "good" or (kind in ("dup", "near") and not goods):
            goods.append(words(rng, arg if kind == "good" else 50) + ".")
            lines.append(json.dumps({"text": goods[-1]}).encode())
        elif kind == "dup":
            lines.append(json.dumps({"text": goods[arg % len(goods)]}).encode())
        elif kind == "near":
            base = goods[arg % len(goods)].split()
            base[len(base) // 2] = "changed"
            lines.append(json.dumps({"text": " ".join(base)}).encode())
        elif kind == "bad":
            lines.append(BAD[arg])
        else:
            lines.append(json.dumps({"text": arg}).encode("utf-8", "surrogatepass"))
    return b"\n".join(lines)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.lists(record, max_size=40), b=st.lists(record, max_size=40), seed=st.integers(0, 1000))
def test_conservation_over_random_inputs(a, b, seed):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cat = root / "cat"
        cat.mkdir()
        for name, recs in (("a", a), ("b", b)):
            (cat / f"{name}.jsonl").write_bytes(render(recs, seed))
            (cat / f"{name}.yaml").write_text(f"name: {name}\nkind: jsonl\npath: {name}.jsonl\nlicence: MIT\n")
        catalog = load_catalog(cat)
        per = [collect_source(catalog, s, root / "collect") for s in catalog.sources]
        col = merge_results(per, root / "c.parquet", root / "c.rm.parquet")
        ex = exact_dedup(col.output, root / "e.parquet", root / "e.rm.parquet", ExactDedupConfig())
        nd = near_dedup(ex.output, root / "n.parquet", root / "n.rm.parquet", NearDedupConfig(workers=1))
        qf = quality_filter(nd.output, root / "q.parquet", root / "q.rm.parquet", catalog.filter_specs())
        mx = rebalance_mix(qf.output, root / "m.parquet", root / "m.rm.parquet", catalog.weights(), {"a": 2, "b": 2}, MixConfig())
        funnel = build_funnel(col, ex, nd, qf, mx)  # raises if a document is lost or double counted
        total_records = sum(1 for recs in (a, b) for _ in recs)
        assert sum(r["collected"] for r in funnel.values()) == total_records
        removed_ids = []
        for stage in (col, ex, nd, qf):
            removed_ids += pq.read_table(stage.removed).column("doc_id").to_pylist()
        kept_ids = pq.read_table(qf.output).column("doc_id").to_pylist()
        # each collected record is in exactly one place: kept or one quarantine file
        assert len(removed_ids) + len(kept_ids) == total_records
        assert len(set(removed_ids) | set(kept_ids)) == total_records
