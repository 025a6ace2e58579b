"""Exact dedup: keep the first copy (input order) of each normalised text.

Kept documents carry the normalised text (tasks/data/text_normalize.py `normalize_text`:
invisible and control characters stripped, NFC), so later stages and the shards see that
form, not the one with zero-width padding or bidi overrides; copies are compared by its
NFKC fold (`dedup_key`), which is hashed but not kept because NFKC changes meaning ("x²").
Documents that normalise to nothing are removed as "empty_after_normalize"; later
copies of a text are removed as "exact_duplicate" with `duplicate_of` = the kept id.
Streams record batches. What grows with the corpus is the index of texts seen: per unique
text a 16-byte digest (the first half of its sha256) and the index of its kept copy in
sorted numpy runs (24 bytes), and the kept copy's doc_id in Arrow string chunks (its
length + 4 bytes): ~48 bytes per unique document with 20-character ids, a fraction of what
a dict of sha256 digests to doc_id strings takes.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from infra.config import StrictModel
from infra.stages import Stage
from tasks.data.documents import DOCUMENT_SCHEMA, as_documents, iter_batches, removed_from_documents
from tasks.data.step import DataStep, StageResult
from tasks.data.text_normalize import dedup_key, normalize_text

STAGE = "exact_dedup"
EMPTY = "empty_after_normalize"
DUPLICATE = "exact_duplicate"


class ExactDedupConfig(StrictModel):
    normalize: bool = True  # False: compare raw text, byte for byte


def exact_dedup(in_path: Path, out_path: Path, removed_path: Path, cfg: ExactDedupConfig) -> StageResult:
    """Remove empty and exactly repeated documents from `in_path`; write kept and removed files."""
    in_path = Path(in_path)
    if not in_path.is_file():
        raise FileNotFoundError(f"exact_dedup: input {in_path} does not exist; run the collect stage first")
    seen = DigestIndex()
    with DataStep(STAGE, out_path, removed_path) as step:
        for batch in iter_batches(in_path):
            table = as_documents(batch)
            step.read(table)
            _dedup_batch(step, table, seen, cfg.normalize)
    return step.result({"unique_texts": len(seen), "index_bytes": seen.nbytes}, duplicate_reason=DUPLICATE)


class DigestIndex:
    """128-bit digests of the texts seen -> doc_id of their first copy, in compact numpy runs.

    Digests live in sorted runs (hi, lo, kept index) merged as they double, so a batch is
    looked up with `searchsorted` and memory stays ~24 bytes per digest plus the doc_ids.
    """

    def __init__(self) -> None:
        self._runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._ids: list[pa.Array] = []  # doc_ids of the kept copies, in kept order, a chunk per batch
        self._id_starts: list[int] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes + c.nbytes for a, b, c in self._runs) + sum(a.nbytes for a in self._ids)

    def lookup(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Kept index of each digest, -1 where it is new."""
        found = np.full(len(hi), -1, dtype=np.int64)
        for run_hi, run_lo, run_val in self._runs:
            pos = np.searchsorted(run_hi, hi)
            inside = pos < len(run_hi)
            pos_c = np.where(inside, pos, 0)
            same_hi = inside & (run_hi[pos_c] == hi)
            hit = same_hi & (run_lo[pos_c] == lo)
            found[hit] = run_val[pos_c[hit]]
            # The same upper half with another lower half (about 2**-64 per pair): scan its equal run.
            for i in np.flatnonzero(same_hi & ~hit).tolist():
                j = int(pos_c[i])
                while j < len(run_hi) and run_hi[j] == hi[i]:
                    if run_lo[j] == lo[i]:
                        found[i] = run_val[j]
                        break
                    j += 1
        return found

    def add(self, hi: np.ndarray, lo: np.ndarray, doc_ids: pa.Array) -> None:
        """Record new digests (not yet in the index, distinct) of kept documents `doc_ids`, in order."""
        if not len(hi):
            return
        vals = np.arange(self._n, self._n + len(hi), dtype=np.int64)
        self._ids.append(doc_ids)
        self._id_starts.append(self._n)
        self._n += len(hi)
        order = np.lexsort((lo, hi))
        self._runs.append((hi[order], lo[order], vals[order]))
        while len(self._runs) > 1 and 2 * len(self._runs[-1][0]) >= len(self._runs[-2][0]):
            b, a = self._runs.pop(), self._runs.pop()
            m_hi, m_lo, m_val = (np.concatenate([x, y]) for x, y in zip(a, b))
            order = np.lexsort((m_lo, m_hi))
            self._runs.append((m_hi[order], m_lo[order], m_val[order]))

    def doc_id(self, index: int) -> str:
        chunk = int(np.searchsorted(self._id_starts, index, side="right")) - 1
        return self._ids[chunk][index - self._id_starts[chunk]].as_py()


def _digests(keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(upper, lower) 64-bit halves of the first 16 bytes of each key's sha256."""
    raw = b"".join([hashlib.sha256(k.encode("utf-8")).digest()[:16] for k in keys])
    halves = np.frombuffer(raw, dtype=">u8").reshape(-1, 2) if keys else np.zeros((0, 2), dtype=">u8")
    return halves[:, 0].astype(np.uint64), halves[:, 1].astype(np.uint64)


def _dedup_batch(step: DataStep, table: pa.Table, seen: DigestIndex, normalize: bool) -> None:
    """Keep the first copy of each text of `table` (adding it to `seen`), remove the others."""
    raw = table.column("text").to_pylist()
    texts = [normalize_text(t) for t in raw] if normalize else raw
    # The key is taken of the collected text, not of the kept form: NFKC turns some characters
    # the kept form keeps (U+3000 in an indent) into blanks it would have handled otherwise.
    # For ASCII the two forms are one string, so most documents pay for one normalisation.
    keys = [text if not normalize or r.isascii() else dedup_key(r) for r, text in zip(raw, texts)]
    nonempty = [i for i, t in enumerate(texts) if t.strip()]
    hi, lo = _digests([keys[i] for i in nonempty])
    found = seen.lookup(hi, lo)
    first_in_batch: dict[tuple[int, int], int] = {}  # digest -> row of its first new copy in this batch
    status: dict[int, int | None] = {}  # row -> kept index of its original (None: kept here)
    new_rows: list[int] = []
    for k, i in enumerate(nonempty):
        if found[k] >= 0:
            status[i] = int(found[k])
            continue
        key = (int(hi[k]), int(lo[k]))
        first = first_in_batch.get(key)
        if first is None:
            first_in_batch[key] = i
            new_rows.append(k)
            status[i] = None
        else:
            status[i] = -1 - first  # a copy of a row of this batch
    ids = table.column("doc_id")
    keep_rows = [nonempty[k] for k in new_rows]
    seen.add(hi[new_rows], lo[new_rows], ids.take(pa.array(keep_rows, pa.int64())).combine_chunks() if keep_rows
             else pa.array([], pa.string()))
    drop_rows: list[int] = []
    reasons: list[str] = []
    dup_of: list[str | None] = []
    id_list: list[str] | None = None
    for i in range(table.num_rows):
        if i not in status:
            drop_rows.append(i)
            reasons.append(EMPTY)
            dup_of.append(None)
            continue
        orig = status[i]
        if orig is None:
            continue
        drop_rows.append(i)
        reasons.append(DUPLICATE)
        if orig < 0:
            id_list = id_list if id_list is not None else ids.to_pylist()
            dup_of.append(id_list[-1 - orig])
        else:
            dup_of.append(seen.doc_id(orig))
    if keep_rows:
        out = table.take(pa.array(keep_rows, pa.int64()))
        if normalize:
            out = out.set_column(
                out.schema.get_field_index("text"), DOCUMENT_SCHEMA.field("text"),
                pa.array([texts[i] for i in keep_rows], pa.string()),
            )
        step.keep(out)
    if drop_rows:
        gone = table.take(pa.array(drop_rows, pa.int64()))
        # Removed rows keep the original text: that is what was collected and dropped.
        step.remove(removed_from_documents(gone, STAGE, reasons, duplicate_of=dup_of))


class ExactDedup(Stage):
    """Empty and exactly repeated documents out: work/data/exact/<key>/{docs,removed}.parquet."""

    name, store, Config, Result = STAGE, "data/exact", ExactDedupConfig, StageResult
    inputs = ("docs",)

    def compute(self, inputs: dict, out_dir: Path) -> StageResult:
        return exact_dedup(inputs["docs"], out_dir / "docs.parquet", out_dir / "removed.parquet", self.config)
