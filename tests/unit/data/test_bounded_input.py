"""Hostile input stays bounded: blank-line bombs cost their bytes, compressed files stop at
`max_inflated_bytes`, big text_dir files and over-long JSONL lines are quarantined with
their first 64 KiB and the sha256 of the whole, never held in memory.

Files are written for real (small on disk: gzip of blank lines compresses ~1000x).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.data.catalog import MAX_INFLATED_BYTES, load_catalog
from tasks.data.collect import collect_source
from tasks.data.readers import PREFIX_BYTES, jsonl_lines
from tests.conftest import ROOT

MiB = 1 << 20


def write_gz(path: Path, pieces) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=6) as fh:
        for piece in pieces:
            fh.write(piece)
    return path


def rec(text: str) -> bytes:
    return json.dumps({"text": text}).encode() + b"\n"


def collect_one(tmp_path: Path, yaml: str):
    (tmp_path / "cat").mkdir(exist_ok=True)
    (tmp_path / "cat" / "src.yaml").write_text(yaml)
    cat = load_catalog(tmp_path / "cat", data_roots=[tmp_path])
    res = collect_source(cat, cat.sources[0], tmp_path / "out")
    res.check_conservation()
    return res, pq.read_table(res.output).to_pylist(), pq.read_table(res.removed).to_pylist()


@pytest.mark.parametrize("blank", [b"\n", b"\r\n", b"  \t\n"])
def test_runs_of_blank_lines_cost_their_bytes(tmp_path, blank):
    # 64 MiB of blank lines: ~22M lines. Read a line per call, this took ~90 s of CPU.
    n = (64 * MiB) // len(blank)
    path = write_gz(tmp_path / "d.jsonl.gz", [rec("first"), *[blank * (n // 16)] * 16, rec("last")])
    start = time.process_time()
    out = list(jsonl_lines(path, max_line_bytes=MiB))
    cpu = time.process_time() - start
    assert [loc for loc, _ in out] == ["line:1", f"line:{n // 16 * 16 + 2}"]  # blank lines still count
    assert [json.loads(raw)["text"] for _, raw in out] == ["first", "last"]
    assert cpu < 5, f"{cpu:.1f} s of CPU for 64 MiB of blank lines"


def test_blank_run_across_chunk_edges_keeps_line_numbers(tmp_path):
    # Lines of every layout around the 1 MiB read size: numbering must match a plain split.
    lines = [rec(f"doc {i}") if i % 7 == 0 else b" " * (i * 997 % 3000) + b"\n" for i in range(3000)]
    lines[1500] = b'{"text": "' + b"y" * (2 * MiB) + b'"}\n'  # one line over the cap, between blanks
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(lines) + rec("tail").rstrip(b"\n"))  # last line without a newline
    got = [(loc, raw if isinstance(raw, bytes) else raw.reason) for loc, raw in jsonl_lines(path, max_line_bytes=MiB)]
    expected = [(f"line:{i + 1}", "line_too_long" if i == 1500 else raw) for i, raw in enumerate(lines) if raw.strip()]
    expected.append((f"line:{len(lines) + 1}", rec("tail").rstrip(b"\n")))
    assert got == expected


def test_compressed_file_stops_at_max_inflated_bytes(tmp_path):
    # 3 records, then 8 MiB of blank lines, then 2 more: with a 4 MiB cap the last two are
    # past the cap, so everything from the line the cap falls in is one oversize_file record.
    write_gz(tmp_path / "d.jsonl.gz", [rec("a"), rec("b"), rec("c"), b"\n" * (8 * MiB), rec("d"), rec("e")])
    res, kept, removed = collect_one(
        tmp_path, "name: s\nkind: jsonl\npath: ../d.jsonl.gz\nlicence: MIT\nmax_inflated_bytes: 4194304\n"
    )
    assert [d["text"] for d in kept] == ["a", "b", "c"]
    assert len(removed) == 1 and removed[0]["reason"] == "oversize_file"
    assert removed[0]["locator"].startswith("line:") and removed[0]["locator"].endswith("+")
    assert "max_inflated_bytes=4194304" in removed[0]["detail"] and "raise max_inflated_bytes" in removed[0]["detail"]
    assert res.counts["s"] == {"in": 4, "out": 3, "oversize_file": 1}


def test_inflated_cap_inside_a_long_line_and_plain_files_uncapped(tmp_path):
    long_line = b'{"text": "' + b"z" * (3 * MiB) + b'"}\n'
    write_gz(tmp_path / "d.jsonl.gz", [rec("a"), long_line, rec("b")])
    (tmp_path / "p.jsonl").write_bytes(rec("a") + long_line + rec("b"))
    yaml = "name: s\nkind: jsonl\npath: ../{}\nlicence: MIT\nmax_inflated_bytes: 1048576\nmax_line_bytes: 65536\n"
    _, kept, removed = collect_one(tmp_path, yaml.format("d.jsonl.gz"))
    assert [d["text"] for d in kept] == ["a"] and [(r["locator"], r["reason"]) for r in removed] == [("line:2+", "oversize_file")]
    assert removed[0]["raw"] == long_line[:PREFIX_BYTES]
    # An uncompressed file's size is on disk for all to see: no inflated-bytes cap.
    (tmp_path / "plain").mkdir()
    (tmp_path / "p.jsonl").rename(tmp_path / "plain" / "p.jsonl")
    _, kept, removed = collect_one(tmp_path / "plain", yaml.format("p.jsonl"))
    assert [d["text"] for d in kept] == ["a", "b"] and [r["reason"] for r in removed] == ["line_too_long"]


def test_over_long_line_keeps_its_prefix_and_sha256_in_bounded_memory(tmp_path):
    line = b'{"text": "' + bytes(range(97, 123)) * (32 * MiB // 26) + b'"}'  # ~32 MiB, one line
    write_gz(tmp_path / "d.jsonl.gz", [rec("before"), line + b"\n", rec("after")])
    tracemalloc.start()
    try:
        out = list(jsonl_lines(tmp_path / "d.jsonl.gz", max_line_bytes=MiB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * MiB, f"peak {peak / MiB:.1f} MiB reading a 32 MiB line with max_line_bytes=1 MiB"
    rej = out[1][1]
    assert out[1][0] == "line:2" and rej.reason == "line_too_long"
    assert rej.raw == line[:PREFIX_BYTES] and rej.text == line[:PREFIX_BYTES].decode()
    assert f"sha256 of the line without its newline={hashlib.sha256(line).hexdigest()}" in rej.detail
    assert f"{len(line)} bytes" in rej.detail
    assert [json.loads(raw)["text"] for _, raw in (out[0], out[2])] == ["before", "after"]


@pytest.mark.parametrize("name, max_line", [("d.jsonl", 100_000), ("d.jsonl", 1000), ("d.jsonl.gz", 1000)])
def test_over_long_line_reaches_the_quarantine_file(tmp_path, name, max_line):
    # A cap under the 64 KiB prefix: the prefix is still read on, from the chunks that follow.
    line = b'{"text": "' + bytes(range(65, 91)) * 12_000 + b'"}'
    data = rec("ok") + line + b"\n" + rec("next")
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    _, kept, removed = collect_one(tmp_path, f"name: s\nkind: jsonl\npath: ../{name}\nlicence: MIT\nmax_line_bytes: {max_line}\n")
    assert [d["text"] for d in kept] == ["ok", "next"]
    assert removed[0]["reason"] == "line_too_long" and removed[0]["raw"] == line[:PREFIX_BYTES]
    assert f"={hashlib.sha256(line).hexdigest()}" in removed[0]["detail"] and f"{len(line)} bytes" in removed[0]["detail"]


def test_text_dir_file_over_max_file_bytes_is_quarantined_not_read(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    big = (b"A line of a big document.\n" * 10_000)[:200_000]
    (docs / "big.txt").write_bytes(big)
    (docs / "small.txt").write_text("A small document.")
    _, kept, removed = collect_one(
        tmp_path, "name: t\nkind: text_dir\npath: ../docs\nlicence: MIT\nmax_file_bytes: 100000\n"
    )
    assert [d["text"] for d in kept] == ["A small document."]
    (r,) = removed
    assert (r["reason"], r["locator"]) == ("oversize_file", "file:big.txt")
    assert r["raw"] == big[:PREFIX_BYTES] and r["text"] == big[:PREFIX_BYTES].decode()
    assert f"sha256 of the file={hashlib.sha256(big).hexdigest()}" in r["detail"]
    assert "200000 bytes > max_file_bytes=100000" in r["detail"] and "raise max_file_bytes" in r["detail"]


def test_text_dir_default_cap_on_a_50_mb_file(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    with open(docs / "huge.txt", "wb") as fh:
        h = hashlib.sha256()
        for i in range(50):
            block = f"block {i} ".encode() * (MiB // 8)
            fh.write(block)
            h.update(block)
    _, kept, removed = collect_one(tmp_path, "name: t\nkind: text_dir\npath: ../docs\nlicence: MIT\n")
    assert kept == [] and [r["reason"] for r in removed] == ["oversize_file"]
    assert len(removed[0]["raw"]) == PREFIX_BYTES and h.hexdigest() in removed[0]["detail"]
    assert "max_file_bytes=10485760" in removed[0]["detail"]


_CHILD = """
import json, sys, time
from pathlib import Path
from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source
cat = load_catalog(Path(sys.argv[1]), data_roots=[Path(sys.argv[1]).parent])
start = time.process_time()
res = collect_source(cat, cat.sources[0], Path(sys.argv[2]))
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the forked copy of the parent
# (a pytest worker of 1+ GB), while VmHWM is this program's own peak.
hwm_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"counts": res.counts, "cpu": time.process_time() - start, "rss_mib": hwm_kib / 1024}))
"""


@pytest.mark.slow
def test_gzip_bomb_with_the_default_cap_runs_in_bounded_memory_and_time(tmp_path):
    # ~1.03 GiB of blank lines in ~1 MB of gzip, 32 MiB past the default 1 GiB cap (compressing more
    # only costs time here): one record before it is kept, the rest is one oversize_file record, in a
    # child process whose peak RSS and CPU are measured.
    n_blocks = MAX_INFLATED_BYTES // (16 * MiB) + 2
    write_gz(tmp_path / "cat" / "bomb.jsonl.gz", [rec("before"), *[b"\n" * (16 * MiB)] * n_blocks, rec("after")])
    (tmp_path / "cat" / "src.yaml").write_text("name: s\nkind: jsonl\npath: bomb.jsonl.gz\nlicence: MIT\n")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "cat"), str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["counts"] == {"s": {"in": 2, "out": 1, "oversize_file": 1}}
    assert got["rss_mib"] < 1024, got
    assert got["cpu"] < 30, got
