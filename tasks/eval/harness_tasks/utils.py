"""The arithmetic task's questions and scoring for lm-evaluation-harness: the same questions, prompts and rewards as
the pipeline's own evaluation (tasks/eval/evaluate.py), so both give the same accuracy."""
from __future__ import annotations

from typing import Any

import datasets

from tasks.eval.arithmetic import ArithmeticProblem, ArithmeticTask, few_shot_prompt
from tasks.eval.rewards import get_reward, is_abstention

TASK_KEYS = ("ops", "max_operand", "abstain_max_operand", "outer_max_operand")


def questions(**metadata: Any) -> datasets.DatasetDict:
    """The evaluation's questions: `n_questions` of the "eval" split of the outer range at `seed`, each with its chat
    question, its few-shot prompt (`few_shot` worked examples from the "sft" split) and its right responses."""
    task = ArithmeticTask(**{k: metadata[k] for k in TASK_KEYS if metadata.get(k) is not None})
    seed = int(metadata.get("seed", 0))
    shots = task.problems(int(metadata.get("few_shot", 3)), seed, split="sft")
    rows = [{"question": p.question, "answer": p.answer, "response": p.response,
             "few_shot_prompt": few_shot_prompt(p, shots), "few_shot_response": str(p.answer),
             "in_range": task.in_range(p.question)}
            for p in task.questions(int(metadata.get("n_questions", 100)), seed)]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def _problem(doc: dict) -> ArithmeticProblem:
    return ArithmeticProblem(question=doc["question"], answer=int(doc["answer"]))


def score_chat(doc: dict, results: list[str]) -> dict[str, float]:
    """Right when the response is no abstention and earns the pipeline's accuracy reward (`arithmetic_exact`)."""
    text = results[0]
    abstained = is_abstention(text)
    right = not abstained and get_reward("arithmetic_exact")(text, _problem(doc)) >= 1.0
    return {"accuracy": float(right), "abstained": float(abstained)}


def score_few_shot(doc: dict, results: list[str]) -> dict[str, float]:
    """Right when the first line states the sum (`integer_exact`), as the pipeline scores a few-shot answer."""
    return {"accuracy": float(get_reward("integer_exact")(results[0].split("\n", 1)[0], _problem(doc)) >= 1.0)}
