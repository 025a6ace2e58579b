"""Abstention: the one way to say "I don't know", the data that teaches it, the reward that pays for it,
and the evaluation's shares (accuracy, abstention, hallucination, accuracy of the answered)."""
from __future__ import annotations

import math

import pytest

from models.chat_template import encode_text, special_ids
from tasks.eval.abstention import abstention_report
from tasks.eval.arithmetic import ArithmeticTask, make_problems, parse_question
from tasks.eval.config import EvalConfig
from tasks.eval.evaluate import answer_metrics, answer_records
from tasks.eval.rewards import ABSTENTION, combined_reward, format_reward, get_reward, is_abstention, parse_answer
from tasks.training.config import ArithmeticSftOptions, GrpoConfig
from tasks.training.sft.data import SftSourceConfig, load_sft_examples
from tests.helpers.arithmetic_answers import Parrot, tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# A small arithmetic task: sums of operands up to 10, abstentions up to 20.
TASK = ArithmeticTask(ops="+", max_operand=10, abstain_max_operand=20)


def test_abstention_is_one_answer_block_and_pays_between_wrong_and_right() -> None:
    problem = make_problems(1, 0, split="eval")[0]
    right, wrong = f"<answer>{problem.answer}</answer>", f"<answer>{problem.answer + 1}</answer>"
    assert ABSTENTION == "<answer>unknown</answer>"
    assert is_abstention(ABSTENTION) and is_abstention("<answer> unknown </answer>") and parse_answer(ABSTENTION) is None
    for not_one in ("unknown", "<answer>Unknown</answer>", ABSTENTION * 2, right, "<answer>unknown 3</answer>", None):
        assert not is_abstention(not_one)
    assert format_reward(ABSTENTION) == 1.0 and format_reward("<answer>dunno</answer>") == 0.5
    assert get_reward("abstain")(ABSTENTION, problem) == 1.0 and get_reward("abstain")(right, problem) == 0.0
    reward = combined_reward({"arithmetic_exact": 1.0, "abstain": 0.3, "format": 0.1})
    assert reward(right, problem) > reward(ABSTENTION, problem) > reward(wrong, problem)
    assert reward(ABSTENTION, problem) == pytest.approx(0.4)


def test_grpo_refuses_an_abstain_weight_that_breaks_right_over_abstain_over_wrong() -> None:
    GrpoConfig(rewards={"arithmetic_exact": 1.0, "abstain": 0.3})
    for weight in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="right > abstain > wrong"):
            GrpoConfig(rewards={"arithmetic_exact": 1.0, "abstain": weight})


def test_out_of_range_problems_and_sft_examples_that_abstain() -> None:
    outside = make_problems(40, 0, max_operand=20, ops="+", split="sft", outside=10)
    assert len({p.question for p in outside}) == 40
    assert all(max(int(t) for t in p.question[8:-1].split(" + ")) > 10 for p in outside)
    assert make_problems(5, 0, 20, "+", split="sft") == make_problems(5, 0, 20, "+", split="sft", outside=None)
    with pytest.raises(ValueError, match="outside=20"):
        make_problems(1, 0, max_operand=20, outside=20)
    with pytest.raises(ValueError, match="only"):
        make_problems(10_000, 0, max_operand=20, ops="+", split="sft", outside=10)

    opts = ArithmeticSftOptions(n=30, abstain_n=12)
    source = SftSourceConfig(name="arithmetic", kind="sft_builtin", builtin="arithmetic", licence="CC0-1.0", arithmetic=opts)
    examples, rejected = load_sft_examples([source], task=TASK)
    assert not rejected and len(examples) == 42
    abstained = [e for e in examples if e.response == ABSTENTION]
    assert len(abstained) == 12 and {e.locator for e in abstained} == {f"abstain:{i}" for i in range(12)}
    assert all(max(int(t) for t in e.instruction[8:-1].split(" + ")) > 10 for e in abstained)
    with pytest.raises(ValueError, match="abstain_max_operand=10 must lie above arithmetic.max_operand=10"):
        ArithmeticTask(max_operand=10, abstain_max_operand=10)
    with pytest.raises(ValueError, match="abstain_n asks for sums answered .* arithmetic.abstain_max_operand is not set"):
        ArithmeticSftOptions(n=30, abstain_n=3).check(ArithmeticTask(ops="+", max_operand=10))


def test_sft_abstains_only_above_its_band_when_asked() -> None:
    """abstain_above leaves the sums between max_operand and it unanswered and unabstained: GRPO's to find."""
    opts = ArithmeticSftOptions(n=30, abstain_n=12, abstain_above=15)
    source = SftSourceConfig(name="arithmetic", kind="sft_builtin", builtin="arithmetic", licence="CC0-1.0", arithmetic=opts)
    examples, _ = load_sft_examples([source], task=TASK)
    abstained = [e for e in examples if e.response == ABSTENTION]
    assert len(abstained) == 12 and all(max(int(t) for t in e.instruction[8:-1].split(" + ")) > 15 for e in abstained)
    ArithmeticSftOptions(n=30, abstain_n=3, abstain_above=10).check(TASK)
    for above in (9, 20, 25):
        with pytest.raises(ValueError, match=f"abstain_above={above} must lie in"):
            ArithmeticSftOptions(n=30, abstain_n=3, abstain_above=above).check(TASK)


def _arithmetic_sft(**options) -> list:
    """The examples of a small built-in arithmetic source (30 sums up to 10, 5 abstentions up to 20) and `options`."""
    opts = ArithmeticSftOptions(**{"n": 30, "abstain_n": 5, **options})
    source = SftSourceConfig(name="arithmetic", kind="sft_builtin", builtin="arithmetic", licence="CC0-1.0",
                             arithmetic=opts)
    examples, rejected = load_sft_examples([source], task=TASK)
    assert not rejected
    return examples


def test_sft_abstains_on_a_drawn_few_inside_the_range_when_asked() -> None:
    """abstain_in_range answers that many of the in-range questions "I don't know", the same ones on every build."""
    def build(k: int, seed: int = 0) -> list:
        return _arithmetic_sft(seed=seed, abstain_in_range=k)

    plain, unsure = build(0), build(6)
    assert len(plain) == len(unsure) == 35
    changed = [(a, b) for a, b in zip(plain, unsure) if a.response != b.response]
    assert len(changed) == 6 and all(b.response == ABSTENTION and a.locator.startswith("problem:") for a, b in changed)
    assert all(max(parse_question(b.instruction)[::2]) <= 10 for _, b in changed)
    assert [a.instruction for a in plain] == [b.instruction for b in unsure]  # the same questions, 6 answers replaced
    assert [e.response for e in build(6)] == [e.response for e in unsure]
    assert [e.response for e in build(6, seed=1)] != [e.response for e in build(0, seed=1)]
    with pytest.raises(ValueError, match="abstain_in_range=31 must be at most n=30"):
        ArithmeticSftOptions(n=30, abstain_in_range=31)


def test_shares_of_right_abstained_and_hallucinated_answers() -> None:
    correct = [True] * 6 + [False] * 14
    abstained = [False] * 6 + [True] * 10 + [False] * 4
    r = abstention_report(correct, abstained)
    assert (r.accuracy.correct, r.abstention.correct, r.hallucination.correct) == (6, 10, 4)
    assert r.accuracy.accuracy + r.abstention.accuracy + r.hallucination.accuracy == pytest.approx(1.0)
    assert r.answered_accuracy.n == 10 and r.answered_accuracy.accuracy == 0.6
    m = r.metrics()
    assert m["hallucination_rate"] == 0.2 and m["hallucination_rate_lo"] < 0.2 < m["hallucination_rate_hi"]
    assert m["abstention_rate"] == 0.5 and m["answered_accuracy"] == 0.6
    assert abstention_report([False], [True]).answered_accuracy is None
    with pytest.raises(ValueError, match="both correct and abstained"):
        abstention_report([True], [True])


def test_an_abstaining_model_states_no_answer_with_confidence_zero_and_hallucinates_nothing() -> None:
    tok = tokenizer()
    vocab = tok.get_vocab_size()
    problems = make_problems(6, 3, max_operand=20, ops="+", split="eval")
    script = [*encode_text(tok, ABSTENTION), special_ids(tok).end_turn]
    cfg = EvalConfig(max_new_tokens=len(script) + 2, answer_batch_size=4, n_bins=5, bootstrap_resamples=50,
                     multiple_choice=False)
    records = answer_records(Parrot(vocab, script), tok, problems, cfg)
    p = math.exp(3.0) / (math.exp(3.0) + vocab - 1)
    for r in records:
        assert r.abstained and not r.correct and r.parsed is None and r.confidence == 0.0
        assert r.response_probability == pytest.approx(p ** len(script), rel=1e-5)
    out = answer_metrics(Parrot(vocab, script), tok, problems, cfg, TASK)
    a = out["answer_abstention"]
    assert (a.abstention.accuracy, a.hallucination.accuracy, a.accuracy.accuracy) == (1.0, 0.0, 0.0)
    assert a.answered_accuracy is None
    # Calibration and selective prediction see each abstention as an answer at confidence 0 that is not right.
    bins = out["answer_bins"]
    assert out["answer_calibration"].ece == 0.0 and bins.n == len(problems)
    assert {c for c, k in zip(bins.mean_confidence, bins.counts) if k} == {0.0}
    assert out["answer_selective"].curve_coverage == [1.0] and out["answer_selective"].curve_accuracy == [0.0]
    assert [x.in_train_range for x in out["answers"]] == [max(int(t) for t in q.question[8:-1].split(" + ")) <= 10
                                                          for q in problems]
    # The few-shot prompt has no way to abstain: the same text there is just not a number.
    few = answer_records(Parrot(vocab, [*encode_text(tok, " unknown\n")]), tok, problems[:2], cfg,
                         shots=make_problems(2, 0, split="sft"))
    assert not any(r.abstained for r in few) and all(r.confidence > 0 for r in few)


def test_held_out_abstentions_validate_and_leave_the_training_set_as_it_was() -> None:
    """val_abstain_n adds abstentions that only validate: every example trained on before is trained on still."""
    from tasks.training.sft.stage import is_held_out

    plain, more = _arithmetic_sft(val_abstain_n=0), _arithmetic_sft(val_abstain_n=7)
    assert len(more) == len(plain) + 7
    for fraction in (0.0, 0.3):
        trained = [(e.example_id, e.instruction, e.response) for e in plain if not is_held_out(e, fraction)]
        assert trained == [(e.example_id, e.instruction, e.response) for e in more if not is_held_out(e, fraction)]
    extra = [e for e in more if e.held_out]
    assert len(extra) == 7 and all(is_held_out(e, 0.0) and e.response == ABSTENTION for e in extra)
    assert all(max(parse_question(e.instruction)[::2]) > 10 for e in extra)  # beyond the range, as abstain_n's
    assert not {e.instruction for e in extra} & {e.instruction for e in plain}  # new sums, not copies of trained ones
    assert not any(e.held_out for e in plain)
    with pytest.raises(ValueError, match="val_abstain_n asks for sums answered"):
        ArithmeticSftOptions(n=30, val_abstain_n=3).check(ArithmeticTask(ops="+", max_operand=10))


def test_more_sums_than_the_split_holds_are_refused_by_the_config_not_after_the_launch() -> None:
    tiny = ArithmeticTask(ops="+", max_operand=31, abstain_max_operand=49)
    ArithmeticSftOptions(n=612, abstain_n=10, val_abstain_n=12).check(tiny)
    with pytest.raises(ValueError, match="n=613, but only 612 sums of the sft split"):
        ArithmeticSftOptions(n=613).check(tiny)
    with pytest.raises(ValueError, match=r"abstain_n \+ val_abstain_n = 5 \+ 500 = 505, but only \d+ sums"):
        ArithmeticSftOptions(n=10, abstain_n=5, val_abstain_n=500).check(TASK)
    # Through the pipeline config: refused when it is read, before any stage runs.
    from flows.config import PipelineConfig

    with pytest.raises(ValueError, match="n=613, but only 612 sums"):
        PipelineConfig.model_validate({"arithmetic": {"ops": "+", "max_operand": 31},
                                       "sft": {"data": {"arithmetic": {"n": 613}}}})


def test_the_sft_stage_validates_on_the_held_out_abstentions_and_trains_on_what_it_did_before() -> None:
    """Through the stage's own split (load_examples), not only the predicate it uses."""
    from tasks.training.config import SftConfig, SftDataConfig
    from tasks.training.sft.stage import load_examples
    from tests.conftest import bpe_tokenizer_on

    tok = bpe_tokenizer_on([f"What is {a} + {b}? {ABSTENTION}" for a in range(21) for b in range(21)], 300)

    def split(val_abstain_n: int, val_fraction: float):
        opts = ArithmeticSftOptions(n=30, abstain_n=5, val_abstain_n=val_abstain_n)
        cfg = SftConfig(data=SftDataConfig(builtin=["arithmetic"], arithmetic=opts, val_fraction=val_fraction))
        data = load_examples(cfg, tok, seq_len=64, task=TASK)
        return [e.ids for e in data.train], [e.ids for e in data.val]

    train, val = split(7, 0.0)
    assert len(train) == 35 and len(val) == 7
    assert all(tok.decode(ids[-12:], skip_special_tokens=False).count("unknown") == 1 for ids in val)
    for fraction in (0.0, 0.3):
        plain_train, plain_val = split(0, fraction)
        more_train, more_val = split(7, fraction)
        assert more_train == plain_train and len(more_val) == len(plain_val) + 7


def test_where_a_later_models_abstentions_land_against_the_earlier_answers():
    """Issue 51: GRPO's abstentions split by what SFT did on the same questions, paired by question, not by order."""
    from tasks.eval.abstention import abstention_landing

    sft = [("a", True, False), ("b", False, False), ("c", False, True), ("d", True, False), ("e", False, False)]
    grpo = [("e", False, True), ("d", False, True), ("c", False, True), ("b", False, False), ("a", True, False)]
    land = abstention_landing(sft, grpo)
    assert (land.abstained, land.earlier_right, land.earlier_wrong, land.earlier_abstained) == (3, 1, 1, 1)
    with pytest.raises(ValueError, match="1 question"):
        abstention_landing(sft, grpo + [("z", False, True)])
