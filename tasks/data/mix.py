"""Rebalance the mix: sample each source to its target weight, in tokens or characters.

The total size defaults to the data we have, capped so that no source is repeated more
than its `max_epochs`; sources above their share are down-sampled, those below are
up-sampled by whole repeats plus a seeded sample. Deterministic for a seed.

Two streaming passes, so memory does not grow with the corpus:
1. per source, the total size and a histogram of sizes over `HASH_BUCKETS` buckets of a
   seeded per-document hash (of seed, source, doc_id); from these each source's whole
   repeats `full` and the cut: the smallest number of hash buckets whose documents cover
   the remainder;
2. each document is written `full` times, plus once more when its hash bucket lies below
   the cut; documents written zero times are removed as "downsampled".
Precision: the sampled remainder overshoots its target by less than one hash bucket's
units, about 1/65,536 of the source; on small sources, where buckets hold at most one
document, by less than one document.
The result does not depend on batch sizes or on the order of documents.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash
from pydantic import Field, field_validator
from tokenizers import Tokenizer

from infra.config import StrictModel
from infra.stages import Stage
from tasks.data.documents import DOCUMENT_SCHEMA, iter_batches, removed_from_documents
from tasks.data.step import DataStep, StageResult

log = logging.getLogger(__name__)
STAGE = "mix"
REPEAT_COLUMN = "repeat"  # 0 for the first copy of a document, 1.. for up-sampled copies
HASH_BITS = 16
HASH_BUCKETS = 1 << HASH_BITS  # histogram resolution of pass 1: 512 KiB per source
BATCH_ROWS = 4096


class MixConfig(StrictModel):
    seed: int = 0
    unit: Literal["chars", "tokens"] = "chars"
    tokenizer: Path | None = None  # needed when unit == "tokens"
    total: int | None = Field(default=None, gt=0)  # target size in units; None = all the data we have
    # Each named source's weight instead of its catalog `weight:` (normalised with the others'); None = the catalog's
    weights: dict[str, float] | None = None

    @field_validator("weights")
    @classmethod
    def _weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is not None:
            bad = {k: v for k, v in weights.items() if not v >= 0 or v != v or v == float("inf")}
            if bad:
                raise ValueError(f"weights {bad}: a source's weight is a finite number >= 0")
        return weights


def hash_buckets(seed: int, source: str, doc_ids: list[str]) -> np.ndarray:
    """The seeded hash bucket (0 .. HASH_BUCKETS-1) of each document: its place in the sampling order."""
    prefix = f"{seed}\x1f{source}\x1f"
    shift = 64 - HASH_BITS
    return np.fromiter((xxhash.xxh3_64_intdigest(prefix + d) >> shift for d in doc_ids), dtype=np.int64, count=len(doc_ids))


class _Sizer:
    """Sizes of documents in the mix unit (tokens when a tokenizer is known), batch by batch."""

    def __init__(self, cfg: MixConfig):
        self.tok = None
        if cfg.unit == "tokens":
            if cfg.tokenizer is None:
                raise ValueError("mix.unit is 'tokens' but mix.tokenizer is not set; give a tokenizer.json or use unit: chars")

            self.tok = Tokenizer.from_file(str(cfg.tokenizer))

    def __call__(self, texts: pa.ChunkedArray | pa.Array) -> np.ndarray:
        if self.tok is None:
            return pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
        batch = texts.to_pylist()
        return np.asarray([len(e.ids) for e in self.tok.encode_batch(batch)] if batch else [], dtype=np.int64)


def plan_cuts(
    histograms: dict[str, np.ndarray],
    weights: dict[str, float],
    max_epochs: dict[str, float],
    total: int | None = None,
) -> tuple[dict[str, tuple[int, int]], dict]:
    """(full repeats, hash-bucket cut) per source from its size histogram, and the report of
    target vs achieved shares. A document is written `full` times, once more if its bucket < cut."""
    have = {s: int(h.sum()) for s, h in histograms.items()}
    present = [s for s in histograms if have[s] > 0]
    wsum = sum(weights[s] for s in present)
    share = {s: weights[s] / wsum for s in present}
    cap = min((have[s] * max_epochs[s] / share[s] for s in present), default=0.0)
    budget = min(total if total is not None else sum(have.values()), cap)
    plan: dict[str, tuple[int, int]] = {}
    achieved: dict[str, int] = {}
    for source, hist in histograms.items():
        if source not in present:
            plan[source], achieved[source] = (0, 0), 0
            continue
        want = share[source] * budget
        full = int(want // have[source])
        rest = want - full * have[source]
        cum = np.cumsum(hist)
        # The fewest buckets (in hash order) whose documents cover the remainder.
        cut = int(np.searchsorted(cum, rest, side="left")) + 1 if rest > 0 else 0
        cut = min(cut, len(hist))
        plan[source] = (full, cut)
        achieved[source] = full * have[source] + (int(cum[cut - 1]) if cut else 0)
    total_units = sum(achieved.values()) or 1
    # A source cut below half its size is worth a line: usually another source is too small
    # for its weight (a source of one document shrinks every other one to match).
    shrunk = {s: round(achieved[s] / have[s], 4) for s in present if achieved[s] * 2 < have[s]}
    report = {
        "unit": None,
        "budget": float(budget),
        "sources": {
            s: {
                "target": round(share.get(s, 0.0), 6),
                "achieved": round(achieved[s] / total_units, 6),
                "available": have[s],
                "sampled": achieved[s],
                "epochs": round(achieved[s] / max(have[s], 1), 4),
            }
            for s in histograms
        },
        "shrunk_below_half": shrunk,  # source -> share of its units kept
    }
    return plan, report


def _sources_of(batch: pa.RecordBatch) -> tuple[np.ndarray, list[str]]:
    """(code of each row, source name of each code) of a batch's source column."""
    enc = pc.dictionary_encode(batch.column("source"))
    return enc.indices.to_numpy(zero_copy_only=False), enc.dictionary.to_pylist()


def _batch_buckets(batch: pa.RecordBatch, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(hash bucket, source code) of each row, and the source names."""
    codes, names = _sources_of(batch)
    ids = batch.column("doc_id").to_pylist()
    buckets = np.empty(batch.num_rows, dtype=np.int64)
    for c, name in enumerate(names):
        rows = np.flatnonzero(codes == c)
        buckets[rows] = hash_buckets(seed, name, [ids[i] for i in rows.tolist()])
    return buckets, codes, names


def rebalance_mix(
    in_path: Path,
    out_path: Path,
    removed_path: Path,
    weights: dict[str, float],
    max_epochs: dict[str, float],
    cfg: MixConfig,
    batch_rows: int = BATCH_ROWS,
) -> StageResult:
    """Write the sampled rows (with a `repeat` column) and the down-sampled documents."""
    pf = pq.ParquetFile(in_path)
    sizer = _Sizer(cfg)
    hists: dict[str, np.ndarray] = {s: np.zeros(HASH_BUCKETS, dtype=np.int64) for s in weights}
    for batch in iter_batches(pf, batch_rows, columns=["doc_id", "source", "text"]):
        buckets, codes, names = _batch_buckets(batch, cfg.seed)
        missing = [s for s in names if s not in weights]
        if missing:
            raise ValueError(f"documents from source(s) {missing} have no mix weight; add them to the catalog")
        sizes = sizer(batch.column("text"))
        for c, name in enumerate(names):
            rows = codes == c
            # float64 weights are exact below 2**53 units per bucket
            hists[name] += np.bincount(buckets[rows], weights=sizes[rows], minlength=HASH_BUCKETS).astype(np.int64)
    names_all = sorted(hists)
    plan, report = plan_cuts({s: hists[s] for s in names_all}, weights, max_epochs, cfg.total)
    report["unit"] = cfg.unit
    for source, kept in report["shrunk_below_half"].items():
        log.warning("mix: source '%s' keeps %.1f%% of its %s (%d of %d): the weights and max_epochs of the other sources "
                    "cap the mix; raise max_epochs of the small sources or lower their weights to keep more",
                    source, 100 * kept, cfg.unit, report["sources"][source]["sampled"], report["sources"][source]["available"])
    del hists
    schema = DOCUMENT_SCHEMA.append(pa.field(REPEAT_COLUMN, pa.int32()))
    rows_out = dict.fromkeys(names_all, 0)
    with DataStep(STAGE, out_path, removed_path, schema=schema) as step:
        for batch in iter_batches(pf, batch_rows, columns=DOCUMENT_SCHEMA.names):
            table = pa.Table.from_batches([batch]).cast(DOCUMENT_SCHEMA)
            buckets, codes, names = _batch_buckets(batch, cfg.seed)
            full = np.array([plan[n][0] for n in names], dtype=np.int64)[codes]
            cut = np.array([plan[n][1] for n in names], dtype=np.int64)[codes]
            counts = full + (buckets < cut)
            step.read(table)
            picked = np.repeat(np.arange(table.num_rows), counts)
            # repeat number of each emitted row: 0 for the first copy, 1.. for up-sampled copies
            rep_no = np.arange(len(picked)) - np.repeat(np.cumsum(counts) - counts, counts)
            out = table.take(pa.array(picked, pa.int64())).append_column(REPEAT_COLUMN, pa.array(rep_no, pa.int32()))
            step.keep(out, counted=table.filter(pa.array(counts > 0)))
            for c, name in enumerate(names):
                rows_out[name] += int(counts[codes == c].sum())
            dropped = table.filter(pa.array(counts == 0))
            step.remove(removed_from_documents(dropped, STAGE, ["downsampled"] * dropped.num_rows))
    return step.result({f"rows:{s}": rows_out[s] for s in names_all}, report=report)


class RebalanceMix(Stage):
    """Sources sampled to their catalog weights (`weights`, capped at `max_epochs` repeats):
    work/data/mix/<key>/{docs,removed}.parquet."""

    name, store, Config, Result = STAGE, "data/mix", MixConfig, StageResult
    inputs = ("docs", "weights", "max_epochs")

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return rebalance_mix(inputs["docs"], out_dir / "docs.parquet", out_dir / "removed.parquet", inputs["weights"],
                             inputs["max_epochs"], self.config)
