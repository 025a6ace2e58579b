"""What a model's answers are worth when it may say "I don't know" (tasks/eval/rewards.ABSTENTION).

    report = abstention_report(correct, abstained)

Four shares, each with its Wilson 95% interval:
- accuracy: right answers over all questions (an abstention is not right);
- abstention: abstentions over all questions;
- hallucination: answers that are wrong and not abstentions, over all questions: what a user is
  told that is false. Over all questions, not over the answered ones, so a model cannot lower it
  by answering less and have the ratio stay the same: every wrong answer it stops giving counts;
- answered accuracy: right answers over the questions not abstained on (None when it abstained on all).

accuracy + abstention + hallucination = 1. Calibration and selective prediction see an abstention
as an answer stated with confidence 0 that is not right (tasks/eval/evaluate.answer_records): it is
answered last on the accuracy-coverage curve and lands in the lowest reliability bin, where it adds
no calibration error.
"""
from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from tasks.eval.intervals import Proportion, proportion

SHARES = ("accuracy", "abstention", "hallucination", "answered_accuracy")


class AbstentionReport(BaseModel):
    """Right, abstained and hallucinated shares of all questions, and the accuracy of the answered ones."""

    accuracy: Proportion
    abstention: Proportion
    hallucination: Proportion
    answered_accuracy: Proportion | None = None  # None: every question was abstained on

    def metrics(self) -> dict[str, float]:
        """`<share>_rate` (accuracy and answered_accuracy as they are) with `_lo`/`_hi`, for MLflow and the report."""
        out: dict[str, float] = {}
        for share in SHARES:
            p = getattr(self, share)
            if p is None:
                continue
            key = share_key(share)
            out.update({key: p.accuracy, f"{key}_lo": p.accuracy_lo, f"{key}_hi": p.accuracy_hi})
        return out

    @staticmethod
    def metric_keys() -> list[str]:
        """Every key `metrics()` can hold."""
        return [share_key(share) + end for share in SHARES for end in ("", "_lo", "_hi")]


def share_key(share: str) -> str:
    """A share's metric name: `<share>_rate`, accuracy and answered_accuracy as they are."""
    return share if share.endswith("accuracy") else f"{share}_rate"


def abstention_report(correct: Sequence[bool], abstained: Sequence[bool]) -> AbstentionReport:
    """The four shares of a set of answers; an answer both right and abstained is refused (it cannot be)."""
    if len(correct) != len(abstained) or not correct:
        raise ValueError(f"need one abstained flag per answer and at least one answer; got {len(correct)} answers "
                         f"and {len(abstained)} flags")
    if any(c and a for c, a in zip(correct, abstained)):
        raise ValueError("an answer is marked both correct and abstained; score abstentions as not correct")
    answered = [c for c, a in zip(correct, abstained) if not a]
    return AbstentionReport(
        accuracy=proportion(correct),
        abstention=proportion(abstained),
        hallucination=proportion([not c and not a for c, a in zip(correct, abstained)]),
        answered_accuracy=proportion(answered) if answered else None,
    )


class AbstentionLanding(BaseModel):
    """Where a later model's abstentions land, against an earlier model's answers to the same questions."""

    abstained: int  # the later model's abstentions
    earlier_right: int  # ... on questions the earlier model got right: skill given up
    earlier_wrong: int  # ... on questions it answered wrong: hallucinations turned into abstentions
    earlier_abstained: int  # ... on questions it abstained on too


def abstention_landing(earlier: Sequence[tuple[str, bool, bool]], later: Sequence[tuple[str, bool, bool]]
                       ) -> AbstentionLanding:
    """`earlier` and `later`: (question, correct, abstained) of each model's answers, paired by question."""
    before = {q: (c, a) for q, c, a in earlier}
    missing = [q for q, _, _ in later if q not in before]
    if missing:
        raise ValueError(f"{len(missing)} question(s) the earlier model was not asked, e.g. {missing[0]!r}")
    landed = [before[q] for q, _, a in later if a]
    return AbstentionLanding(abstained=len(landed), earlier_right=sum(c for c, _ in landed),
                             earlier_wrong=sum(not c and not a for c, a in landed),
                             earlier_abstained=sum(a for _, a in landed))
