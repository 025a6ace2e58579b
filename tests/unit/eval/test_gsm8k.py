"""GSM8K-style problems and the gsm8k_exact reward: final answers after "####" or in an <answer> block."""
from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest

from tasks.eval.gsm8k import Gsm8kProblem, Gsm8kSource, load_problems, problems_from_records
from tasks.eval.rewards import REWARDS, final_answer, gsm8k_exact

SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
P = Gsm8kProblem("How many clips did Natalia sell?", "72", SOLUTION)


@pytest.mark.parametrize("completion, expected", [
    ("She sold 72 clips.\n#### 72", 1.0),
    ("#### 72", 1.0),
    ("####72", 1.0),
    ("#### 72.", 1.0),
    ("#### $72.00", 1.0),
    ("<answer>72</answer>", 1.0),
    ("first #### 5\nthen #### 72", 1.0),  # the last mark counts
    ("#### 72\nand some words after", 1.0),
    ("#### 71", 0.0),
    ("#### 72 clips", 0.0),  # the answer line holds a number and nothing else
    ("The answer is 72", 0.0),  # no final-answer marker
    ("<answer>72</answer><answer>72</answer>", 0.0),  # ambiguous
    ("<answer>72</answer>\n#### 72", 1.0),  # the block decides
    ("", 0.0),
])
def test_gsm8k_exact(completion, expected):
    assert gsm8k_exact(completion, P) == expected
    assert REWARDS["gsm8k_exact"] is gsm8k_exact


def test_numbers_and_reference_forms():
    assert final_answer("#### 1,000") == Decimal(1000)
    assert final_answer("#### 1,00") is None  # not a thousands grouping
    assert final_answer("#### -3") == Decimal(-3)
    assert final_answer("#### 2.50") == Decimal("2.5")
    assert gsm8k_exact("#### 1000", Gsm8kProblem("q", "1000")) == 1.0
    for reference in (72, "72", SOLUTION, Decimal(72), P):
        assert gsm8k_exact("#### 72", reference) == 1.0
    for junk in (None, 7, b"#### 72", ["#### 72"]):
        assert gsm8k_exact(junk, P) == 0.0
    assert gsm8k_exact("#### 72", True) == 0.0 and gsm8k_exact("#### 72", None) == 0.0


def test_pathological_inputs_are_fast():
    start = time.perf_counter()
    for text in ("####" * 1_000_000, "#### " + "1," * 1_000_000, "#### " + "9" * 5_000_000, "x" * 10_000_000 + "#### 72"):
        assert gsm8k_exact(text, P) == 0.0
    assert time.perf_counter() - start < 2.0


def test_records_without_a_final_answer_are_skipped():
    records = [{"question": " Q1 ", "answer": "so\n#### 1,234"}, {"question": "Q2", "answer": "no mark"},
               {"question": "", "answer": "#### 3"}, {"question": "Q4", "answer": "42"}, {"answer": "#### 5"}]
    problems, skipped = problems_from_records(records)
    assert [(p.question, p.answer) for p in problems] == [("Q1", "1234"), ("Q4", "42")]
    assert problems[0].solution == "so\n#### 1,234" and skipped == 3


def test_load_problems_from_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for split, n in (("train", 12), ("test", 5)):
        rows = [{"question": f"{split} question {i}?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(n)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    source = Gsm8kSource(name=str(tmp_path), config=None)
    train = load_problems(source, "train", 10, seed=0)
    assert len(train) == 10 and len({p.question for p in train}) == 10
    assert load_problems(source, "train", 10, seed=0) == train  # the seed fixes the order
    assert all(gsm8k_exact(f"#### {p.answer}", p) == 1.0 for p in train)
    assert {p.question for p in load_problems(source, "test", 5)} == {f"test question {i}?" for i in range(5)}
    with pytest.raises(ValueError, match="6 problems asked .* holds 5 .* ask for at most 5"):
        load_problems(source, "test", 6)
    with pytest.raises(ValueError, match=r"no column\(s\) \['problem'\]"):
        load_problems(source.model_copy(update={"question_field": "problem"}), "test", 1)
