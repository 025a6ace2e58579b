"""The decontamination stage: collected documents that hold an evaluation item are dropped, or have it cut out.

It runs on the documents as they were collected, before any dedup or filter, so every item found is counted
against the documents as they came in. Two passes over the documents file: the first finds each document's
n-grams of the index (tasks/data/contamination.py) and counts in how many documents each occurs; the second
leaves out the common ones (more than `common_docs` documents) and drops the documents that still match
(reason `contaminated:<task>`), or with `action: cut` removes each match with `window` characters either side.
`decontamination.json` in the stage's folder says, per task, how many of its items were found, how many
documents were removed or cut, and how many of its n-grams were ignored as common.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from infra.config import StrictModel
from infra.stages import Stage
from infra.workspace.atomic import write_json_atomic, write_text_atomic
from tasks.data.contamination import ContaminationIndex, DocumentMatches, TaskItems, cut, judge
from tasks.data.documents import as_documents, iter_batches, removed_from_documents
from tasks.data.step import DataStep, StageResult

STAGE = "decontaminate"
REASON = "contaminated"  # a removal's reason is "contaminated:<task>"
REPORT_FILE = "decontamination.json"
FOUND_FILE = "found.jsonl"


class DecontaminateConfig(StrictModel):
    """How training documents are matched against the evaluation's items, and what happens to a match."""

    enabled: bool = True  # with no task to match (no eval task, no file) the stage is left out anyway
    # JSONL files of items of the user's own, each line {"question": ..., "answer": ...} or {"text": ...}; a file's
    # task is its name without the suffix
    files: list[Path] = Field(default_factory=list)
    n: int = Field(13, ge=1, le=64)  # words per n-gram; an item shorter than n words is matched whole
    common_docs: int = Field(10, ge=1)  # an n-gram in more training documents than this is ignored as common
    action: Literal["drop", "cut"] = "drop"
    window: int = Field(200, ge=0)  # cut: characters removed either side of a match
    max_cuts: int = Field(10, ge=1)  # cut: a document with more matches than this is dropped
    min_chars_left: int = Field(200, ge=0)  # cut: a document left shorter than this is dropped


class TaskReport(BaseModel):
    items: int
    items_found: int  # items any of whose uncommon n-grams is in a collected document, before removal
    documents_removed: int
    documents_cut: int
    common_ngrams_ignored: int
    numbers: Literal["kept", "normalised"]


class Decontaminated(BaseModel):
    result: StageResult
    report: Path  # decontamination.json
    found: Path  # found.jsonl: each item found, {"task", "text"}, what the evaluation scores apart as contaminated
    tasks: dict[str, TaskReport]


def read_items(path: Path) -> list[TaskItems]:
    """The items file an `EvalItems` stage wrote: one {"task", "text", "keep_numbers"} per line."""
    tasks: dict[str, TaskItems] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            task = tasks.setdefault(row["task"], TaskItems(row["task"], [], row.get("keep_numbers")))
            task.items.append(row["text"])
    return list(tasks.values())


def decontaminate(in_path: Path, out_dir: Path, tasks: list[TaskItems], cfg: DecontaminateConfig) -> Decontaminated:
    """Documents of `in_path` without the `tasks`' items: out_dir/docs.parquet, removed.parquet, decontamination.json."""
    index = ContaminationIndex(tasks, cfg.n)
    matches = DocumentMatches(index)
    for batch in iter_batches(in_path, columns=["text"]):
        matches.add(batch.column("text").to_pylist())
    common = matches.common(cfg.common_docs)
    removed = {t.name: 0 for t in index.tasks}
    cut_docs = dict(removed)
    found_keys: list[np.ndarray] = []
    row = 0
    with DataStep(STAGE, out_dir / "docs.parquet", out_dir / "removed.parquet") as step:
        for batch in iter_batches(in_path):
            table = as_documents(batch)
            step.read(table)
            texts = table.column("text").to_pylist()
            keep = np.ones(len(texts), bool)
            reasons, details = [], []
            for i, text in enumerate(texts):
                keys = matches.doc_keys.get(row + i)
                if keys is None or common[keys].all():
                    continue
                found_keys.append(keys[~common[keys]])
                verdict = judge(index, text, common, cfg.action, cfg.window, cfg.max_cuts, cfg.min_chars_left)
                if verdict.drop:
                    keep[i] = False
                    reasons.append(f"{REASON}:{verdict.task}")
                    details.append(verdict.detail[:200])
                    removed[verdict.task] += 1
                else:
                    texts[i] = cut(text, verdict.spans)
                    cut_docs[verdict.task] += 1
            row += len(texts)
            kept = table.filter(pa.array(keep))
            if cfg.action == "cut":
                kept = kept.set_column(kept.schema.get_field_index("text"), "text",
                                       pa.array([t for t, k in zip(texts, keep) if k], pa.string()))
            step.keep(kept)
            if not keep.all():
                step.remove(removed_from_documents(table.filter(pa.array(~keep)), STAGE, reasons, details))
    found_items = index.items_of(np.concatenate(found_keys)) if found_keys else np.empty(0, np.int64)
    item_task = np.asarray(index.item_task, np.int64)
    first = np.searchsorted(item_task, np.arange(len(index.tasks)))  # each task's first global item id
    reports = {}
    for ti, task in enumerate(index.tasks):
        reports[task.name] = TaskReport(
            items=len(task.items), items_found=int((item_task[found_items] == ti).sum()),
            documents_removed=removed[task.name], documents_cut=cut_docs[task.name],
            common_ngrams_ignored=int(common[index.task_keys(ti)].sum()),
            numbers="kept" if task.keep_numbers else "normalised")
    report = write_json_atomic(out_dir / REPORT_FILE, {
        "tasks": {k: v.model_dump() for k, v in reports.items()},
        "settings": cfg.model_dump(mode="json", exclude={"enabled", "files"}),
        "documents": matches.seen,
    })
    found = write_text_atomic(out_dir / FOUND_FILE, "".join(
        json.dumps({"task": index.tasks[item_task[i]].name, "text": index.tasks[item_task[i]].items[i - first[item_task[i]]]},
                   ensure_ascii=False) + "\n" for i in found_items))
    stats = {f"items_found:{k}": v.items_found for k, v in reports.items()}
    return Decontaminated(result=step.result(stats, {"tasks": {k: v.model_dump() for k, v in reports.items()}}),
                          report=report, found=found, tasks=reports)


class Decontaminate(Stage):
    """Documents holding an evaluation item removed or cut (config: DecontaminateConfig): work/data/decont/<key>/."""

    name, store, Config, Result = STAGE, "data/decont", DecontaminateConfig, Decontaminated
    inputs = ("docs", "items")

    def compute(self, inputs: dict, out_dir: Path) -> Decontaminated:
        return decontaminate(Path(inputs["docs"]), out_dir, read_items(Path(inputs["items"])), self.config)
