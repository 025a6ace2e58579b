"""The evaluation's items as text, for decontamination: the arithmetic questions, lm-evaluation-harness tasks and the
user's files, each item its question and gold answer joined.

`EvalItems` is a stage (work/eval/items/<key>/items.jsonl) keyed by what it reads: the arithmetic task's ranges, the
lm-eval task names and the content of the task folders and files, so the decontamination index is built once per set
of tasks. An lm-eval task's items are its evaluation documents (`eval_docs`: test, else validation): the text
`doc_to_text` gives and the gold answer `doc_to_target` names (for a multiple-choice task, the right choice; the
wrong ones are left out). Loading a task by name needs lm-eval's registry and, unless cached, the hub; a task of
the user's own YAML folders (`eval.task_paths`, `dataset_path: json` with `data_files`) needs neither.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra.config import ConfigError, StrictModel
from infra.stages import Stage
from infra.workspace.atomic import write_text_atomic
from tasks.data.contamination import TaskItems, keeps_numbers
from tasks.eval.arithmetic import ArithmeticTask, format_answer, problem_capacity

ARITHMETIC = "arithmetic"  # the built-in task's name in the funnel and the report
ITEMS_FILE = "items.jsonl"


class EvalItemsConfig(StrictModel):
    """Which evaluation items the training data is matched against."""

    arithmetic: ArithmeticTask | None = None  # the built-in questions: the whole "eval" split of its outer range
    tasks: list[str] = Field(default_factory=list)  # lm-eval task (or group) names
    task_paths: list[Path] = Field(default_factory=list)  # folders of lm-eval YAML tasks
    files: list[Path] = Field(default_factory=list)  # JSONL files of items: {"question", "answer"} or {"text"}

    @property
    def empty(self) -> bool:
        return self.arithmetic is None and not self.tasks and not self.files


class ItemsResult(BaseModel):
    items: Path  # items.jsonl: {"task", "text", "keep_numbers"} per line
    counts: dict[str, int]  # items per task


def arithmetic_items(task: ArithmeticTask) -> TaskItems:
    """Every question of the "eval" split of the outer range, with its sum as the answer (digits kept: the items
    differ only in their numbers)."""
    questions = task.questions(problem_capacity(task.outer_max_operand, task.ops, "eval"), seed=0)
    return TaskItems(ARITHMETIC, [arithmetic_item(p.question, p.answer) for p in questions], keep_numbers=True)


def arithmetic_item(question: str, answer: int) -> str:
    """An arithmetic question as decontamination matches it: the question and its right response."""
    return f"{question} {format_answer(answer)}"


def file_items(path: Path) -> TaskItems:
    """A user's JSONL file of items: `question` and `answer` joined, or `text`; its task is the file's stem."""
    items = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc.msg}); each line of a decontamination file is "
                                  '{"question": ..., "answer": ...} or {"text": ...}') from None
            if not isinstance(row, dict) or not ({"question", "text"} & set(row)):
                raise ConfigError(f'{path}:{number}: a decontamination item needs "question" (and "answer") or "text"')
            text = row["text"] if "text" in row else f"{row['question']} {row.get('answer', '')}"
            items.append(str(text))
    return TaskItems(path.stem, items)


def lm_eval_items(names: list[str], task_paths: list[Path]) -> Iterator[TaskItems]:
    """The items of lm-eval tasks by name: each leaf task's evaluation documents, question and gold answer joined."""
    for name, task in load_lm_eval_tasks(names, task_paths).items():
        yield TaskItems(name, [item_text(task, doc) for doc in task.eval_docs])


def item_text(task: Any, doc: dict) -> str:
    """An lm-eval task's item as decontamination matches it: the question `doc_to_text` gives and the gold answer
    (a multiple-choice task's right choice, never a wrong one), joined by a space."""
    question = task.doc_to_text(doc)
    target = task.doc_to_target(doc)
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(doc)
        golds = target if isinstance(target, list) else [target]
        target = " ".join(str(choices[g]) if isinstance(g, int) else str(g) for g in golds)
    return f"{question} {target}"


def load_lm_eval_tasks(names: list[str], task_paths: list[Path], registry: bool = True) -> dict:
    """lm-eval's leaf tasks for `names`: from the user's folders alone when they hold every name (quick), else with
    lm-eval's registry too (unless `registry` is False)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lm_eval.tasks import TaskManager  # heavy (4 s to import, 15 s to index the registry): only when asked

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    paths = [str(p) for p in task_paths]

    def unknown_to(manager: TaskManager) -> list[str]:
        known = set(manager.all_subtasks) | set(manager.all_groups) | set(manager.all_tags)
        return [n for n in names if n not in known]

    manager = TaskManager(include_path=paths, include_defaults=False) if paths else None
    if registry and (manager is None or unknown_to(manager)):
        manager = TaskManager(include_path=paths or None)
    unknown = names if manager is None else unknown_to(manager)
    if unknown:
        raise ConfigError(f"eval.tasks {unknown}: no such lm-eval task in its registry or in eval.task_paths "
                          f"{paths}; `lm-eval ls tasks` lists the registry's")
    return dict(manager.load(names)["tasks"])


def collect_items(cfg: EvalItemsConfig) -> list[TaskItems]:
    tasks = [arithmetic_items(cfg.arithmetic)] if cfg.arithmetic is not None else []
    if cfg.tasks:
        tasks += list(lm_eval_items(cfg.tasks, cfg.task_paths))
    tasks += [file_items(p) for p in cfg.files]
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"evaluation tasks named twice {twice}: rename a data.decontaminate.files entry")
    return tasks


def write_items(tasks: list[TaskItems], out_dir: Path) -> ItemsResult:
    lines = []
    for task in tasks:
        keep = task.keep_numbers if task.keep_numbers is not None else keeps_numbers(task.items)
        lines += [json.dumps({"task": task.name, "text": t, "keep_numbers": keep}, ensure_ascii=False) + "\n"
                  for t in task.items]
    path = write_text_atomic(out_dir / ITEMS_FILE, "".join(lines))
    return ItemsResult(items=path, counts={t.name: len(t.items) for t in tasks})


class EvalItems(Stage):
    """The evaluation's items as text (config: EvalItemsConfig): work/eval/items/<key>/items.jsonl."""

    name, store, Config, Result = "eval_items", "eval/items", EvalItemsConfig, ItemsResult
    inputs = ("sources",)  # the task folders and files: their content is part of the key

    def compute(self, inputs: dict, out_dir: Path) -> ItemsResult:
        return write_items(collect_items(self.config), out_dir)
