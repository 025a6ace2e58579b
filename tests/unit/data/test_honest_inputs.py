"""Issue 26, "every input honest": unusual sources are read, refused or quarantined, never
miscounted, never stale, never a hang. Each hostile input is small; conservation
(collected = kept + rejected, rejected counting what was in the file) is checked on each."""
from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import time
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.config import ConfigError
from infra.workspace.cache import fingerprint
from tasks.data import hf_source
from tasks.data.catalog import load_catalog
from tasks.data.collect import source_inputs
from tasks.data.input_files import sniff
from tasks.data.readers import jsonl_lines
from tests.helpers.collect import collect_one, write

RECORDS = [{"text": f"document number {i}"} for i in range(300)]
JSONL = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()


def reasons(removed: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in removed:
        out[r["reason"]] = out.get(r["reason"], 0) + 1
    return out


# 1. the fingerprint covers what is read ---------------------------------------------------

def test_a_local_hf_folder_that_grows_changes_the_sources_fingerprint(tmp_path):
    folder = tmp_path / "cat" / "local_copy"
    write(folder / "part-0.jsonl", "".join(json.dumps(r) + "\n" for r in RECORDS[:3]))
    write(tmp_path / "cat" / "src.yaml", "name: h\nkind: hf_dataset\nlicence: MIT\nhf:\n  name: local_copy\n")
    cat = load_catalog(tmp_path / "cat", data_roots=[tmp_path])
    before = fingerprint(source_inputs(cat, cat.sources[0]))
    assert [Path(p).name for p in source_inputs(cat, cat.sources[0])] == ["part-0.jsonl"]
    write(folder / "part-1.jsonl", "".join(json.dumps(r) + "\n" for r in RECORDS[3:5]))
    assert fingerprint(source_inputs(cat, cat.sources[0])) != before
    grown = fingerprint(source_inputs(cat, cat.sources[0]))
    with open(folder / "part-0.jsonl", "a") as fh:  # same files, one edited
        fh.write(json.dumps(RECORDS[5]) + "\n")
    assert fingerprint(source_inputs(cat, cat.sources[0])) != grown


# 2. every reader conserves -----------------------------------------------------------------

def test_parquet_without_the_text_column_rejects_every_row(tmp_path):
    pq.write_table(pa.table({"body": [f"r{i}" for i in range(1000)]}), write(tmp_path / "cat" / "d.parquet", b""), row_group_size=300)
    res, kept, removed = collect_one(tmp_path, "name: p\nkind: parquet\npath: d.parquet\nlicence: MIT\n")
    assert kept == [] and reasons(removed) == {"missing_field": 1000}
    assert res.counts["p"]["in"] == 1000 and "'text'" in removed[0]["detail"]


@pytest.mark.parametrize("fmt", ["gzip", "bz2", "xz", "zstd", "plain named .gz"])
def test_compressed_jsonl_is_read_by_its_content(tmp_path, fmt):
    pack = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress,
            "zstd": lambda b: pa.compress(b, "zstd", asbytes=True), "plain named .gz": lambda b: b}[fmt]
    write(tmp_path / "cat" / "d.jsonl.gz", pack(JSONL))  # the extension says gzip whatever the content
    res, kept, removed = collect_one(tmp_path, "name: c\nkind: jsonl\npath: d.jsonl.gz\nlicence: MIT\n")
    assert [d["text"] for d in kept] == [r["text"] for r in RECORDS] and removed == []


def test_a_format_we_do_not_inflate_is_refused_by_name(tmp_path):
    with zipfile.ZipFile(tmp_path / "z.zip", "w") as zf:
        zf.writestr("d.jsonl", JSONL)
    write(tmp_path / "cat" / "d.jsonl", (tmp_path / "z.zip").read_bytes())
    res, kept, removed = collect_one(tmp_path, "name: z\nkind: jsonl\npath: d.jsonl\nlicence: MIT\n")
    assert kept == [] and reasons(removed) == {"unsupported_compression": 1} and "zip-compressed" in removed[0]["detail"]


def test_text_that_begins_like_bz2_is_read_as_text(tmp_path):
    """bz2's first bytes "BZh" are plain text: only with the block size digit and a block's magic is a file bz2."""
    write(tmp_path / "cat" / "d.jsonl", b"BZh9 is not JSON\n" + JSONL)
    res, kept, removed = collect_one(tmp_path, "name: t\nkind: jsonl\npath: d.jsonl\nlicence: MIT\n")
    assert reasons(removed) == {"malformed_json": 1} and [d["text"] for d in kept] == [r["text"] for r in RECORDS]
    assert sniff(bz2.compress(b"")) == sniff(bz2.compress(JSONL)) == "bz2" and sniff(b"BZh9 is not") is None


def test_corrupt_bz2_keeps_what_came_before_and_names_the_damage(tmp_path):
    packed = bz2.compress(JSONL * 40, compresslevel=1)  # 100 kB blocks: the first ones inflate whole
    write(tmp_path / "cat" / "d.jsonl", packed[: len(packed) * 3 // 4])
    res, kept, removed = collect_one(tmp_path, "name: b\nkind: jsonl\npath: d.jsonl\nlicence: MIT\n")
    assert reasons(removed) == {"corrupt_file": 1} and 0 < len(kept) < 12000


def test_invalid_utf8_in_two_parquet_cells_quarantines_those_rows(tmp_path):
    cells = [f"good text {i}".encode() for i in range(1000)]
    cells[17], cells[803] = b"bad \xff\xfe cell", b"\xc3\x28 also bad"
    texts = pa.array(cells, pa.binary()).view(pa.string())  # no validation: as a foreign writer might
    pq.write_table(pa.table({"text": texts}), write(tmp_path / "cat" / "d.parquet", b""), row_group_size=400)
    res, kept, removed = collect_one(tmp_path, "name: u\nkind: parquet\npath: d.parquet\nlicence: MIT\n")
    assert len(kept) == 998 and reasons(removed) == {"invalid_utf8": 2}
    assert sorted(r["locator"] for r in removed) == ["row:17", "row:803"]
    assert "row group 2, row 803" in sorted(r["detail"] for r in removed)[1] and removed[0]["path"].endswith("d.parquet")


@pytest.mark.parametrize("damage", ["truncated", "jsonl named parquet"])
def test_a_file_that_is_not_parquet_is_one_rejection_naming_it(tmp_path, damage):
    good = write(tmp_path / "cat" / "a.parquet", b"")
    pq.write_table(pa.table({"text": ["kept one", "kept two"]}), good)
    bad = tmp_path / "cat" / "b.parquet"
    if damage == "truncated":
        pq.write_table(pa.table({"text": [f"t{i}" for i in range(100)]}), bad)
        bad.write_bytes(bad.read_bytes()[:-40])
    else:
        bad.write_bytes(JSONL)
    res, kept, removed = collect_one(tmp_path, "name: t\nkind: parquet\npath: '*.parquet'\nlicence: MIT\n")
    assert [d["text"] for d in kept] == ["kept one", "kept two"]
    assert reasons(removed) == {"corrupt_file": 1} and removed[0]["path"] == str(bad)
    assert "not a readable Parquet file" in removed[0]["detail"]


def test_a_corrupt_page_rejects_the_rest_of_its_row_group_and_the_file_goes_on(tmp_path):
    path = write(tmp_path / "cat" / "d.parquet", b"")
    pq.write_table(pa.table({"text": [f"text number {i} " * 20 for i in range(3000)]}), path, row_group_size=1000, compression="snappy")
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
    damaged = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    for k in range(chunk.data_page_offset + 40, start + chunk.total_compressed_size - 10, 7):
        damaged[k] ^= 0xFF
    path.write_bytes(bytes(damaged))  # pyarrow: OSError "Corrupt snappy compressed data", which was retried 3 times
    res, kept, removed = collect_one(tmp_path, "name: p\nkind: parquet\npath: d.parquet\nlicence: MIT\n")
    assert len(kept) == 2000 and reasons(removed) == {"corrupt_row_group": 1000}
    assert removed[0]["locator"] == "row:1000" and "row group 1 of d.parquet" in removed[0]["detail"]


def test_self_links_under_a_double_star_glob_collect_each_file_once_and_validate_at_once(tmp_path):
    data = tmp_path / "cat" / "data"
    write(data / "sub" / "d.jsonl", JSONL[:100].rsplit(b"\n", 1)[0] + b"\n")  # 3 records
    os.symlink(".", data / "self")
    os.symlink("..", data / "sub" / "up")  # two loops: glob.glob's ** never returned
    started = time.monotonic()
    res, kept, removed = collect_one(tmp_path, "name: l\nkind: jsonl\npath: 'data/**/*.jsonl'\nlicence: MIT\n")
    assert time.monotonic() - started < 10
    assert len(kept) == 3 and removed == []


# 5. no hang, no crash -----------------------------------------------------------------------

def test_a_fifo_is_refused_as_a_source_path_and_skipped_under_a_glob(tmp_path, caplog):
    write(tmp_path / "cat" / "ok.jsonl", JSONL)
    os.mkfifo(tmp_path / "cat" / "pipe.jsonl")
    with pytest.raises(ConfigError, match="pipe.jsonl is a FIFO"):
        collect_one(tmp_path, "name: f\nkind: jsonl\npath: pipe.jsonl\nlicence: MIT\n")
    with pytest.raises(ConfigError, match="is a character device"):
        collect_one(tmp_path, "name: f\nkind: jsonl\npath: /dev/zero\nlicence: MIT\nallow_outside_roots: true\n")
    res, kept, removed = collect_one(tmp_path, "name: f\nkind: jsonl\npath: '*.jsonl'\nlicence: MIT\n")
    assert len(kept) == 300 and "skipped 1 entries" in caplog.text
    # A FIFO reaching the reader all the same (swapped in after validation) is a rejection, not a block.
    assert [(loc, r.reason) for loc, r in jsonl_lines(tmp_path / "cat" / "pipe.jsonl", 1 << 20)] == [("file", "not_a_regular_file")]


def test_a_deeply_nested_json_line_is_refused_before_the_json_builder_sees_it(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_source, "MAX_NESTING", 50)  # the guard is the same at 1,000 levels; 60 is enough to trip it
    deep = "[" * 60 + "]" * 60
    write(tmp_path / "cat" / "deep.jsonl", JSONL[:200].rsplit(b"\n", 1)[0] + b"\n" + deep.encode() + b"\n")
    write(tmp_path / "cat" / "fine.jsonl", JSONL)
    res, kept, removed = collect_one(tmp_path, "name: d\nkind: hf_dataset\nlicence: MIT\nhf:\n  name: json\n  data_files: ['deep.jsonl', 'fine.jsonl']\n")
    assert len(kept) == 300
    counted = reasons(removed)
    assert counted["nesting_too_deep"] == 1 and sum(counted.values()) == JSONL[:200].count(b"\n") + 1
    assert all(r["path"].endswith("deep.jsonl") for r in removed)


def test_nesting_check_is_cheap_and_exact_at_the_real_limit():
    assert hf_source.nesting_depth_over(b"[" * 100_000 + b"]" * 100_000, hf_source.MAX_NESTING)
    assert not hf_source.nesting_depth_over(b'{"text": "' + b"[" * 5000 + b'"}', hf_source.MAX_NESTING)  # brackets in a string


# 6. cells capped, memory bounded by a row-group budget ----------------------------------------

def test_a_parquet_cell_over_the_cap_keeps_its_prefix_and_sha256(tmp_path):
    big = "y" * 300_000
    pq.write_table(pa.table({"text": ["small", big, "small too"]}), write(tmp_path / "cat" / "d.parquet", b""))
    res, kept, removed = collect_one(tmp_path, "name: c\nkind: parquet\npath: d.parquet\nlicence: MIT\nmax_cell_bytes: 100000\n")
    assert [d["text"] for d in kept] == ["small", "small too"] and reasons(removed) == {"cell_too_long": 1}
    assert hashlib.sha256(big.encode()).hexdigest() in removed[0]["detail"] and removed[0]["raw"] == big.encode()[: 64 << 10]


def test_a_row_group_over_the_budget_is_refused_row_by_row_naming_it(tmp_path):
    path = write(tmp_path / "cat" / "d.parquet", b"")
    pq.write_table(pa.table({"text": [os.urandom(2500).hex() for _ in range(30)] + ["short"] * 5}), path, row_group_size=30)
    res, kept, removed = collect_one(tmp_path, "name: g\nkind: parquet\npath: d.parquet\nlicence: MIT\nmax_row_group_bytes: 50000\n")
    assert len(kept) == 5 and reasons(removed) == {"row_group_too_big": 30} and "row group 0" in removed[0]["detail"]


def test_hf_dataset_without_the_text_column_rejects_every_row_and_caps_cells(tmp_path):
    write(tmp_path / "cat" / "d.jsonl", "".join(json.dumps({"body": f"b{i}"}) + "\n" for i in range(40)))
    res, kept, removed = collect_one(tmp_path, "name: h\nkind: hf_dataset\nlicence: MIT\nhf:\n  name: json\n  data_files: d.jsonl\n")
    assert kept == [] and reasons(removed) == {"missing_field": 40}
    write(tmp_path / "cat" / "d.jsonl", json.dumps({"text": "w" * 5000}) + "\n" + json.dumps({"text": "ok"}) + "\n")
    res, kept, removed = collect_one(tmp_path, "name: h\nkind: hf_dataset\nlicence: MIT\nmax_cell_bytes: 1000\nhf:\n  name: json\n  data_files: d.jsonl\n")
    assert [d["text"] for d in kept] == ["ok"] and reasons(removed) == {"cell_too_long": 1}


# 4. every path inside the catalog, the data roots or an allowed folder -------------------------

def test_hf_name_resolves_against_the_catalog_folder_not_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "cat" / "copy" / "part.jsonl", JSONL)
    monkeypatch.chdir(tmp_path / "cat" / "copy")  # a "copy" here would have been found by the old lookup too
    res, kept, removed = collect_one(tmp_path, "name: h\nkind: hf_dataset\nlicence: MIT\nhf:\n  name: copy\n")
    assert len(kept) == 300 and removed == []


@pytest.mark.parametrize("hf, message", [
    ("  name: {outside}\n", "outside the data roots"),
    ("  name: json\n  data_files: {outside}/d.jsonl\n", "outside the data roots"),
    ("  name: no_such_folder\n", "set hf.from_hub: true"),
    ("  name: json\n", "needs data_files"),
])
def test_hf_paths_outside_or_unknown_are_refused_before_any_work(tmp_path, hf, message):
    outside = tmp_path / "elsewhere"
    write(outside / "d.jsonl", JSONL)
    write(tmp_path / "data" / "cat" / "src.yaml", "name: h\nkind: hf_dataset\nlicence: MIT\nhf:\n" + hf.format(outside=outside))
    with pytest.raises(ConfigError, match=message):
        load_catalog(tmp_path / "data" / "cat", data_roots=[tmp_path / "data"])


def test_sft_hf_data_files_are_checked_too(tmp_path):
    from tasks.training.sft.data import SftSourceConfig, load_sft_examples

    write(tmp_path / "elsewhere" / "d.jsonl", json.dumps({"instruction": "q", "response": "a"}) + "\n")
    source = SftSourceConfig(name="s", kind="sft_hf_dataset", licence="MIT",
                             hf={"name": "json", "data_files": str(tmp_path / "elsewhere" / "d.jsonl")})
    with pytest.raises(ConfigError, match="SFT source 's': key 'hf.data_files'.*outside the data roots"):
        load_sft_examples([source], root=tmp_path / "sft")


# 7. errors in one line; a mix that shrinks a source says so ------------------------------------

def test_a_binary_catalog_yaml_is_one_config_error_naming_the_file(tmp_path):
    write(tmp_path / "cat" / "src.yaml", b"\x89PNG\r\n\x1a\n\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match=r"src.yaml: not UTF-8 text") as err:
        load_catalog(tmp_path / "cat", data_roots=[tmp_path])
    assert "\n" not in str(err.value)


def test_a_mix_that_shrinks_a_source_below_half_says_so(tmp_path, caplog):
    from tasks.data.documents import Document, documents_table
    from tasks.data.mix import MixConfig, rebalance_mix
    from tests.helpers.parquet import write_table_atomic

    docs = [Document("a0", "tiny", "only one document")] + [Document(f"b{i}", "big", f"text {i} " * 5) for i in range(200)]
    inp = write_table_atomic(documents_table(docs), tmp_path / "in.parquet")
    res = rebalance_mix(inp, tmp_path / "o.parquet", tmp_path / "r.parquet", {"tiny": 0.5, "big": 0.5}, {"tiny": 1, "big": 1}, MixConfig())
    res.check_conservation()
    assert set(res.report["shrunk_below_half"]) == {"big"} and res.report["shrunk_below_half"]["big"] < 0.5
    assert "mix: source 'big' keeps" in caplog.text
    from tasks.data.funnel import build_funnel
    from tasks.data.step import StageResult

    stage = {name: StageResult(stage=name, output=inp, counts={s: {"in": n, "out": n} for s, n in (("tiny", 1), ("big", 200))})
             for name in ("collect", "exact", "near", "quality")}
    funnel = build_funnel(*stage.values(), res)  # conservation is checked inside, with the new column present
    assert funnel["big"]["mix:shrunk_below_half"] == 1 and "mix:shrunk_below_half" not in funnel["tiny"]


@pytest.mark.slow  # ~20 s on a loaded 2-core box, nearly all of it a fresh interpreter importing prefect and datasets
def test_a_line_nested_100000_deep_ends_as_a_rejection_not_a_sigsegv(tmp_path):
    import subprocess
    import sys

    write(tmp_path / "cat" / "d.jsonl", JSONL + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    write(tmp_path / "cat" / "src.yaml", "name: d\nkind: hf_dataset\nlicence: MIT\nhf:\n  name: json\n  data_files: d.jsonl\n")
    script = (
        "import sys, pyarrow.parquet as pq\n"
        "from pathlib import Path\n"
        "from tasks.data.catalog import load_catalog\n"
        "from tasks.data.collect import collect_source\n"
        "cat = load_catalog(Path(sys.argv[1]) / 'cat', data_roots=[Path(sys.argv[1])])\n"
        "res = collect_source(cat, cat.sources[0], Path(sys.argv[1]) / 'out')\n"
        "print(res.counts['d']['in'], sorted(pq.read_table(res.removed).column('reason').to_pylist())[-1])\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-2000:]  # was -11 (SIGSEGV inside pyarrow's JSON reader)
    assert done.stdout.split() == ["301", "nesting_too_deep"]
