"""Exact dedup: keep the first copy (input order) of each normalised text.

Kept documents carry the normalised text (tasks/data/text_normalize.py `normalize_text`:
invisible and control characters stripped, NFC), so later stages and the shards see that
form, not the one with zero-width padding or bidi overrides; copies are compared by its
NFKC fold (`dedup_key`), which is hashed but not kept because NFKC changes meaning ("x²").
Documents that normalise to nothing are removed as "empty_after_normalize"; later
copies of a text are removed as "exact_duplicate" with `duplicate_of` = the kept id.
Streams record batches; memory grows only with the set of 32-byte digests seen.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
from prefect import task

from infra.config import StrictModel
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
    first_id: dict[bytes, str] = {}  # sha256 of normalised text -> doc_id of its first copy
    with DataStep(STAGE, out_path, removed_path) as step:
        for batch in iter_batches(in_path):
            table = as_documents(batch)
            step.read(table)
            _dedup_batch(step, table, first_id, cfg.normalize)
    return step.result({"unique_texts": len(first_id)}, duplicate_reason=DUPLICATE)


def _dedup_batch(step: DataStep, table: pa.Table, first_id: dict[bytes, str], normalize: bool) -> None:
    """Keep the first copy of each text of `table` (updating `first_id`), remove the others."""
    raw = table.column("text").to_pylist()
    ids = table.column("doc_id").to_pylist()
    texts = [normalize_text(t) for t in raw] if normalize else raw
    # The key is taken of the collected text, not of the kept form: NFKC turns some characters
    # the kept form keeps (U+3000 in an indent) into blanks it would have handled otherwise.
    # For ASCII the two forms are one string, so most documents pay for one normalisation.
    keys = [text if not normalize or r.isascii() else dedup_key(r) for r, text in zip(raw, texts)]
    keep_rows: list[int] = []
    drop_rows: list[int] = []
    reasons: list[str] = []
    dup_of: list[str | None] = []
    for i, text in enumerate(texts):
        if not text.strip():
            drop_rows.append(i)
            reasons.append(EMPTY)
            dup_of.append(None)
            continue
        digest = hashlib.sha256(keys[i].encode("utf-8")).digest()
        original = first_id.get(digest)
        if original is None:
            first_id[digest] = ids[i]
            keep_rows.append(i)
        else:
            drop_rows.append(i)
            reasons.append(DUPLICATE)
            dup_of.append(original)
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


exact_dedup_task = task(exact_dedup, name="exact_dedup")
