"""Reward functions on good, bad and hostile completions; the registry; arithmetic problems and splits."""
from __future__ import annotations

import time

import pytest
from hypothesis import given, settings, strategies as st

from tasks.eval.arithmetic import SPLIT_FRACTIONS, ArithmeticProblem, assign_split, make_problems
from tasks.eval.rewards import (REWARDS, arithmetic_exact, combined_reward, format_reward, get_reward, gsm8k_exact,
                                parse_answer, register_reward)

P = ArithmeticProblem("What is 7 - 12?", -5)


@pytest.mark.parametrize(
    "completion,exact,fmt",
    [
        ("<answer>-5</answer>", 1.0, 1.0),
        ("  <answer> -5 </answer>  ", 1.0, 1.0),
        ("The result: <answer>\n-5\n</answer>", 1.0, 1.0),
        ("<answer>5</answer>", 0.0, 1.0),
        ("<answer>-05</answer>", 1.0, 1.0),  # an integer is an integer
        ("-5", 0.0, 0.0),
        ("<answer>minus five</answer>", 0.0, 0.5),
        ("<answer></answer>", 0.0, 0.5),
        ("<answer>-5.0</answer>", 0.0, 0.5),
        ("<answer>- 5</answer>", 0.0, 0.5),
        ("<answer>+5</answer>", 0.0, 0.5),
        ("<answer>-5", 0.0, 0.0),
        ("-5</answer>", 0.0, 0.0),
        ("</answer>-5<answer>", 0.0, 0.0),
        ("<answer>-5</answer><answer>3</answer>", 0.0, 0.0),  # hedging gets nothing
        ("<answer><answer>-5</answer></answer>", 0.0, 0.0),  # nested markers
        ("<ANSWER>-5</ANSWER>", 0.0, 0.0),
        ("<answer>__import__('os').system('echo pwned')</answer>", 0.0, 0.5),
        ("<answer>eval('-5')</answer>", 0.0, 0.5),
        ("<answer>-4-1</answer>", 0.0, 0.5),
        ("<answer>\u0665</answer>", 0.0, 0.5),  # Arabic-Indic five is not an ASCII integer
        ("<answer>\uff15</answer>", 0.0, 0.5),  # fullwidth five
        ("<answer>-\u0665</answer>", 0.0, 0.5),
        ("<answer>" + "9" * 19 + "</answer>", 0.0, 0.5),  # over MAX_ANSWER_DIGITS
        ("", 0.0, 0.0),
    ],
)
def test_builtin_rewards(completion, exact, fmt):
    assert arithmetic_exact(completion, P) == exact
    assert format_reward(completion, P) == fmt
    assert get_reward("arithmetic_exact")(completion, P) == exact
    assert get_reward("format")(completion, None) == fmt


def test_reference_forms():
    assert arithmetic_exact("<answer>12</answer>", 12) == 1.0
    assert arithmetic_exact("<answer>12</answer>", "12") == 1.0
    assert arithmetic_exact("<answer>12</answer>", "twelve") == 0.0
    assert arithmetic_exact("<answer>1</answer>", True) == 0.0
    assert arithmetic_exact("<answer>12</answer>", None) == 0.0


def test_non_string_completions_score_zero():
    for junk in (None, 5, b"<answer>-5</answer>", ["<answer>-5</answer>"]):
        assert arithmetic_exact(junk, P) == 0.0
        assert format_reward(junk, P) == 0.0


def test_huge_and_pathological_inputs_are_fast():
    cases = [
        "<answer>" * 200_000 + "-5" + "</answer>" * 200_000,
        "<answer>" + " " * 5_000_000 + "-5</answer>",
        "x" * 10_000_000 + "<answer>-5</answer>",  # beyond the inspected prefix
        "<answer>" + "1" * 5_000_000 + "</answer>",
        "<answer>-" + "-" * 1_000_000,
    ]
    start = time.perf_counter()
    for c in cases:
        assert arithmetic_exact(c, P) == 0.0
        assert format_reward(c, P) == 0.0
    assert time.perf_counter() - start < 2.0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("#<>/answer-0123456789,.$ \n\u0665xunkow")), max_size=80))
def test_rewards_never_raise_and_stay_in_range(text):
    assert arithmetic_exact(text, P) in (0.0, 1.0)
    assert format_reward(text, P) in (0.0, 0.5, 1.0)
    assert gsm8k_exact(text, P) in (0.0, 1.0)
    assert all(0.0 <= reward(text, P) <= 1.0 for reward in REWARDS.values())  # every registered one
    if arithmetic_exact(text, P) == 1.0:
        assert format_reward(text, P) == 1.0 and parse_answer(text) == -5


def test_combined_reward_weights():
    r = combined_reward({"arithmetic_exact": 1.0, "format": 0.1})
    assert r("<answer>-5</answer>", P) == pytest.approx(1.1)
    assert r("<answer>4</answer>", P) == pytest.approx(0.1)
    assert r("<answer>four</answer>", P) == pytest.approx(0.05)
    assert r("nothing", P) == 0.0
    with pytest.raises(KeyError, match="registered rewards"):
        combined_reward({"nope": 1.0})
    with pytest.raises(ValueError, match="finite"):
        combined_reward({"format": float("nan")})
    with pytest.raises(ValueError, match="at least one"):
        combined_reward({})


def test_register_custom_reward_and_name_clash():
    name = "test_rewards_length"

    @register_reward(name)
    def length_reward(completion: str, reference) -> float:
        return min(len(completion), 10) / 10

    try:
        assert get_reward(name) is length_reward
        assert combined_reward({name: 2.0})("abcde", None) == pytest.approx(1.0)
        with pytest.raises(ValueError, match="already registered"):
            register_reward(name)(lambda c, r: 0.0)
    finally:
        REWARDS.pop(name, None)
    with pytest.raises(KeyError, match="unknown reward"):
        get_reward(name)


# Arithmetic problems ---------------------------------------------------------------


def test_make_problems_deterministic_distinct_and_correct():
    a = make_problems(200, seed=3, max_operand=20, ops="+-*")
    assert a == make_problems(200, seed=3, max_operand=20, ops="+-*")
    assert a != make_problems(200, seed=4, max_operand=20, ops="+-*")
    assert len({p.question for p in a}) == 200
    for p in a:
        x, op, y = p.question.removeprefix("What is ").removesuffix("?").split()
        assert 0 <= int(x) <= 20 and 0 <= int(y) <= 20
        assert p.answer == {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op]
        assert arithmetic_exact(p.response, p) == 1.0
        assert p.messages()[1] == {"role": "assistant", "content": f"<answer>{p.answer}</answer>"}


def test_make_problems_argument_errors():
    with pytest.raises(ValueError, match="only 8 exist"):
        make_problems(9, seed=0, max_operand=1, ops="+-")
    with pytest.raises(ValueError, match="ops"):
        make_problems(3, seed=0, ops="/")
    with pytest.raises(ValueError, match="split"):
        make_problems(3, seed=0, split="test")


def test_splits_never_overlap_and_are_stable():
    sft = make_problems(150, seed=0, split="sft")
    grpo = make_problems(100, seed=1, split="grpo")
    ev = make_problems(50, seed=2, split="eval")
    qs = [{p.question for p in s} for s in (sft, grpo, ev)]
    assert not (qs[0] & qs[1]) and not (qs[0] & qs[2]) and not (qs[1] & qs[2])
    assert all(assign_split(p.question) == "grpo" for p in grpo)
    # Every question of the space is in exactly one split, roughly in proportion.
    everything = make_problems(21 * 21 * 2, seed=0)
    shares = {k: sum(assign_split(p.question) == k for p in everything) / len(everything) for k in SPLIT_FRACTIONS}
    for k, f in SPLIT_FRACTIONS.items():
        assert abs(shares[k] - f) < 0.06
