"""Reward functions for GRPO and evaluation: plain functions `(completion, reference) -> float`.

They are registered by name (`@register_reward("name")`) so a config can list rewards
and weights, and users can add their own. Completions are model output, so every
built-in reward treats them as hostile: it only reads a bounded prefix, parses with
strict ASCII-only regexes (no nested quantifiers, so no catastrophic backtracking),
never evaluates anything, and returns 0.0 rather than raising on junk.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from pydantic_core import PydanticCustomError

RewardFn = Callable[[str, Any], float]

# The registry is the one piece of module state here, on purpose: registering a reward
# at import time is how a user's module makes it available to configs by name.
REWARDS: dict[str, RewardFn] = {}

MAX_COMPLETION_CHARS = 8192  # rewards only look at this many leading characters
MAX_ANSWER_DIGITS = 18  # fits an int64; longer "numbers" are not answers
OPEN, CLOSE = "<answer>", "</answer>"
# One block, ASCII digits only: [0-9] rather than \d, which would accept e.g. Arabic-Indic digits.
_INTEGER = re.compile(rf"[ \t\r\n]*(-?[0-9]{{1,{MAX_ANSWER_DIGITS}}})[ \t\r\n]*")
_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# The one way to say "I don't know": an answer block holding this word instead of a number. Inside the
# answer block, so a model learns one format and only chooses what the block holds.
UNKNOWN = "unknown"
ABSTENTION = f"{OPEN}{UNKNOWN}{CLOSE}"


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: make `fn(completion, reference) -> float` available as reward `name`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")

    def deco(fn: RewardFn) -> RewardFn:
        if name in REWARDS and REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered ({REWARDS[name].__module__}.{REWARDS[name].__name__}); pick another name")
        REWARDS[name] = fn
        return fn

    return deco


def get_reward(name: str) -> RewardFn:
    """The reward registered as `name`; the error lists the known names."""
    try:
        return REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; registered rewards: {sorted(REWARDS)}") from None


def check_reward_names(key: str, names: list[str]) -> None:
    """Refuse names no reward is registered under, as a config's error naming `key` and the registered ones."""
    unknown = [n[:80] for n in names if n not in REWARDS][:5]
    if unknown:
        raise PydanticCustomError("unknown_reward", "{detail}", {"detail": (
            f"{key} names unknown reward(s) {unknown}; registered rewards: {sorted(REWARDS)} "
            "(add one with @register_reward in tasks/eval/rewards.py)")})


def _answer_block(completion: Any) -> str | None:
    """The text inside the single <answer>...</answer> block, or None unless there is exactly one, well-formed."""
    if not isinstance(completion, str):
        return None
    text = completion[:MAX_COMPLETION_CHARS]
    if text.count(OPEN) != 1 or text.count(CLOSE) != 1:
        return None  # none, several, or nested blocks: ambiguous, so no answer
    m = _BLOCK.search(text)
    return m.group(1) if m else None  # None when </answer> comes before <answer>


def parse_answer(completion: Any) -> int | None:
    """The integer in the completion's single <answer>...</answer> block, else None."""
    inner = _answer_block(completion)
    if inner is None:
        return None
    m = _INTEGER.fullmatch(inner)
    return int(m.group(1)) if m else None


def is_abstention(completion: Any) -> bool:
    """True iff the completion's single answer block says "I don't know" (`ABSTENTION`, whitespace around the word allowed)."""
    inner = _answer_block(completion)
    return inner is not None and inner.strip(" \t\r\n") == UNKNOWN


def reference_answer(reference: Any) -> int | None:
    """The expected integer of a reference: an ArithmeticProblem (its .answer), an int, or an integer string."""
    value = getattr(reference, "answer", reference)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _INTEGER.fullmatch(value)
        return int(m.group(1)) if m else None
    return None


def _exact(got: Any, want: Any) -> float:
    """1.0 when both answers were found and are equal, else 0.0."""
    return 1.0 if got is not None and want is not None and got == want else 0.0


@register_reward("arithmetic_exact")
def arithmetic_exact(completion: str, reference: Any) -> float:
    """1.0 iff the completion's single <answer> block holds exactly the reference integer."""
    got = parse_answer(completion)
    want = reference_answer(reference)
    return _exact(got, want)


def parse_integer(completion: Any) -> int | None:
    """The completion as one integer, surrounding whitespace allowed (a few-shot completion's answer), else None."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    m = _INTEGER.fullmatch(completion)
    return int(m.group(1)) if m else None


@register_reward("integer_exact")
def integer_exact(completion: str, reference: Any) -> float:
    """1.0 iff the whole completion is the reference integer: the few-shot `a + b =` prompt's answer, no markers."""
    got = parse_integer(completion)
    want = reference_answer(reference)
    return _exact(got, want)


@register_reward("abstain")
def abstain(completion: str, reference: Any = None) -> float:
    """1.0 iff the completion abstains (`ABSTENTION`), else 0.0.

    Weighted below the accuracy reward (`grpo.rewards: {arithmetic_exact: 1.0, abstain: 0.3}`) it orders
    right > abstain > wrong: saying "I don't know" pays less than the answer and more than a wrong one,
    so a policy learns to abstain where it is more likely wrong than the weight (GrpoConfig checks the order).
    """
    return 1.0 if is_abstention(completion) else 0.0


@register_reward("format")
def format_reward(completion: str, reference: Any = None) -> float:
    """1.0 for exactly one well-formed <answer>integer</answer> block (or the abstention); 0.5 when the one block holds
    something else; 0.0 otherwise.

    The partial credit rewards learning the markers before the content, without paying
    anything for several or nested blocks (which would let a policy hedge its answers).
    Text outside the block is allowed.
    """
    inner = _answer_block(completion)
    if inner is None:
        return 0.0
    return 1.0 if _INTEGER.fullmatch(inner) or inner.strip(" \t\r\n") == UNKNOWN else 0.5


# GSM8K (Cobbe et al. 2021) ends a worked solution with its final answer after "####": "... = 18 dollars.\n#### 18".
GSM8K_MARK = "####"
# A final answer: an optional "$", digits (thousands grouped by commas, or not), an optional decimal part, an
# optional full stop. Bounded repeats only, so no input can make the match backtrack.
_DECIMAL = re.compile(
    r"[ \t]*\$?(-?(?:[0-9]{1,3}(?:,[0-9]{3}){1,6}|[0-9]{1,%d})(?:\.[0-9]{1,8})?)\.?[ \t\r]*" % MAX_ANSWER_DIGITS
)


def _decimal(text: str) -> Decimal | None:
    m = _DECIMAL.fullmatch(text)
    return Decimal(m.group(1).replace(",", "")) if m else None


def final_answer(text: Any) -> Decimal | None:
    """The final answer a GSM8K-style text states: in its single <answer> block, else on the line after its last
    "####"; "1,000", "$18" and "18.00" are numbers. None when it states none (or several blocks)."""
    if not isinstance(text, str):
        return None
    text = text[:MAX_COMPLETION_CHARS]
    if OPEN in text or CLOSE in text:
        inner = _answer_block(text)
        return _decimal(inner.strip()) if inner is not None else None
    at = text.rfind(GSM8K_MARK)
    if at < 0:
        return None
    return _decimal(text[at + len(GSM8K_MARK):].split("\n", 1)[0])


def reference_number(reference: Any) -> Decimal | None:
    """The number a GSM8K-style reference states: its `.answer`, a number, a bare number string or a solution."""
    value = getattr(reference, "answer", reference)
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, Decimal)):
        return Decimal(value)
    if isinstance(value, str):
        return final_answer(value) if GSM8K_MARK in value or OPEN in value else _decimal(value.strip())
    return None


@register_reward("gsm8k_exact")
def gsm8k_exact(completion: str, reference: Any) -> float:
    """1.0 iff the completion's final answer (`final_answer`) equals the reference's as a number.

    The reference is a problem with `.answer`, a number, or a GSM8K solution ending in "#### n".
    """
    got = final_answer(completion)
    want = reference_number(reference)
    return _exact(got, want)


def combined_reward(weights: Mapping[str, float]) -> RewardFn:
    """A reward equal to sum(w * reward_name(completion, reference)) over `weights`."""
    if not weights:
        raise ValueError("combined_reward needs at least one reward name with a weight")
    fns: list[tuple[float, RewardFn]] = []
    for name, w in weights.items():
        if not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"weight of reward {name!r} must be a finite number, got {w!r}")
        fns.append((float(w), get_reward(name)))

    def reward(completion: str, reference: Any) -> float:
        return float(sum(w * fn(completion, reference) for w, fn in fns))

    reward.__name__ = "combined(" + ",".join(f"{n}={w}" for n, w in weights.items()) + ")"
    return reward
