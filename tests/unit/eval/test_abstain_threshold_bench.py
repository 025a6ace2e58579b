"""bench/abstain_threshold.py: abstention by a threshold on the model's own confidence, read from eval.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import abstain_threshold as at


def _record(q: int, correct: bool, confidence: float, abstained: bool = False, in_range: bool = True) -> dict:
    return {"question": f"What is {q} + 0?", "correct": correct, "abstained": abstained,
            "confidence": 0.0 if abstained else confidence, "parsed": None if abstained else q,
            "in_train_range": in_range}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text(json.dumps({"model": {"stage": "x"}, "answers": records}), encoding="utf-8")
    return path


def test_answers_under_the_threshold_count_as_abstentions() -> None:
    unparsed = {**_record(5, False, 0.3), "parsed": None}  # said something, not a number: it too can fall under tau
    model = {r["question"]: r for r in [_record(1, True, 0.9), _record(2, False, 0.2), _record(3, False, 0.6),
                                         _record(4, False, 0.0, abstained=True, in_range=False), unparsed]}
    in_range = [q for q, r in model.items() if r["in_train_range"]]
    halluc, right = at.outcome(model, 0.5, in_range)
    assert (halluc.correct, halluc.n, right) == (1, 5, [True, False, False, False])  # only the 0.6 wrong one is left
    halluc, _ = at.outcome(model, 0.0, in_range)
    assert halluc.correct == 3
    assert at.auroc([0.9, 0.8], [0.2, 0.6]) == 1.0 and at.auroc([0.5], [0.5]) == 0.5


def test_prints_goal_2_for_a_policy_whose_wrong_answers_are_unsure(tmp_path, capsys) -> None:
    # SFT: 20 right at 0.9, 10 wrong at 0.8. The policy: the same right answers, its 10 wrong ones at 0.2, so a
    # threshold of 0.5 halves its hallucinations and loses no right answer.
    sft = [_record(i, i < 20, 0.9 if i < 20 else 0.8) for i in range(30)]
    policy = [_record(i, i < 20, 0.9 if i < 20 else 0.2) for i in range(30)]
    rc = at.main(["--sft", str(_write(tmp_path / "s.json", sft)), "--policy", str(_write(tmp_path / "p.json", policy)),
                  "--thresholds", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0 and "tau 0.5 policy: hallucinated 0/30" in out and "goal 2 met" in out
    # The lowest threshold that halves it lies just above the wrong answers' 0.2, not at the 0.5 asked for.
    best = [line for line in out.splitlines() if line.startswith("  tau 0.2")]
    assert len(best) == 1 and "policy: hallucinated 0/30" in best[0] and "goal 2 met" in best[0]
    assert "policy: confidence ranks its right in-range answers above its wrong ones with AUROC 1.000" in out
    assert "upper bound" in out


def test_a_threshold_just_above_a_confidence_abstains_that_answer(tmp_path, capsys) -> None:
    # SFT hallucinates on 2 of 4; the policy on 2, at confidences that rounding to 6 digits would push up, not down.
    sft = [_record(i, i < 2, 0.9) for i in range(4)]
    policy = [_record(0, True, 0.9), _record(1, True, 0.9), _record(2, False, 0.1234564), _record(3, False, 0.95)]
    at.main(["--sft", str(_write(tmp_path / "s.json", sft)), "--policy", str(_write(tmp_path / "p.json", policy)),
             "--thresholds", "0.5"])
    out = capsys.readouterr().out
    best = [line for line in out.splitlines() if line.startswith("  tau 0.1235 policy")]
    assert len(best) == 1 and "hallucinated 1/4" in best[0] and "goal 2 met" in best[0]


def test_refuses_files_that_are_not_evaluations_of_the_same_questions(tmp_path) -> None:
    good = _write(tmp_path / "s.json", [_record(1, True, 0.9)])
    with pytest.raises(SystemExit, match="not an eval.json"):
        at.main(["--sft", str(good), "--policy", str(tmp_path / "missing.json")])
    other = _write(tmp_path / "p.json", [_record(2, True, 0.9)])
    with pytest.raises(SystemExit, match="asked different questions"):
        at.main(["--sft", str(good), "--policy", str(other)])
