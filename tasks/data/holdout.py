"""Held out: a fixed slice of every source set aside right after collection, before any dedup or filter.

A model is then scored on text it never saw, raw as the source gave it (`llmforge ablate` with no targets, the
mix search's default target). A document is held out when the seeded hash of its id falls below `fraction`, so
the slice is the same for every recipe that collects the same sources, whatever its later stages do. Held-out
documents are one of the places a document ends (the funnel's `held_out` column), in removed.parquet with reason
`held_out`, and each source's slice is also written as `held_out/<source>.jsonl` (a `text` per line), the form
a target file takes (tasks/eval/targets.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash
from pydantic import BaseModel, Field

from infra.config import StrictModel
from infra.stages import Stage
from infra.workspace.atomic import write_text_atomic
from tasks.data.documents import as_documents, iter_batches, removed_from_documents
from tasks.data.step import DataStep, StageResult

STAGE = "holdout"
REASON = "held_out"


class HoldoutConfig(StrictModel):
    fraction: float = Field(0.0, ge=0.0, le=0.5)  # share of every source's documents held out; 0 = none (no stage)
    seed: int = Field(0, ge=0)  # which slice


class HeldOut(BaseModel):
    """The stage's result and each source's held-out texts."""

    result: StageResult
    files: dict[str, Path]  # source -> held_out/<source>.jsonl


def held_out_mask(seed: int, doc_ids: list[str], fraction: float) -> np.ndarray:
    """Which documents are held out: the seeded 64-bit hash of the id below `fraction` of its range."""
    cut = int(fraction * 2**64)
    prefix = f"{seed}\x1f"
    return np.fromiter((xxhash.xxh3_64_intdigest(prefix + d) < cut for d in doc_ids), dtype=np.bool_,
                       count=len(doc_ids))


def hold_out(in_path: Path, out_dir: Path, cfg: HoldoutConfig) -> HeldOut:
    """Split `in_path`'s documents into out_dir/docs.parquet and the held-out slice (removed.parquet with reason
    held_out, and held_out/<source>.jsonl)."""
    folder = out_dir / "held_out"
    folder.mkdir(parents=True, exist_ok=True)
    texts: dict[str, list[str]] = {}
    with DataStep(STAGE, out_dir / "docs.parquet", out_dir / "removed.parquet") as step:
        for batch in iter_batches(in_path):
            table = as_documents(batch)
            step.read(table)
            held = held_out_mask(cfg.seed, table.column("doc_id").to_pylist(), cfg.fraction)
            step.keep(table.filter(pa.array(~held)))
            if held.any():
                out = table.filter(pa.array(held))
                step.remove(removed_from_documents(out, STAGE, [REASON] * out.num_rows))
                for source, text in zip(out.column("source").to_pylist(), out.column("text").to_pylist()):
                    texts.setdefault(source, []).append(text)
    files = {}
    for source, rows in sorted(texts.items()):
        files[source] = write_text_atomic(folder / f"{source}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in rows))
    return HeldOut(result=step.result({"held_out_sources": len(files)}, duplicate_reason=REASON), files=files)


class Holdout(Stage):
    """A seeded slice of every source set aside (config: HoldoutConfig): work/data/holdout/<key>/."""

    name, store, Config, Result = STAGE, "data/holdout", HoldoutConfig, HeldOut
    inputs = ("docs",)

    def compute(self, inputs: dict, out_dir: Path) -> HeldOut:
        return hold_out(Path(inputs["docs"]), out_dir, self.config)
