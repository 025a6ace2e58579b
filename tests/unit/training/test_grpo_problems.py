"""Which problems the GRPO stage trains and scores on: the arithmetic splits, or a GSM8K source's splits."""
from __future__ import annotations

import json

import pytest

from tasks.eval.arithmetic import ArithmeticTask, make_problems
from tasks.eval.gsm8k import Gsm8kSource
from tasks.training.grpo.stage import grpo_problems
from tests.conftest import grpo_config


def test_arithmetic_by_default():
    cfg, task = grpo_config(n_train_problems=20, eval_prompts=7), ArithmeticTask(ops="+", max_operand=9)
    train, held_out = grpo_problems(cfg, task)
    assert train == make_problems(20, 0, 9, "+", split="grpo")
    assert held_out == make_problems(7, 0, 9, "+", split="eval")
    # Abstention: more problems from the task's abstention range, where abstaining pays.
    train, _ = grpo_problems(cfg.model_copy(update={"abstain_n": 6}), task.model_copy(update={"abstain_max_operand": 19}))
    assert train[:20] == make_problems(20, 0, 9, "+", split="grpo") and len(train) == 26
    assert all(max(int(t) for t in p.question[8:-1].split(" + ")) > 9 for p in train[20:])
    with pytest.raises(ValueError, match="arithmetic.abstain_max_operand is not set"):
        grpo_problems(cfg.model_copy(update={"abstain_n": 3}), task)


def test_gsm8k_splits_from_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for split, n in (("train", 30), ("test", 8)):
        rows = [{"question": f"{split} {i}?", "answer": f"#### {i}"} for i in range(n)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = grpo_config(task="gsm8k", gsm8k=Gsm8kSource(name=str(tmp_path), config=None), n_train_problems=25,
                          eval_prompts=8, rewards={"gsm8k_exact": 1.0}, accuracy_reward="gsm8k_exact")
    train, held_out = grpo_problems(cfg, ArithmeticTask())
    assert len(train) == 25 and all(p.question.startswith("train ") for p in train)
    assert sorted(p.question for p in held_out) == sorted(f"test {i}?" for i in range(8))
    with pytest.raises(ValueError, match="at most 30"):
        grpo_problems(cfg.model_copy(update={"n_train_problems": 31}), ArithmeticTask())
