"""The evaluation's questions are never trained on: the split proven on the preset `make run` uses."""
from __future__ import annotations

from flows.config import load_pipeline_config
from tasks.eval.arithmetic import assign_split, parse_question, space_size
from tasks.eval.evaluate import few_shot_examples
from tasks.eval.rewards import ABSTENTION
from tasks.training.grpo.stage import grpo_problems
from tasks.training.sft.data import load_sft_examples
from tasks.training.sft.stage import is_held_out, sft_sources


def _eval_questions(cfg) -> list[str]:
    return [p.question for p in cfg.arithmetic.questions(cfg.eval.n_questions, cfg.eval.seed)]


def test_tiny_preset_evaluates_at_least_500_questions_never_trained_on() -> None:
    cfg = load_pipeline_config("tiny")
    held_out = _eval_questions(cfg)
    assert len(held_out) >= 500 and len(set(held_out)) == len(held_out)

    examples, _ = load_sft_examples(sft_sources(cfg.sft.data), task=cfg.arithmetic)
    sft_questions = {ex.instruction for ex in examples}
    # SFT's validation loss rests on at least 50 held-out examples, some of them abstentions (issue 28).
    val = [ex for ex in examples if is_held_out(ex, cfg.sft.data.val_fraction)]
    assert len(val) >= 50 and any(ex.response == ABSTENTION for ex in val)
    g = cfg.grpo
    grpo_questions = {p.question for p in grpo_problems(g, cfg.arithmetic)[0]}  # with those of the abstention range
    shots = {p.question for p in few_shot_examples(cfg.eval, cfg.arithmetic)}
    assert sft_questions and grpo_questions and len(shots) == cfg.eval.few_shot
    assert not set(held_out) & sft_questions
    assert not set(held_out) & grpo_questions
    assert not set(held_out) & shots  # the few-shot prompt's worked examples are never asked

    # Not a property of these seeds: every question has one split, whatever range or seed asks for it.
    task = cfg.arithmetic
    wide = [f"What is {a} {op} {b}?" for a in range(task.outer_max_operand + 1)
            for b in range(task.outer_max_operand + 1) for op in task.ops]
    assert len(wide) == space_size(task.outer_max_operand, task.ops)
    assert set(held_out) <= {q for q in wide if assign_split(q) == "eval"}
    assert all(assign_split(q) != "eval" for q in sft_questions | grpo_questions | shots)


def test_the_questions_in_the_training_range_are_the_ones_grpo_scores_itself_on() -> None:
    cfg = load_pipeline_config("tiny")
    task = cfg.arithmetic
    inside = {q for q in _eval_questions(cfg) if task.in_range(q)}
    grpo_heldout = {p.question for p in grpo_problems(cfg.grpo, task)[1]}
    assert inside == grpo_heldout
    assert len(inside) >= 200  # enough to tell a GRPO gain of a few points from noise (issue 28)
    assert all(max(parse_question(q)[0], parse_question(q)[2]) <= task.max_operand for q in inside)
