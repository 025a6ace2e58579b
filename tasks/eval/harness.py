"""lm-evaluation-harness tasks on one exported model: each task's metrics with lm-eval's standard error, and the
calibration of its answers.

`eval.tasks` names them: `arithmetic` is the pipeline's own questions as the shipped task
(tasks/eval/harness_tasks/llmforge_arithmetic.yaml, or its few-shot form for `eval.few_shot_models`), every other
name an lm-eval task from its registry or from the YAML folders of `eval.task_paths`. The model is the stage's
Hugging Face export, loaded by lm-eval's own `HFLM`, and asked with the chat template unless it is a few-shot model.

Calibration needs a confidence per item:
- a multiple-choice task's is the probability of the chosen option, the options' log-likelihoods normalised over
  the options (the choice is the likeliest, as lm-eval's `acc` takes it); right when it is the gold one;
- a generative task's is the probability the model gives its own greedy response and the stop that ends it (lm-eval's
  loglikelihood of both after the prompt), 0 for an abstention; right by the task's first 0/1 metric.
Each gets the ECE (equal mass), Brier and AURC with bootstrap intervals, and the reliability bins, as the
pipeline's answers do (tasks/eval/evaluate.py `scored_answers`).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, Field

from models.calibration import CalibrationReport, ReliabilityBins
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.config import EvalConfig
from tasks.eval.intervals import Proportion, proportion
from tasks.eval.items import ARITHMETIC, arithmetic_item, item_text
from tasks.eval.rewards import is_abstention
from tasks.eval.scored import scored_answers
from tasks.eval.selective import SelectiveReport

HARNESS_TASKS = Path(__file__).resolve().parent / "harness_tasks"
CHAT_TASK, FEW_SHOT_TASK = "llmforge_arithmetic", "llmforge_arithmetic_few_shot"


class ItemScore(BaseModel):
    """One item as the model answered it."""

    doc_id: int
    response: str  # a generative task's greedy response; a multiple-choice task's chosen option's index
    confidence: float | None = None
    correct: bool | None = None
    contaminated: bool = False  # the decontamination found it in the training data


class TaskScores(BaseModel):
    """One task's numbers on one model."""

    lm_eval_task: str  # the name lm-eval ran it under
    output_type: str  # multiple_choice, generate_until, loglikelihood, ...
    n: int  # items scored
    metrics: dict[str, float] = Field(default_factory=dict)  # lm-eval's, e.g. {"accuracy": 0.387}
    stderr: dict[str, float] = Field(default_factory=dict)  # lm-eval's standard error of each, where it gives one
    calibration: CalibrationReport | None = None  # None: no confidence per item (a task of another output type)
    bins: ReliabilityBins | None = None
    selective: SelectiveReport | None = None
    items: list[ItemScore] = Field(default_factory=list)
    # Where the decontamination found any of the task's items in the training data: the items right among the clean
    # and among the contaminated ones apart (GPT-3's clean/dirty split); None otherwise
    clean: Proportion | None = None
    contaminated: Proportion | None = None

    def flat(self) -> dict[str, float]:
        """Its numbers under one prefix each: `accuracy`, `accuracy_stderr`, `ece_equal_mass`, `brier`, `aurc`, ..."""
        out = dict(self.metrics) | {f"{k}_stderr": v for k, v in self.stderr.items()}
        for split in ("clean", "contaminated"):
            p = getattr(self, split)
            if p is not None:
                out |= {f"{split}.accuracy": p.accuracy, f"{split}.n": float(p.n)}
        for report in (self.calibration, self.selective):
            if report is not None:
                out |= {f"calibration.{k}": float(v) for k, v in report.model_dump().items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return out


def lm_eval_names(tasks: list[str], few_shot: bool) -> dict[str, str]:
    """Our name -> the name lm-eval runs: `arithmetic` as the shipped task (its few-shot form for a few-shot model)."""
    return {t: (FEW_SHOT_TASK if few_shot else CHAT_TASK) if t == ARITHMETIC else t for t in tasks}


def arithmetic_metadata(task: ArithmeticTask, cfg: EvalConfig) -> dict[str, Any]:
    """What the shipped task's `utils.questions` draws the evaluation's questions from."""
    return {**task.model_dump(), "n_questions": cfg.n_questions, "seed": cfg.seed, "few_shot": cfg.few_shot}


def read_found(path: Path) -> dict[str, set[str]]:
    """A decontamination's found.jsonl: per task, the texts of its items found in the training data."""
    found: dict[str, set[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            found.setdefault(row["task"], set()).add(row["text"])
    return found


def harness_scores(hf_dir: Path, tasks: list[str], task_paths: list[Path], cfg: EvalConfig, task: ArithmeticTask,
                   few_shot: bool, device: str = "cpu",
                   contaminated: dict[str, set[str]] | None = None) -> dict[str, TaskScores]:
    """Every task of `tasks` on the exported model in `hf_dir`, by our name; with `contaminated` (`read_found`), each
    task's items found in the training data scored apart."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lm_eval import simple_evaluate  # heavy (seconds to import): only when the evaluation runs tasks
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tasks.eval.items import load_lm_eval_tasks

    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.WARNING)
    names = lm_eval_names(tasks, few_shot)
    # The model loaded here and handed over: HFLM given a path builds an accelerate Accelerator, which joins the
    # process group that a DeepSpeed launch's environment (RANK, MASTER_PORT) describes, in a flow that launched one.
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).to(device).eval()
    lm = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(str(hf_dir)), batch_size=cfg.answer_batch_size)
    out: dict[str, TaskScores] = {}
    # The arithmetic task alone, with the evaluation's answer budget; the others with their own settings.
    groups = [([t for t in tasks if t == ARITHMETIC], {"max_gen_toks": cfg.max_new_tokens}),
              ([t for t in tasks if t != ARITHMETIC], None)]
    for ours, gen_kwargs in groups:
        if not ours:
            continue
        paths = [HARNESS_TASKS] if ours == [ARITHMETIC] else list(task_paths)
        registry = ours != [ARITHMETIC]
        manager = TaskManager(include_path=[str(p) for p in paths] or None, include_defaults=registry and bool(
            set(names[t] for t in ours) - _in_folders(paths, [names[t] for t in ours])),
            metadata=arithmetic_metadata(task, cfg))
        if registry:
            load_lm_eval_tasks([names[t] for t in ours], task_paths)  # a ConfigError naming an unknown task
        loaded = manager.load([names[t] for t in ours])["tasks"]
        results = simple_evaluate(model=lm, tasks=list(loaded.values()), task_manager=manager, log_samples=True,
                                  apply_chat_template=not few_shot, gen_kwargs=gen_kwargs,
                                  bootstrap_iters=cfg.bootstrap_resamples, random_seed=cfg.seed,
                                  numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed)
        for t in ours:
            out[t] = task_scores(names[t], results, lm, cfg)
            found = (contaminated or {}).get(t)
            if found:
                split_clean_and_contaminated(out[t], loaded[names[t]], results["samples"][names[t]], found)
    return out


def split_clean_and_contaminated(scores: TaskScores, task: Any, samples: list[dict], found: set[str]) -> None:
    """Mark the items whose text the decontamination found, and score the clean and the contaminated apart."""
    by_doc = {s["doc_id"]: s["doc"] for s in samples}
    for item in scores.items:
        doc = by_doc[item.doc_id]
        text = arithmetic_item(doc["question"], doc["answer"]) if scores.lm_eval_task in (CHAT_TASK, FEW_SHOT_TASK) \
            else item_text(task, doc)
        item.contaminated = text in found
    if any(i.contaminated for i in scores.items) and all(i.correct is not None for i in scores.items):
        scores.clean = proportion([i.correct for i in scores.items if not i.contaminated]) \
            if not all(i.contaminated for i in scores.items) else None
        scores.contaminated = proportion([i.correct for i in scores.items if i.contaminated])


def _in_folders(paths: list[Path], names: list[str]) -> set[str]:
    """Which of `names` the YAML folders define (a cheap look: their `task:` lines)."""
    found = set()
    for folder in paths:
        for yaml_file in Path(folder).rglob("*.yaml"):
            for line in yaml_file.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("task:"):
                    found.add(line.split(":", 1)[1].strip().strip("'\""))
    return found & set(names)


def task_scores(name: str, results: dict, lm: Any, cfg: EvalConfig) -> TaskScores:
    """One task's metrics (lm-eval's, with their standard errors) and its items' calibration."""
    numbers = results["results"][name]
    metrics, stderr = {}, {}
    for key, value in numbers.items():
        metric, _, _ = key.partition(",")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key in ("alias", "sample_len"):
            continue
        if metric.endswith("_stderr"):
            if math.isfinite(value):
                stderr[metric[: -len("_stderr")]] = float(value)
        else:
            metrics[metric] = float(value)
    samples = sorted(results["samples"][name], key=lambda s: s["doc_id"])
    output_type = results["configs"][name]["output_type"]
    confidence, correct = item_confidences(samples, output_type, lm, list(metrics))
    items = [ItemScore(doc_id=s["doc_id"], response=_response(s, output_type),
                       confidence=None if confidence is None else confidence[i],
                       correct=None if correct is None else correct[i]) for i, s in enumerate(samples)]
    scores = TaskScores(lm_eval_task=name, output_type=output_type, n=len(samples), metrics=metrics, stderr=stderr,
                        items=items)
    if confidence is not None and len(confidence):
        scores.calibration, scores.bins, scores.selective = scored_answers(confidence, correct, cfg)
    return scores


def _response(sample: dict, output_type: str) -> str:
    if output_type == "multiple_choice":
        return str(int(np.argmax([float(r[0]) for r in sample["filtered_resps"]])))
    return _first(sample["filtered_resps"])


def item_confidences(samples: list[dict], output_type: str, lm: Any,
                     metric_names: list[str]) -> tuple[list[float] | None, list[bool] | None]:
    """Each item's confidence and whether it is right (None, None for an output type without one)."""
    if output_type == "multiple_choice":
        conf, right = [], []
        for s in samples:
            logliks = np.array([float(r[0]) for r in s["filtered_resps"]])
            p = np.exp(logliks - logliks.max())
            p /= p.sum()
            chosen = int(np.argmax(logliks))
            gold = s["target"]
            golds = set(gold) if isinstance(gold, list) else {int(gold)}
            conf.append(float(p[chosen]))
            right.append(chosen in golds)
        return conf, right
    if output_type == "generate_until":
        binary = next((m for m in metric_names if all(float(s.get(m, -1)) in (0.0, 1.0) for s in samples)), None)
        if binary is None:
            return None, None
        from lm_eval.api.instance import Instance

        responses = [_first(s["filtered_resps"]) for s in samples]
        # The response and the stop that ends it (the first `until`: <|end|> for the chat, as the pipeline counts it).
        requests = [Instance(request_type="loglikelihood", doc=s["doc"], idx=0,
                             arguments=(s["arguments"][0][0], r + (s["arguments"][0][1].get("until") or [""])[0]))
                    for s, r in zip(samples, responses)]
        logliks = [ll for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)]
        conf = [0.0 if is_abstention(r) else float(math.exp(ll)) for r, ll in zip(responses, logliks)]
        return conf, [float(s[binary]) >= 1.0 for s in samples]
    return None, None


def _first(resps: Any) -> str:
    while isinstance(resps, (list, tuple)):
        resps = resps[0]
    return str(resps)
