"""The arithmetic task: deterministic sums for SFT, GRPO and the evaluation, and the ranges they share.

A problem's split (sft / grpo / eval) is a function of its question text alone (a salted
hash), so the three sets never overlap whatever seeds or sizes each stage asks for.
The expected response is `<answer>{n}</answer>`, which gives the format reward markers
to check. `ArithmeticTask` is the pipeline's `arithmetic:` section: the operations and the
ranges every stage reads, set once.
"""
from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from pydantic import Field, model_validator

from infra.config import StrictModel

OPS = "+-*"
SPLIT_SALT = "llmforge-arithmetic-v1"
# Shares of the question space per split; read-only so no caller can shift the borders.
SPLIT_FRACTIONS: Mapping[str, float] = MappingProxyType({"sft": 0.6, "grpo": 0.2, "eval": 0.2})


@dataclass(frozen=True)
class ArithmeticProblem:
    """One question `a op b` and its integer answer."""

    question: str
    answer: int

    @property
    def response(self) -> str:
        """The target assistant response."""
        return format_answer(self.answer)

    def messages(self) -> list[dict]:
        """The problem as a chat (user question, assistant answer)."""
        return [{"role": "user", "content": self.question}, {"role": "assistant", "content": self.response}]


def format_answer(n: int) -> str:
    """The response that states `n` as the answer."""
    return f"<answer>{n}</answer>"


def _question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


_QUESTION = re.compile(r"What is (-?[0-9]+) ([-+*]) (-?[0-9]+)\?")


def parse_question(question: str) -> tuple[int, str, int]:
    """(a, op, b) of a question `What is a op b?`."""
    m = _QUESTION.fullmatch(question)
    if m is None:
        raise ValueError(f"{question!r} is not an arithmetic question of the form 'What is a op b?'")
    return int(m.group(1)), m.group(2), int(m.group(3))


def few_shot_prompt(problem: ArithmeticProblem, shots: Sequence[ArithmeticProblem]) -> str:
    """`a op b =` after worked examples, one per line (`3 + 4 = 7`): a prompt that a model which never
    saw the chat template can complete with ` {answer}` and a newline."""
    lines = []
    for p in [*shots, problem]:
        a, op, b = parse_question(p.question)
        lines.append(f"{a} {op} {b} =" + (f" {p.answer}" if p is not problem else ""))
    return "\n".join(lines)


def _solve(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    return a * b


def _check_args(n: int, max_operand: int, ops: str) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops {ops!r} must be a non-empty string of characters from {OPS!r}")


def space_size(max_operand: int, ops: str) -> int:
    """How many distinct questions exist for these settings."""
    return (max_operand + 1) ** 2 * len(set(ops))


@lru_cache(maxsize=64)  # a pure count, asked by every config that names a split and by make_problems
def problem_capacity(max_operand: int, ops: str, split: str | None = None, outside: int | None = None) -> int:
    """How many distinct problems `make_problems` can draw with these arguments (a lower bound for huge spaces)."""
    if split is not None and split not in SPLIT_FRACTIONS:
        raise ValueError(f"split {split!r} is not one of {list(SPLIT_FRACTIONS)}")
    if outside is not None and not 0 <= outside < max_operand:
        raise ValueError(f"outside={outside} must be in [0, max_operand={max_operand}): no operand lies above it")
    inner = 0 if outside is None else space_size(outside, ops)
    capacity = space_size(max_operand, ops) - inner
    if split is None:
        return capacity
    # The hash split is only approximately proportional; count exactly for small spaces.
    if capacity <= 200_000:
        return sum(1 for a in range(max_operand + 1) for b in range(max_operand + 1) for op in sorted(set(ops))
                   if _outside(a, b, outside) and assign_split(_question(a, op, b)) == split)
    return int(capacity * SPLIT_FRACTIONS[split] * 0.9)


def make_problems(n: int, seed: int, max_operand: int = 20, ops: str = "+-", split: str | None = None,
                  outside: int | None = None) -> list[ArithmeticProblem]:
    """`n` distinct problems `a op b` with 0 <= a, b <= max_operand, the same for the same arguments.

    With `split` ("sft", "grpo" or "eval") only questions of that split are drawn; with `outside`, only
    questions with an operand above it (out of a training range `outside`, e.g. to teach abstention).
    """
    _check_args(n, max_operand, ops)
    capacity = problem_capacity(max_operand, ops, split, outside)
    if n > capacity:
        raise ValueError(
            f"asked for {n} distinct problems but only {capacity} exist with max_operand={max_operand}, "
            f"ops={ops!r}, split={split!r}, outside={outside}; raise max_operand or add ops"
        )
    rng = random.Random(f"{seed}:{max_operand}:{ops}" + ("" if outside is None else f":outside {outside}"))
    seen: set[str] = set()
    out: list[ArithmeticProblem] = []
    while len(out) < n:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        op = rng.choice(ops)
        q = _question(a, op, b)
        if q in seen or not _outside(a, b, outside) or (split is not None and assign_split(q) != split):
            continue
        seen.add(q)
        out.append(ArithmeticProblem(question=q, answer=_solve(a, op, b)))
    return out


def _outside(a: int, b: int, outside: int | None) -> bool:
    return outside is None or max(a, b) > outside


def split_unit(question: str, salt: str = SPLIT_SALT) -> float:
    """A stable number in [0, 1) derived from the question text."""
    digest = hashlib.sha256(f"{salt}\x1f{question}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(question: str, fractions: Mapping[str, float] = SPLIT_FRACTIONS, salt: str = SPLIT_SALT) -> str:
    """The split a question belongs to, by hash: the same question always lands in the same split."""
    total = sum(fractions.values())
    if total <= 0 or any(v < 0 for v in fractions.values()):
        raise ValueError(f"split fractions {dict(fractions)} must be >= 0 with a positive sum")
    u = split_unit(question, salt) * total
    edge = 0.0
    names = list(fractions)
    for name in names:
        edge += fractions[name]
        if u < edge:
            return name
    return names[-1]


class ArithmeticTask(StrictModel):
    """The sums SFT trains on, GRPO improves and the evaluation asks: one `arithmetic:` section for all three.

        trained range      operands 0..max_operand: SFT's and GRPO's sums, the evaluation's "in range"
        abstention range   an operand in (max_operand, abstain_max_operand]: the sums SFT and GRPO answer
                           "I don't know" (sft.data.arithmetic.abstain_n, grpo.abstain_n)
        outer range        operands 0..outer_max_operand: what the evaluation asks (default: to the end of the
                           abstention range, else the trained range); beyond the trained range abstaining is right
    """

    ops: str = "+-"
    max_operand: int = Field(default=20, ge=0)
    abstain_max_operand: int | None = Field(default=None, ge=0)
    outer_max_operand: int = Field(default=20, ge=0)

    @model_validator(mode="after")
    def _ranges(self) -> "ArithmeticTask":
        if not self.ops or any(op not in OPS for op in self.ops):
            raise ValueError(f"arithmetic.ops={self.ops!r} must be a non-empty string of characters from {OPS!r}")
        if self.abstain_max_operand is not None and self.abstain_max_operand <= self.max_operand:
            raise ValueError(f"arithmetic.abstain_max_operand={self.abstain_max_operand} must lie above "
                             f"arithmetic.max_operand={self.max_operand}: the abstained sums lie outside the trained range")
        if self.outer_max_operand < self.max_operand:
            raise ValueError(f"arithmetic.outer_max_operand={self.outer_max_operand} must be at least "
                             f"arithmetic.max_operand={self.max_operand}: the evaluation asks the trained range too")
        return self

    @model_validator(mode="before")
    @classmethod
    def _outer_default(cls, data: Any) -> Any:
        """outer_max_operand left out: the abstention range's end, else the trained range's."""
        if isinstance(data, dict) and data.get("outer_max_operand") is None:
            inner = data.get("max_operand", cls.model_fields["max_operand"].default)
            data = {**data, "outer_max_operand": data.get("abstain_max_operand") or inner}
        return data

    @property
    def has_outer_range(self) -> bool:
        """Whether the evaluation asks sums beyond the trained range (and so reports the range apart)."""
        return self.outer_max_operand > self.max_operand

    def abstention_range(self, what: str) -> int:
        """abstain_max_operand, or a ValueError naming `what` asked for abstained sums without one."""
        if self.abstain_max_operand is None:
            raise ValueError(f"{what} asks for sums answered \"I don't know\" beyond the trained range, but "
                             "arithmetic.abstain_max_operand is not set; set it above arithmetic.max_operand")
        return self.abstain_max_operand

    def problems(self, n: int, seed: int, split: str) -> list[ArithmeticProblem]:
        """`n` sums of the trained range from `split`."""
        return make_problems(n, seed, self.max_operand, self.ops, split=split)

    def abstained(self, n: int, seed: int, split: str, above: int | None = None) -> list[ArithmeticProblem]:
        """`n` sums of the abstention range from `split` (with an operand above `above`, default max_operand)."""
        top = self.abstention_range("abstained()")
        return make_problems(n, seed, top, self.ops, split=split, outside=self.max_operand if above is None else above)

    def questions(self, n: int, seed: int) -> list[ArithmeticProblem]:
        """The evaluation's `n` questions: the "eval" split of the outer range."""
        return make_problems(n, seed, self.outer_max_operand, self.ops, split="eval")

    def in_range(self, question: str) -> bool:
        """Whether both operands of the question lie in the trained range."""
        a, _, b = parse_question(question)
        return 0 <= a <= self.max_operand and 0 <= b <= self.max_operand
