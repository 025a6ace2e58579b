"""The held-out slice and the stages a recipe can leave out: every document still ends in exactly one place."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from infra.config import ConfigError
from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source, merge_results
from tasks.data.exact_dedup import ExactDedupConfig, exact_dedup
from tasks.data.funnel import build_funnel
from tasks.data.holdout import HoldoutConfig, hold_out, held_out_mask
from tasks.data.mix import MixConfig, rebalance_mix
from tasks.eval.target_files import read_target
from tests.conftest import words


def catalog(root: Path, n: int = 200):
    cat = root / "cat"
    cat.mkdir()
    rng = random.Random(0)
    for name in ("a", "b"):
        docs = [json.dumps({"text": words(rng, 30) + "."}) for _ in range(n)] + [json.dumps({"text": ""})]
        (cat / f"{name}.jsonl").write_text("\n".join(docs) + "\n")
        (cat / f"{name}.yaml").write_text(f"name: {name}\nkind: jsonl\npath: {name}.jsonl\nlicence: MIT\n")
    return load_catalog(cat)


def test_the_slice_is_the_seeded_share_and_the_same_each_time():
    ids = [f"doc{i}" for i in range(20000)]
    mask = held_out_mask(0, ids, 0.1)
    assert 0.09 < mask.mean() < 0.11
    assert (held_out_mask(0, ids, 0.1) == mask).all() and not (held_out_mask(1, ids, 0.1) == mask).all()
    assert (held_out_mask(0, ids, 0.2) >= mask).all()  # a larger share holds out what the smaller one did


def test_held_out_documents_are_a_place_and_a_target(tmp_path):
    cat = catalog(tmp_path)
    col = merge_results([collect_source(cat, s, tmp_path / "collect") for s in cat.sources],
                        tmp_path / "c.parquet", tmp_path / "c.rm.parquet")
    held = hold_out(col.output, tmp_path / "held", HoldoutConfig(fraction=0.2))
    ex = exact_dedup(held.result.output, tmp_path / "e.parquet", tmp_path / "e.rm.parquet", ExactDedupConfig())
    mx = rebalance_mix(ex.output, tmp_path / "m.parquet", tmp_path / "m.rm.parquet", cat.weights({"a": 3.0}),
                       {"a": 1, "b": 1}, MixConfig())
    funnel = build_funnel(col, ex, None, None, mx, holdout=held.result)  # near dedup and the filters left out
    for source in ("a", "b"):
        row = funnel[source]
        assert row["collected"] == 201 and row["rejected"] == 1 and 20 < row["held_out"] < 60
        assert row["held_out"] + row["exact_duplicates"] + row["filtered"] + row["kept"] == 200
        texts = read_target(held.files[source])
        assert len(texts) == row["held_out"]
    kept = set(pq.read_table(ex.output).column("text").to_pylist())
    assert not kept & set(read_target(held.files["a"]))  # no held-out text is trained on
    assert mx.report["sources"]["a"]["target"] == 0.75  # data.mix.weights instead of the catalog's 1 : 1


def test_mix_weights_name_catalog_sources(tmp_path):
    cat = catalog(tmp_path, n=5)
    assert cat.weights({"a": 3.0}) == {"a": 0.75, "b": 0.25}
    assert cat.weights() == {"a": 0.5, "b": 0.5}
    with pytest.raises(ConfigError, match=r"names \['c'\], not sources"):
        cat.weights({"c": 1.0})
    with pytest.raises(ConfigError, match="every source at weight 0"):
        cat.weights({"a": 0.0, "b": 0.0})
    with pytest.raises(ValueError, match="finite number >= 0"):
        MixConfig(weights={"a": -1.0})
