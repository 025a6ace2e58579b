"""The base model's few-shot prompt, the multiple-choice task, and the comparison with intervals."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.chat_template import encode_prompt, encode_text, special_ids
from tasks.eval.answers import greedy_answers
from tasks.eval.arithmetic import ArithmeticProblem, few_shot_prompt, make_problems, parse_question
from tasks.eval.choices import choice_records, options_for, sequence_logprobs
from tasks.eval.differences import difference_metrics, stage_differences
from tasks.eval.rewards import integer_exact, parse_integer
from tasks.reports.eval import comparison_table, differences_table, selective_table
from tests.conftest import eval_result_with_answers, tiny_llama
from tests.helpers.arithmetic_answers import Parrot, tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_few_shot_prompt_and_its_answer() -> None:
    shots = [ArithmeticProblem("What is 3 + 4?", 7), ArithmeticProblem("What is 12 + 5?", 17)]
    problem = ArithmeticProblem("What is 21 + 30?", 51)
    assert few_shot_prompt(problem, shots) == "3 + 4 = 7\n12 + 5 = 17\n21 + 30 ="
    assert parse_question("What is 21 - 30?") == (21, "-", 30)
    with pytest.raises(ValueError, match="What is a op b"):
        parse_question("What is love?")
    assert parse_integer(" 51") == 51 and parse_integer(" 51 apples") is None and parse_integer("") is None
    assert integer_exact(" 51", problem) == 1.0 and integer_exact("<answer>51</answer>", problem) == 0.0


def test_few_shot_answer_is_the_first_line_and_its_confidence_the_line_s_probability() -> None:
    tok = tokenizer()
    vocab = tok.get_vocab_size()
    shots = make_problems(3, 1, split="sft")
    problem = make_problems(1, 7, split="eval")[0]
    line = encode_text(tok, f" {problem.answer}\n")
    parrot = Parrot(vocab, [*line, *encode_text(tok, "7 + 1 = 8\n")])  # carries on with another line
    (answer,) = greedy_answers(parrot, tok, [problem], max_new_tokens=12, batch_size=4, shots=shots)
    assert answer.text == f" {problem.answer}" and answer.finished
    assert answer.completion_ids == line  # cut after the newline: the next line is not part of the answer
    p = math.exp(3.0) / (math.exp(3.0) + vocab - 1)
    assert math.exp(answer.logprob) == pytest.approx(p ** len(line), rel=1e-6)
    # No newline within the budget: unfinished, and the text is what was said.
    rambler = Parrot(vocab, encode_text(tok, " 12"))
    (cut,) = greedy_answers(rambler, tok, [problem], max_new_tokens=5, batch_size=1, shots=shots)
    assert not cut.finished and cut.n_tokens == 5 and cut.text.startswith(" 12")


def test_multiple_choice_options_and_likelihoods() -> None:
    problem = ArithmeticProblem("What is 3 + 4?", 7)
    opts = options_for(problem)
    assert len(set(opts)) == 4 and 7 in opts and min(opts) >= 0 and opts == options_for(problem)
    assert set(opts) - {7} <= {5, 6, 8, 9, 17}
    assert set(options_for(ArithmeticProblem("What is 0 + 0?", 0))) <= {0, 1, 2, 10}

    tok = tokenizer()
    model = tiny_llama(vocab=tok.get_vocab_size(), seed=4)
    problems = make_problems(5, 3, split="eval")
    prompts = [encode_prompt(tok, p.question) for p in problems]
    conts = [encode_text(tok, f"<answer>{p.answer}</answer>") + [special_ids(tok).end_turn] for p in problems]
    got = sequence_logprobs(model, prompts, conts, pad_id=special_ids(tok).pad, batch_size=2)
    with torch.no_grad():
        for k, (prompt, cont) in enumerate(zip(prompts, conts)):
            logp = torch.log_softmax(model(torch.tensor([prompt + cont[:-1]]))[0].float(), -1)
            want = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont))
            assert got[k] == pytest.approx(want, rel=1e-5)

    records = choice_records(model, tok, problems, batch_size=3)
    for r, p in zip(records, problems):
        assert r.expected == p.answer and sum(r.probs) == pytest.approx(1.0) and r.confidence == max(r.probs)
        assert r.correct == (r.chosen == p.answer)
    few = choice_records(model, tok, problems, shots=make_problems(2, 0, split="sft"), batch_size=8)
    assert [r.options for r in few] == [r.options for r in records] and few[0].probs != records[0].probs


def test_comparison_reports_intervals_differences_and_selective_prediction() -> None:
    rng = np.random.default_rng(0)
    questions = [f"What is {i} + 1?" for i in range(600)]
    skill = rng.uniform(size=600)
    sft = rng.uniform(size=600) < skill
    grpo = sft.copy()
    flip = rng.choice(600, 20, replace=False)
    grpo[flip] = ~grpo[flip]  # a few answers change hands: noise, not a gain
    conf_sft = np.clip(skill + rng.normal(0, 0.1, 600), 0.01, 0.99)
    base_questions = questions[::-1]  # same questions, another order: paired by question, not position
    results = {
        "base": eval_result_with_answers(base_questions, np.zeros(600, bool), np.full(600, 0.05), "few_shot"),
        "sft": eval_result_with_answers(questions, sft, conf_sft),
        "grpo": eval_result_with_answers(questions, grpo, conf_sft),
    }
    m = results["sft"].metrics()
    assert m["answer.accuracy_lo"] < m["answer.accuracy"] < m["answer.accuracy_hi"]
    # Near-calibrated answers: the resamples' ECE sits above the estimate (see bootstrap_ece_interval).
    assert m["answer.ece"] < m["answer.ece_hi"] and m["answer.ece_lo"] < m["answer.ece_hi"] < 0.1
    assert m["answer.ece_equal_mass_lo"] < m["answer.ece_equal_mass_hi"] < 0.1
    assert {"answer.aurc", "answer.e_aurc", "answer.threshold_at_target", "answer.coverage_at_target"} <= set(m)
    assert results["sft"].answer_bins.strategy == "quantile"  # answers: equal-mass bins by default
    assert max(results["sft"].answer_bins.counts) - min(results["sft"].answer_bins.counts) <= 1

    diffs = stage_differences(results)
    assert set(diffs) == {"sft_vs_base.answer", "grpo_vs_sft.answer"}
    assert diffs["sft_vs_base.answer"].significant and diffs["sft_vs_base.answer"].difference == pytest.approx(sft.mean())
    assert not diffs["grpo_vs_sft.answer"].significant
    metrics = difference_metrics(results)
    d = diffs["grpo_vs_sft.answer"]
    assert metrics["grpo_vs_sft.answer.accuracy_diff"] == d.difference
    assert (metrics["grpo_vs_sft.answer.accuracy_diff_lo"], metrics["grpo_vs_sft.answer.accuracy_diff_hi"]) == (d.lo, d.hi)

    table = differences_table(results)
    assert "| grpo − sft | " in table and "not significant" in table and "| sft − base | +" in table
    assert "| multiple choice |" in table.splitlines()[0]
    assert table.count("n/a") == 4  # neither multiple choice nor a training range here
    sel = selective_table(results)
    assert "threshold for accuracy ≥ 0.80" in sel
    s = results["sft"].answer_selective
    assert s.threshold_at_target is not None and f"| sft, answers | {s.aurc:.4f} [{s.aurc_lo:.4f}, {s.aurc_hi:.4f}] ({s.e_aurc:.4f}) | {s.threshold_at_target:.3g} |" in sel
    assert s.aurc_lo < s.aurc < s.aurc_hi
    a_cal = results["sft"].answer_calibration
    assert a_cal.brier_lo < a_cal.brier < a_cal.brier_hi and "answer.brier_lo" in results["sft"].metrics()
    assert "| base, answers | 1.0000 [1.0000, 1.0000] (0.0000) | not reached | 0 | - |" in sel
    cmp = comparison_table(results)
    a = results["sft"].answer_calibration
    assert f"| answer accuracy [95% CI] | 0.000 [0.000, 0.006] | {a.accuracy:.3f} [{a.accuracy_lo:.3f}, {a.accuracy_hi:.3f}] |" in cmp
    assert "| 600 (600 stated a number, 0 abstained, few-shot) | 600 (600 stated a number, 0 abstained, chat) |" in cmp
