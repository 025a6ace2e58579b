"""Decontamination: what counts as an evaluation item found in a document, what is ignored as common, and where
each document ends (issue 50)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from infra.config import ConfigError
from tasks.data.catalog import load_catalog
from tasks.data.collect import collect_source, merge_results
from tasks.data.contamination import ContaminationIndex, DocumentMatches, TaskItems, cut, judge, keeps_numbers, words
from tasks.data.decontaminate import DecontaminateConfig, decontaminate
from tasks.data.exact_dedup import ExactDedupConfig, exact_dedup
from tasks.data.funnel import build_funnel
from tasks.data.mix import MixConfig, rebalance_mix
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.items import arithmetic_items, file_items
from tests.conftest import words as random_words

QUESTION = ("In which year did the committee publish the first complete edition of the collected letters of the "
            "poet and his brother?")
ITEM = TaskItems("letters", [f"{QUESTION} 1887"])
ARITH = TaskItems("arith", [f"What is {a} + {b}? <answer>{a + b}</answer>" for a in range(30) for b in range(30)])


def verdict(index, text, docs=(), common_docs=10, **kw):
    matches = DocumentMatches(index)
    matches.add([text, *docs])
    args = {"action": "drop", "window": 200, "max_cuts": 10, "min_chars_left": 200} | kw
    return judge(index, text, matches.common(common_docs), **args)


def test_normalised_for_case_punctuation_and_whitespace_but_signs_stay_words():
    assert words("Hello,\n  WORLD!  well-known", True)[0] == ["hello", "world", "well", "known"]
    assert words("12 + 7 = 19", True)[0] == ["12", "+", "7", "=", "19"]
    assert words("12 - 7", True)[0] != words("12 + 7", True)[0]
    assert words("===== ---", True)[0] == []
    assert words("page 12 of 30", False)[0] == ["page", "0", "of", "0"]


def test_an_item_is_found_verbatim_reformatted_and_inside_a_longer_document():
    index = ContaminationIndex([ITEM])
    text = ITEM.items[0]
    assert verdict(index, text).drop
    assert verdict(index, text.upper().replace(" ", "\n").replace("?", " ...")).drop
    host = random_words(random.Random(0), 300)
    assert verdict(index, f"{host}. {text} {host}").task == "letters"
    assert not verdict(index, host).drop and verdict(index, host).task is None


def test_one_changed_word_leaves_an_ngram_of_a_long_item_and_none_of_a_short_one():
    index = ContaminationIndex([ITEM], n=8)
    ws = ITEM.items[0].split()
    ws[10] = "banana"
    assert verdict(index, " ".join(ws)).drop  # 20 words: an 8-gram on either side of the change survives
    short = ContaminationIndex([TaskItems("short", ["Who wrote the letters? Vincent"])], n=13)
    assert verdict(short, "who wrote the letters vincent").drop  # shorter than n words: matched whole
    assert not verdict(short, "who wrote these letters vincent").drop


def test_a_task_whose_items_differ_only_in_numbers_keeps_its_digits():
    assert keeps_numbers(ARITH.items) and not keeps_numbers(ITEM.items + [QUESTION + " in 1901 or later, never"])
    index = ContaminationIndex([ARITH])
    assert index.tasks[0].keep_numbers
    assert verdict(index, "Quiz: What is 12 + 7? <answer>19</answer>").drop
    assert not verdict(index, "Quiz: What is 12 + 70? <answer>82</answer>").drop  # the template, other numbers
    assert not verdict(index, "Quiz: What is 12 - 7? <answer>5</answer>").drop


def test_a_template_ngram_around_one_number_is_not_a_key():
    template = "A farmer has {a} cows in the north field and buys {b} more at the market on Monday. How many now? {c}"
    items = TaskItems("farm", [template.format(a=a, b=b, c=a + b) for a in range(10, 40) for b in range(50, 80)])
    index = ContaminationIndex([items])
    assert verdict(index, template.format(a=12, b=55, c=67)).drop
    # Shares b and the words around it with items, but not two of any item's numbers.
    assert not verdict(index, template.format(a=99, b=55, c=154)).drop


def test_an_ngram_in_more_than_common_docs_documents_is_ignored():
    boiler = ("THE SOFTWARE IS PROVIDED AS IS WITHOUT WARRANTY OF ANY KIND EXPRESS OR IMPLIED INCLUDING BUT NOT "
              "LIMITED TO THE WARRANTIES OF MERCHANTABILITY")
    index = ContaminationIndex([TaskItems("licensed", [f"{QUESTION} 1887. {boiler}"])])
    licences = [f"Copyright {i} somebody. {boiler}" for i in range(11)]
    assert verdict(index, licences[0], licences[1:3]).drop  # in 3 documents: not common, still a match
    assert not verdict(index, licences[0], licences[1:]).drop  # in 11 documents: common, ignored
    assert verdict(index, f"{QUESTION} 1887", licences[1:]).drop  # the item's own words still match


def test_cut_removes_the_match_and_a_window_and_drops_what_is_left_too_small():
    index = ContaminationIndex([ITEM])
    before, after = "A" * 400 + " start.", "end. " + "B" * 400
    text = f"{before} {ITEM.items[0]} {after}"
    v = verdict(index, text, action="cut", window=5, min_chars_left=100)
    assert not v.drop and len(v.spans) == 1
    a, b = v.spans[0]
    item_at = text.index(ITEM.items[0])
    assert (a, b) == (item_at - 5, item_at + len(ITEM.items[0]) + 5)  # the match and 5 characters either side
    assert cut(text, v.spans) == "A" * 400 + " st\n\n " + "B" * 400
    assert verdict(index, f"tiny {ITEM.items[0]} tail", action="cut", window=5, min_chars_left=100).drop
    many = " ".join(f"{ITEM.items[0]} " + "filler " * 60 for _ in range(3))
    assert verdict(index, many, action="cut", window=0, max_cuts=2, min_chars_left=0).drop


def test_the_arithmetic_items_are_every_evaluation_question_with_its_sum():
    task = ArithmeticTask(ops="+", max_operand=31, abstain_max_operand=49)
    items = arithmetic_items(task)
    assert len(items.items) == 524 and items.keep_numbers  # the tiny preset's whole "eval" split
    assert items.items[0].endswith("</answer>") and items.items[0].startswith("What is ")


def test_a_file_of_items_reads_question_and_answer_or_text_and_refuses_other_lines(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"question": "Q one?", "answer": "A"}\n\n{"text": "whole item"}\n')
    assert file_items(f) == TaskItems("mine", ["Q one? A", "whole item"])
    f.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"mine.jsonl:1: .*question"):
        file_items(f)


def catalog(root: Path, planted: list[str]) -> object:
    cat = root / "cat"
    cat.mkdir()
    rng = random.Random(0)
    for name in ("a", "b"):
        docs = [random_words(rng, 40) + "." for _ in range(50)] + (planted if name == "a" else [])
        (cat / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in docs) + "\n")
        (cat / f"{name}.yaml").write_text(f"name: {name}\nkind: jsonl\npath: {name}.jsonl\nlicence: MIT\n")
    return load_catalog(cat)


@pytest.mark.parametrize("action", ["drop", "cut"])
def test_the_stage_counts_every_document_in_one_place_and_reports_each_task(tmp_path, action):
    filler = "word " * 80
    planted = [ITEM.items[0], f"{filler} {ITEM.items[0]} {filler}", "What is 3 + 4? <answer>7</answer>"]
    cat = catalog(tmp_path, planted)
    col = merge_results([collect_source(cat, s, tmp_path / "collect") for s in cat.sources],
                        tmp_path / "c.parquet", tmp_path / "c.rm.parquet")
    out = decontaminate(col.output, tmp_path / "d", [ITEM, ARITH, TaskItems("unused", ["nothing like it at all"])],
                        DecontaminateConfig(action=action, window=10, min_chars_left=50))
    expect = {"drop": (2, 0), "cut": (1, 1)}[action]  # the long document is cut, the bare item too small to keep
    t = out.tasks["letters"]
    assert (t.items, t.items_found, t.documents_removed, t.documents_cut) == (1, 1, *expect)
    assert out.tasks["arith"].items_found == 1 and out.tasks["arith"].documents_removed == 1
    assert out.tasks["unused"].items_found == 0 and out.tasks["arith"].numbers == "kept"
    assert json.loads(out.report.read_text())["tasks"]["letters"]["items_found"] == 1
    ex = exact_dedup(out.result.output, tmp_path / "e.parquet", tmp_path / "e.rm.parquet", ExactDedupConfig())
    mx = rebalance_mix(ex.output, tmp_path / "m.parquet", tmp_path / "m.rm.parquet", cat.weights(), {"a": 1, "b": 1},
                       MixConfig())
    funnel = build_funnel(col, ex, None, None, mx, decontaminate=out.result)  # conservation checked inside
    assert funnel["a"]["contaminated"] == expect[0] + 1 and funnel["b"]["contaminated"] == 0
    assert funnel["a"]["contaminated:letters"] == expect[0] and funnel["a"]["contaminated:arith"] == 1
    kept = pq.read_table(out.result.output).column("text").to_pylist()
    assert not any("1887" in t for t in kept)  # nothing of the item is trained on, cut or dropped
    removed = pq.read_table(out.result.removed)
    assert set(removed.column("reason").to_pylist()) <= {"contaminated:letters", "contaminated:arith"}
