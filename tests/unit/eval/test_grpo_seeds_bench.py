"""bench/grpo_seeds.py counts hallucinations as the evaluation does: wrong and not abstained, of all questions."""
from __future__ import annotations

import pytest

from bench.grpo_seeds import hallucinated


def test_hallucinations_are_wrong_answers_not_abstentions_over_the_questions_asked():
    answers = {"right": (True, False), "abstained": (False, True), "wrong": (False, False), "unasked": (False, False)}
    rate = hallucinated(answers, ["right", "abstained", "wrong"])
    assert (rate.correct, rate.n) == (1, 3) and rate.accuracy == pytest.approx(1 / 3)
    assert rate.accuracy_lo < 1 / 3 < rate.accuracy_hi
    with pytest.raises(ValueError, match="both correct and abstained"):
        hallucinated({"q": (True, True)}, ["q"])
