"""Rebalance the mix: sample each source to its target weight, in tokens or characters.

The total size defaults to the data we have, capped so that no source is repeated more
than its `max_epochs`; sources above their share are down-sampled, those below are
up-sampled by whole repeats plus a seeded sample. Deterministic for a seed.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import task
from pydantic import Field

from infra.config import StrictModel
from tasks.data.documents import DOCUMENT_SCHEMA, removed_from_documents
from tasks.data.step import DataStep, StageResult, count_by_source

STAGE = "mix"
REPEAT_COLUMN = "repeat"  # 0 for the first copy of a document, 1.. for up-sampled copies


class MixConfig(StrictModel):
    seed: int = 0
    unit: Literal["chars", "tokens"] = "chars"
    tokenizer: Path | None = None  # needed when unit == "tokens"
    total: int | None = Field(default=None, gt=0)  # target size in units; None = all the data we have


def _rng(seed: int, source: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{source}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def document_sizes(table: pa.Table, cfg: MixConfig) -> np.ndarray:
    """Size of each document in the mix unit (tokens when a tokenizer is known)."""
    if cfg.unit == "tokens":
        if cfg.tokenizer is None:
            raise ValueError("mix.unit is 'tokens' but mix.tokenizer is not set; give a tokenizer.json or use unit: chars")
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(cfg.tokenizer))
        texts = table.column("text").to_pylist()
        sizes = [len(e.ids) for e in tok.encode_batch(texts)] if texts else []
        return np.asarray(sizes, dtype=np.int64)
    return pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)


def plan_mix(
    sizes_by_source: dict[str, np.ndarray],
    weights: dict[str, float],
    max_epochs: dict[str, float],
    seed: int,
    total: int | None = None,
) -> tuple[dict[str, np.ndarray], dict]:
    """Repeat counts per document of each source, and a report of target vs achieved shares."""
    present = {s: v for s, v in sizes_by_source.items() if v.sum() > 0}
    wsum = sum(weights[s] for s in present)
    share = {s: weights[s] / wsum for s in present}
    have = {s: int(v.sum()) for s, v in present.items()}
    cap = min((have[s] * max_epochs[s] / share[s] for s in present), default=0.0)
    budget = min(total if total is not None else sum(have.values()), cap)
    repeats: dict[str, np.ndarray] = {}
    for source, sizes in sizes_by_source.items():
        if source not in present:
            repeats[source] = np.zeros(len(sizes), dtype=np.int64)
            continue
        want = share[source] * budget
        full = int(want // have[source])
        rest = want - full * have[source]
        order = _rng(seed, source).permutation(len(sizes))
        cum = np.cumsum(sizes[order])
        # Take documents in shuffled order until the remainder is covered.
        extra = order[: int(np.searchsorted(cum, rest, side="left")) + (1 if rest > 0 else 0)]
        counts = np.full(len(sizes), full, dtype=np.int64)
        counts[extra] += 1
        repeats[source] = counts
    achieved_units = {s: int((sizes_by_source[s] * repeats[s]).sum()) for s in sizes_by_source}
    total_units = sum(achieved_units.values()) or 1
    report = {
        "unit": None,
        "budget": float(budget),
        "sources": {
            s: {
                "target": round(share.get(s, 0.0), 6),
                "achieved": round(achieved_units[s] / total_units, 6),
                "available": int(sizes_by_source[s].sum()),
                "sampled": achieved_units[s],
                "epochs": round(achieved_units[s] / max(int(sizes_by_source[s].sum()), 1), 4),
            }
            for s in sizes_by_source
        },
    }
    return repeats, report


def rebalance_mix(
    in_path: Path,
    out_path: Path,
    removed_path: Path,
    weights: dict[str, float],
    max_epochs: dict[str, float],
    cfg: MixConfig,
) -> StageResult:
    """Write the sampled rows (with a `repeat` column) and the down-sampled documents."""
    table = pq.read_table(in_path, schema=DOCUMENT_SCHEMA, memory_map=True)
    sources = table.column("source").to_numpy(zero_copy_only=False)
    sizes = document_sizes(table, cfg)
    names = sorted(set(sources.tolist()) | set(weights))
    missing = [s for s in set(sources.tolist()) if s not in weights]
    if missing:
        raise ValueError(f"documents from source(s) {missing} have no mix weight; add them to the catalog")
    index = {s: np.flatnonzero(sources == s) for s in names}
    repeats, report = plan_mix(
        {s: sizes[index[s]] for s in names}, weights, max_epochs, cfg.seed, cfg.total
    )
    report["unit"] = cfg.unit
    counts_all = np.zeros(table.num_rows, dtype=np.int64)
    for s in names:
        counts_all[index[s]] = repeats[s]
    picked = np.repeat(np.arange(table.num_rows), counts_all)
    # repeat number of each emitted row: 0 for the first copy, 1.. for up-sampled copies
    starts = np.repeat(np.cumsum(counts_all) - counts_all, counts_all)
    rep_no = np.arange(len(picked)) - starts
    out = table.take(pa.array(picked, pa.int64())).append_column(REPEAT_COLUMN, pa.array(rep_no, pa.int32()))
    schema = DOCUMENT_SCHEMA.append(pa.field(REPEAT_COLUMN, pa.int32()))
    with DataStep(STAGE, out_path, removed_path, schema=schema) as step:
        step.read(table)
        step.keep(out, counted=table.filter(pa.array(counts_all > 0)))
        dropped = table.filter(pa.array(counts_all == 0))
        step.remove(removed_from_documents(dropped, STAGE, ["downsampled"] * dropped.num_rows))
    rows = count_by_source(out)
    return step.result({f"rows:{s}": int(rows.get(s, 0)) for s in names}, report=report)


rebalance_mix_task = task(rebalance_mix, name="mix")
