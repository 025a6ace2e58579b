"""The evaluation's items the data flow decontaminates against: from eval.tasks (lm-eval YAML tasks of the user's
folders, the built-in arithmetic questions) and data.decontaminate.files, set when the pipeline's config is read."""
from __future__ import annotations

import pytest

from flows.config import load_pipeline_config, resolve_data_config
from infra.config import ConfigError
from tasks.eval.items import lm_eval_items, load_lm_eval_tasks
from tests.helpers.lm_eval_tasks import mc_task_folder

def task_folder(tmp_path, name="capitals"):
    rows = [{"question": "What is the capital of France?", "choices": ["Rome", "Paris", "Oslo"], "label": 1},
            {"question": "Which planet is red?", "choices": ["Mars", "Venus"], "label": 0}]
    return mc_task_folder(tmp_path / "tasks", name, rows, "Question: {{question}}\\nAnswer:")


def test_a_multiple_choice_items_text_is_its_question_and_right_choice_only(tmp_path):
    [task] = list(lm_eval_items(["capitals"], [task_folder(tmp_path)]))
    assert task.name == "capitals"
    assert task.items == ["Question: What is the capital of France?\nAnswer: Paris",
                          "Question: Which planet is red?\nAnswer: Mars"]  # no wrong choice: Rome, Oslo, Venus


def test_an_unknown_task_is_refused_naming_the_folders(tmp_path):
    folder = task_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"eval.tasks \['nosuchtask'\]: no such lm-eval task"):
        load_lm_eval_tasks(["capitals", "nosuchtask"], [folder], registry=False)  # the registry: 15 s to index


def test_the_pipeline_decontaminates_against_what_it_evaluates_and_the_users_files(tmp_path):
    items = tmp_path / "mine.jsonl"
    items.write_text('{"text": "x"}\n')
    cfg = load_pipeline_config("tiny", {"eval.tasks": ["arithmetic", "capitals"], "eval.task_paths": [str(tmp_path)],
                                        "data.decontaminate.files": [str(items)]})
    got = cfg.data.eval_items
    assert got.arithmetic == cfg.arithmetic and got.tasks == ["capitals"] and got.files == [items]
    off = load_pipeline_config("tiny", {"data.decontaminate.enabled": False})
    assert off.data.eval_items.empty
    assert load_pipeline_config("tiny", {"eval.tasks": []}).data.eval_items.empty
    with pytest.raises(ConfigError, match="each task once"):
        load_pipeline_config("tiny", {"eval.tasks": ["arithmetic", "arithmetic"]})


def test_the_data_flow_takes_the_evaluation_tasks_it_decontaminates_against():
    assert resolve_data_config(None, "tiny", ["eval.tasks=[]"]).eval_items.empty
    wider = resolve_data_config(None, "tiny", ["arithmetic.abstain_max_operand=60"])
    assert wider.eval_items.arithmetic.outer_max_operand == 60  # the questions the evaluation will ask
    with pytest.raises(ConfigError, match="the data flow only reads"):
        resolve_data_config(None, "tiny", ["sft.steps=3"])
