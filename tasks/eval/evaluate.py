"""Evaluation stage: validation loss, perplexity and bits per byte, and how well calibrated the model is.

Two levels:
- tokens (tasks/eval/tokens.py): every next-token prediction on the validation split (up to
  `max_tokens`), scored by loss, perplexity and, with a tokenizer, bits per byte (comparable
  across tokenizers), with bootstrap intervals over the windows; top-1 accuracy and the
  calibration of its top-1 confidence, before and after a fitted temperature;
- answers (when a tokenizer and arithmetic problems are given): one greedy answer per
  question through the chat template, correct by the `arithmetic_exact` reward, with
  confidence = the model's probability of that whole response, i.e. the product of the
  token probabilities of every generated token up to and including `<|end|>`. The
  product (not the geometric mean) is a real probability of the output, so it can be
  calibrated against accuracy; the geometric mean is kept per answer for inspection.
  A model that never saw the chat template (`few_shot_models`, the base) is asked with a
  few-shot completion prompt instead; one that states no parseable answer at all gets no
  answer metrics (n/a), never a 0.000 that would read as perfect calibration;
- multiple choice (tasks/eval/choices.py): the same questions as 4 options scored by their
  likelihood, which every model can answer, so every stage has a comparable row.

Answers are independent questions, so each accuracy comes with a Wilson 95% interval and
each ECE with a bootstrap one (tasks/eval/intervals.py); consecutive models (base -> SFT ->
GRPO) are compared by a paired interval on the same questions (tasks/eval/differences.py);
the accuracy-coverage curve, AURC and the threshold reaching `target_accuracy` say what the
confidence is worth for answering selectively (tasks/eval/selective.py).

This module computes and writes numbers (eval.json); tasks/reports/eval.py renders them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch
from pydantic import BaseModel, Field

from infra.stages import Stage
from infra.workspace.atomic import write_text_atomic
from infra.workspace.record import sha256_file
from models.bpb import token_bytes
from models.calibration import CalibrationReport, ReliabilityBins
from models.export import CONFIG, HF_DIR, WEIGHTS, export_hf_llama, load_model
from models.llama import Transformer
from tasks.eval.abstention import AbstentionReport, abstention_report
from tasks.eval.answers import greedy_answers
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.choices import ChoiceRecord, choice_records
from tasks.eval.config import EvalConfig
from tasks.eval.harness import TaskScores, harness_scores, read_found
from tasks.eval.items import ARITHMETIC
from tasks.eval.intervals import Proportion, proportion
from tasks.eval.progress import EvalProgress, Tracker
from tasks.eval.rewards import get_reward, is_abstention, parse_answer, parse_integer
from tasks.eval.scored import scored_answers
from tasks.eval.selective import SelectiveReport
from tasks.eval.tokens import token_metrics
from tasks.tokenizer.tokenize_shards import load_token_split
from tasks.tokenizer.train import TOKENIZER_FILE, load_tokenizer, tokenizer_json

EVAL_FILE = "eval.json"


class AnswerRecord(BaseModel):
    """One question, the model's greedy response and how it was scored."""

    question: str
    expected: int
    response: str
    correct: bool
    abstained: bool = False  # the response says "I don't know" (tasks/eval/rewards.ABSTENTION)
    # The probability the model gives the answer it states: the product of the response's token
    # probabilities; 0 for an abstention, which states no answer (tasks/eval/abstention.py).
    confidence: float
    response_probability: float | None = None  # the product itself, abstention or not
    mean_token_prob: float  # geometric mean of the response's token probabilities
    n_tokens: int
    finished: bool  # ended with <|end|> (the few-shot prompt: a newline) within max_new_tokens
    parsed: int | None = None  # the integer the response states; None: it states none
    in_train_range: bool | None = None  # operands within the task's trained range; None: no outer range asked


class EvaluatedModel(BaseModel):
    """Which model an eval.json is about: its stage, its folder and the sha256 of its weights."""

    stage: str  # the name the evaluation gave it: base, sft, grpo
    model_dir: str
    weights_sha256: str  # of model_dir/model.safetensors: the same folder name never hides other weights


class EvalResult(BaseModel):
    """Every number of one model's evaluation; `metrics()` flattens it for MLflow."""

    model: EvaluatedModel | None = None  # set by evaluate_checkpoint

    n_tokens: int
    seq_len: int
    val_loss: float
    perplexity: float
    # Bootstrap 95% interval over the windows; None: fewer than 2 windows.
    perplexity_lo: float | None = None
    perplexity_hi: float | None = None
    # Bits per byte of the same predictions (special tokens excluded); None: no tokenizer to count bytes with.
    bpb: float | None = None
    bpb_lo: float | None = None
    bpb_hi: float | None = None
    n_bytes: int | None = None  # UTF-8 bytes of the predicted text
    token_accuracy: float
    token_calibration: CalibrationReport
    token_bins: ReliabilityBins
    answer_format: Literal["chat", "few_shot"] = "chat"
    # None (n/a) when no question was asked, or when no response stated a parseable answer.
    answer_calibration: CalibrationReport | None = None
    answer_bins: ReliabilityBins | None = None
    answer_selective: SelectiveReport | None = None
    answer_in_range: Proportion | None = None  # on the questions within the arithmetic task's trained range
    answer_abstention: AbstentionReport | None = None  # accuracy, abstention, hallucination, answered accuracy
    answers: list[AnswerRecord] = Field(default_factory=list)
    choice_calibration: CalibrationReport | None = None
    choice_bins: ReliabilityBins | None = None
    choice_selective: SelectiveReport | None = None
    choices: list[ChoiceRecord] = Field(default_factory=list)
    # eval.tasks through lm-evaluation-harness on the model's export (tasks/eval/harness.py), by name
    tasks: dict[str, TaskScores] = Field(default_factory=dict)

    @property
    def n_stated(self) -> int:
        """Responses that state a parseable number (an abstention states none)."""
        return sum(a.parsed is not None for a in self.answers)

    @property
    def n_abstained(self) -> int:
        return sum(a.abstained for a in self.answers)

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics (e.g. `token.ece`, `answer.accuracy`, `answer.accuracy_lo`), skipping ones not computed."""
        # `val_ppl` as the training runs name it; the accuracy comes as `token.accuracy` below.
        out = {
            "val_loss": self.val_loss,
            "val_ppl": self.perplexity,
            "n_tokens": float(self.n_tokens),
        }
        optional = {key: getattr(self, field) for key, field in _OPTIONAL.items()}
        out.update({k: float(v) for k, v in optional.items() if v is not None})
        for prefix, field in _SECTIONS:
            report = getattr(self, field)
            if report is None:
                continue
            for key, value in report.model_dump().items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[f"{prefix}.{key}"] = float(value)
        if self.answer_abstention is not None:
            out.update({f"answer.{k}": v for k, v in self.answer_abstention.metrics().items() if k != "accuracy"
                        and not k.startswith("accuracy_")})  # answer.accuracy is the calibration report's
        if self.answers:
            out["answer.n_stated"] = float(self.n_stated)
        for name, scores in self.tasks.items():
            out.update({f"{name}.{k}": v for k, v in scores.flat().items()})
        return out


# What `EvalResult.metrics()` flattens besides val_loss, val_ppl and n_tokens: optional keys (key -> field), and
# reports whose numeric fields go under a prefix (prefix, field). `metric_names` reads the same tables.
_OPTIONAL = {"val_ppl_lo": "perplexity_lo", "val_ppl_hi": "perplexity_hi", "bpb": "bpb", "bpb_lo": "bpb_lo",
             "bpb_hi": "bpb_hi", "n_bytes": "n_bytes"}
_SECTIONS = (("token", "token_calibration"), ("answer", "answer_calibration"), ("answer", "answer_selective"),
             ("answer_in_range", "answer_in_range"), ("choice", "choice_calibration"), ("choice", "choice_selective"))


def metric_names() -> set[str]:
    """Every key `EvalResult.metrics()` can hold (where the evaluation computes it): what `llmforge ablate`'s
    `metrics` may name, after the model's label (`grpo.answer.accuracy`)."""
    names = {"val_loss", "val_ppl", "n_tokens", "answer.n_stated", *_OPTIONAL}
    for prefix, field in _SECTIONS:
        annotation = EvalResult.model_fields[field].annotation  # `Report | None`, or the report class itself
        report = next(a for a in get_args(annotation) or (annotation,) if a is not type(None))
        names |= {f"{prefix}.{k}" for k, f in report.model_fields.items()
                  if f.annotation in (int, float, float | None, int | None)}
    return names | {f"answer.{k}" for k in AbstentionReport.metric_keys()}


# ----------------------------------------------------------------------------- answer level


def few_shot_examples(cfg: EvalConfig, task: ArithmeticTask) -> list:
    """The worked examples of the few-shot prompt: from the "sft" split of the trained range, so never an eval question."""
    return task.problems(cfg.few_shot, cfg.seed, split="sft")


def answer_records(model: Transformer, tokenizer, problems: Sequence, cfg: EvalConfig,
                   shots: Sequence | None = None, progress: Tracker | None = None) -> list[AnswerRecord]:
    """Greedy response to each problem via the chat template, scored by `cfg.reward`; with `shots`, via the
    few-shot completion prompt, scored by `integer_exact`."""
    reward = get_reward(cfg.reward if shots is None else "integer_exact")
    parse = parse_answer if shots is None else parse_integer
    records = []
    for a in greedy_answers(model, tokenizer, problems, cfg.max_new_tokens, cfg.answer_batch_size, shots, progress):
        abstained = shots is None and is_abstention(a.text)  # the few-shot prompt has no way to abstain
        probability = float(math.exp(a.logprob))
        records.append(AnswerRecord(
            question=a.problem.question,
            expected=int(a.problem.answer),
            response=a.text,
            correct=not abstained and reward(a.text, a.problem) >= 1.0,
            abstained=abstained,
            confidence=0.0 if abstained else probability,
            response_probability=probability,
            mean_token_prob=float(math.exp(a.logprob / max(a.n_tokens, 1))),
            n_tokens=a.n_tokens,
            finished=a.finished,
            parsed=parse(a.text),
        ))
    return records


def answer_metrics(model: Transformer, tokenizer, problems: Sequence, cfg: EvalConfig, task: ArithmeticTask,
                   few_shot: bool = False, progress: EvalProgress | None = None) -> dict:
    """The answer-level and multiple-choice fields of an EvalResult; with an outer range, the trained range's too."""
    shots = few_shot_examples(cfg, task) if few_shot else None
    answers = answer_records(model, tokenizer, problems, cfg, shots, progress.part("answers") if progress else None)
    if task.has_outer_range:
        answers = [a.model_copy(update={"in_train_range": task.in_range(a.question)}) for a in answers]
    out: dict = {"answer_format": "few_shot" if few_shot else "chat", "answers": answers}
    if any(a.parsed is not None or a.abstained for a in answers):  # else n/a: a model that gave no answer has no accuracy to calibrate
        conf, correct = [a.confidence for a in answers], [a.correct for a in answers]
        out["answer_calibration"], out["answer_bins"], out["answer_selective"] = scored_answers(conf, correct, cfg)
        inside = [a.correct for a in answers if a.in_train_range]
        out["answer_in_range"] = proportion(inside) if inside else None
        out["answer_abstention"] = abstention_report(correct, [a.abstained for a in answers])
    if cfg.multiple_choice:
        choices = choice_records(model, tokenizer, problems, shots, cfg.answer_batch_size,
                                 progress=progress.part("choices") if progress else None)
        out["choices"] = choices
        conf, correct = [c.confidence for c in choices], [c.correct for c in choices]
        out["choice_calibration"], out["choice_bins"], out["choice_selective"] = scored_answers(conf, correct, cfg)
    return out


# ----------------------------------------------------------------------------- stage


def evaluate_model(
    model: Transformer,
    val_tokens: np.ndarray,
    tokenizer=None,
    problems: Sequence | None = None,
    cfg: EvalConfig | None = None,
    few_shot: bool = False,
    label: str | None = None,
    task: ArithmeticTask | None = None,
) -> EvalResult:
    """Token-level metrics on `val_tokens` (bits per byte with a tokenizer), plus answer-level metrics when
    tokenizer and problems are given (asked with the few-shot completion prompt when `few_shot`, else the chat template).
    With `label` (the model's name), progress lines with an ETA say how far it is. `task`: the problems' arithmetic
    task (its trained range and few-shot examples; default ArithmeticTask())."""
    cfg, task = cfg or EvalConfig(), task or ArithmeticTask()
    asks = tokenizer is not None and bool(problems)
    parts = ["tokens"] + (["answers"] + (["choices"] if cfg.multiple_choice else []) if asks else [])
    progress = EvalProgress(label, parts) if label is not None else None
    fields = token_metrics(model, val_tokens, cfg, token_bytes(tokenizer) if tokenizer is not None else None,
                           progress.part("tokens") if progress else None)
    if asks:
        fields.update(answer_metrics(model, tokenizer, problems, cfg, task, few_shot, progress))
    if progress is not None:
        progress.done()
    return EvalResult(**fields)


def hf_export(model: Transformer, model_dir: Path, out_dir: Path, tokenizer_path: Path) -> Path:
    """The model's transformers export: the one its training stage wrote beside it (export_hf, from the same weights,
    in the same verified folder), else one written into out_dir."""
    beside = model_dir.parent / HF_DIR
    if (beside / CONFIG).is_file() and (beside / TOKENIZER_FILE).is_file():
        return beside
    return export_hf_llama(model, out_dir / HF_DIR, tokenizer_json(tokenizer_path))


def _pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def evaluate_checkpoint(
    model_dir: Path,
    tokens_dir: Path,
    tokenizer_path: Path | None,
    cfg: EvalConfig,
    out_dir: Path,
    name: str | None = None,
    task: ArithmeticTask | None = None,
    contaminated: Path | None = None,
) -> EvalResult:
    """Evaluate a saved model (safetensors + config.json) on the val split, the arithmetic task's questions and
    eval.tasks; write eval.json (its reliability diagrams are the report's: tasks/reports/eval.write_reliability_diagrams).
    `contaminated`: a found.jsonl of the decontamination, whose items each task scores apart from the clean ones."""
    task = task or ArithmeticTask()
    model = load_model(Path(model_dir), map_location=_pick_device(cfg.device))
    val = load_token_split(Path(tokens_dir), "val")
    tokenizer = load_tokenizer(Path(tokenizer_path)) if tokenizer_path is not None else None
    problems = None
    if tokenizer is not None and cfg.n_questions > 0:
        problems = task.questions(cfg.n_questions, cfg.seed)
    label = name or Path(model_dir).name
    result = evaluate_model(model, val, tokenizer, problems, cfg, few_shot=label in cfg.few_shot_models, label=label,
                            task=task)
    tasks = [t for t in cfg.tasks if t != ARITHMETIC or (problems and tokenizer is not None)]
    if tasks and tokenizer_path is not None:  # lm-eval reads the model as transformers does: its export
        hf = hf_export(model, Path(model_dir), Path(out_dir), Path(tokenizer_path))
        result.tasks = harness_scores(hf, tasks, cfg.task_paths, cfg, task, few_shot=label in cfg.few_shot_models,
                                      device=str(next(model.parameters()).device),
                                      contaminated=read_found(contaminated) if contaminated else None)
        print(f"evaluate {label}: " + "; ".join(f"{n} " + ", ".join(f"{k} {v:.4f}" for k, v in s.metrics.items())
                                               for n, s in result.tasks.items()))
    result.model = EvaluatedModel(stage=label, model_dir=str(model_dir),
                                  weights_sha256=sha256_file(Path(model_dir) / WEIGHTS))
    write_text_atomic(Path(out_dir) / EVAL_FILE, result.model_dump_json(indent=2))
    return result


class Evaluate(Stage):
    """One model's calibration and answers on the validation tokens and the arithmetic task's questions:
    work/eval/<key>/eval.json. `label` names the model (base, sft, grpo): the few-shot prompt depends on it."""

    name, store, Config, Result = "evaluate", "eval", EvalConfig, EvalResult
    inputs = ("model", "tokens", "tokenizer", "label", "task", "contaminated")
    run_name = "evaluate-{inputs[label]}"

    def compute(self, inputs: dict, out_dir: Path) -> EvalResult:
        return evaluate_checkpoint(inputs["model"], inputs["tokens"], inputs["tokenizer"], self.config, out_dir,
                                   inputs["label"], inputs["task"], inputs["contaminated"])
