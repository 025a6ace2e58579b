"""The data-flow tests' inputs: a tiny catalog with planted rejects and duplicates, a preset reading it, a CLI run."""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

from tests.conftest import CLI, ROOT, prose


def make_catalog(root: Path) -> Path:
    """root/catalog: 19 news records (an exact and a near copy, 4 rejects, one too short), 5 letters (one binary)."""
    cat = root / "catalog"
    (cat / "texts").mkdir(parents=True)
    rng = random.Random(0)
    lines = []
    for i in range(12):
        body = f"Document number {i} is about topic {i * 7}. " + prose(rng) + f" It ends with note {i}."
        lines.append(json.dumps({"text": body, "id": f"n{i}"}))
    lines.append(json.dumps({"text": lines and json.loads(lines[0])["text"]}))  # exact duplicate of n0
    near = json.loads(lines[1])["text"].replace("It ends with note 1.", "It ends with note one.")
    lines.append(json.dumps({"text": near}))  # near duplicate of n1
    lines += ['{"text": broken', '{"text": 5}', '{"text": ""}', "[1, 2]"]
    lines.append(json.dumps({"text": "too short"}))  # filtered by a quality rule
    (cat / "news.jsonl").write_text("\n".join(lines) + "\n")
    for i in range(4):
        (cat / "texts" / f"t{i}.txt").write_text(f"Letter {i}. " + prose(rng, 15))
    (cat / "texts" / "blob.txt").write_bytes(b"\x00\x01binary")
    (cat / "news.yaml").write_text("name: news\nkind: jsonl\npath: news.jsonl\nid_field: id\nlicence: CC-BY-4.0\nweight: 0.7\n")
    (cat / "letters.yaml").write_text("name: letters\nkind: text_dir\npath: texts\nlicence: CC0-1.0\nweight: 0.3\n")
    return cat


def make_preset(root: Path, data_yaml: str = "") -> Path:
    """A preset whose data section reads make_catalog's sources into tiny shards (plus `data_yaml` lines)."""
    preset = root / "preset.yaml"
    preset.write_text(f"data:\n  catalog: {make_catalog(root)}\n{data_yaml}  shards:\n    shard_mb: 0.002\n")
    return preset


def run_cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """`python -m flows.cli ARGS` from the repository root; fails the test with the output's tail unless it exits 0."""
    proc = subprocess.run(CLI + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc
