"""GSM8K-style word problems (Cobbe et al. 2021): a question, and a worked solution that ends in `#### <answer>`.

    problems = load_problems(Gsm8kSource(), split="train", n=1000, seed=0)   # datasets.load_dataset, cached

The `gsm8k_exact` reward (tasks/eval/rewards.py) scores a completion by the final answer it states,
against `Gsm8kProblem.answer`. The source is the hub's `openai/gsm8k` unless it names another dataset
or a local folder holding a copy of one (`huggingface-cli download openai/gsm8k --repo-type dataset
--local-dir DIR`, then `name: DIR`): nothing is downloaded when the copy or the `datasets` cache has it.
"""
from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.config import StrictModel
from tasks.eval.rewards import GSM8K_MARK, reference_number

# `datasets` (seconds to import) is imported only when GSM8K problems are loaded.


@dataclass(frozen=True)
class Gsm8kProblem:
    """One word problem: the question, its final answer as a plain number ("1000", "-3", "2.5") and the solution."""

    question: str
    answer: str
    solution: str = ""


class Gsm8kSource(StrictModel):
    """Where the problems come from: `datasets.load_dataset(name, config, split=..., revision=...)`."""

    name: str = "openai/gsm8k"  # a hub name, or a local folder holding a copy of the dataset repository
    config: str | None = "main"
    train_split: str = "train"
    eval_split: str = "test"  # held out: GRPO scores itself on it and never trains on it
    question_field: str = "question"
    answer_field: str = "answer"  # the worked solution ending in "#### <answer>", or the bare answer
    revision: str | None = None


def problems_from_records(records: Iterable[Mapping[str, Any]], question_field: str = "question",
                          answer_field: str = "answer") -> tuple[list[Gsm8kProblem], int]:
    """The records that hold a question and a final answer, as problems; and how many did not."""
    problems, skipped = [], 0
    for rec in records:
        question, solution = rec.get(question_field), rec.get(answer_field)
        answer = reference_number(solution) if isinstance(solution, str) else None
        if not isinstance(question, str) or not question.strip() or answer is None:
            skipped += 1
            continue
        problems.append(Gsm8kProblem(question.strip(), format(answer, "f"),
                                     solution if GSM8K_MARK in solution else ""))
    return problems, skipped


def load_problems(source: Gsm8kSource, split: str, n: int, seed: int = 0) -> list[Gsm8kProblem]:
    """`n` problems of `split`, in an order drawn from `seed`; an error when the split holds fewer."""
    import datasets

    records = datasets.load_dataset(source.name, source.config, split=split, revision=source.revision)
    missing = [f for f in (source.question_field, source.answer_field) if f not in records.column_names]
    if missing:
        raise ValueError(f"{source.name} ({split}) has no column(s) {missing} (columns: {records.column_names}); "
                         "set gsm8k.question_field / gsm8k.answer_field")
    problems, skipped = problems_from_records(records, source.question_field, source.answer_field)
    if n > len(problems):
        raise ValueError(f"{n} problems asked of {source.name} ({split}), which holds {len(problems)} with a final "
                         f"answer ({skipped} without); ask for at most {len(problems)}")
    order = list(range(len(problems)))
    random.Random(seed).shuffle(order)
    return [problems[i] for i in order[:n]]
