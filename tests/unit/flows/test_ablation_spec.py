"""An ablation file is checked before any work: names, targets, and each variant's overrides in order."""
from __future__ import annotations

import json

import pytest

from flows.ablation_spec import load_spec, variant_overrides
from infra.config import ConfigError


def write(tmp_path, spec: dict, targets: tuple[str, ...] = ("t.jsonl",)):
    """The file of `spec` (with the A/A check where it names no variant: something to compare), and its targets."""
    if not spec.get("variants"):
        spec = {"aa": True, **spec}
    for name in targets:
        (tmp_path / name).write_text('{"text": "held out"}\n')
    path = tmp_path / "ablation.yaml"
    path.write_text(json.dumps(spec))
    return path


def test_targets_are_read_relative_to_the_file(tmp_path):
    spec = load_spec(write(tmp_path, {"variants": {"near_0.7": {"data.near.threshold": 0.7}}, "targets": {"t": "t.jsonl"}}))
    assert spec.targets["t"] == (tmp_path / "t.jsonl").resolve() and spec.seeds == 3 and not spec.aa


@pytest.mark.parametrize("spec, match", [
    ({"variants": {"baseline": {}}, "targets": {"t": "t.jsonl"}}, "reserved"),
    ({"variants": {"a b": {}}, "targets": {"t": "t.jsonl"}}, "use letters"),
    ({"variants": {}, "targets": {}, "holdout": 0}, "holdout"),
    ({"variants": {}, "targets": {"t": "missing.jsonl"}}, "target file\\(s\\) not found"),
    ({"variants": {}, "targets": {"t": "t.jsonl"}, "seeds": 0}, "seeds"),
    ({"variants": {}, "targets": {"t": "t.jsonl"}, "until": "deploy"}, "until"),
    ({"variants": {}, "metrics": ["grpo.answer.accuracy"]}, "set `until: evaluate`"),
    ({"variants": {}, "until": "evaluate", "metrics": ["grpo.answer.abstention_rate"]}, "give a mapping"),
    ({"variants": {}, "until": "evaluate", "metrics": {"answer.accuracy": "higher"}}, "name a model"),
    ({"variants": {}, "until": "evaluate", "metrics": {"grpo.answer.accuracy": "up"}}, "higher"),
    ({"variant": {}, "targets": {"t": "t.jsonl"}}, "variant"),
])
def test_a_bad_file_says_what_to_fix(tmp_path, spec, match):
    with pytest.raises(ConfigError, match=match):
        load_spec(write(tmp_path, spec))


@pytest.mark.parametrize("text, match", [
    ("", "the ablation file is empty"),
    ("variants: {}\n", "nothing to compare with the baseline"),
    ("variants:\n  v1: {data.near.enabled: false}\n  v1: {data.quality.enabled: false}\n",
     "line 3: key 'v1' is given twice"),
    ("targets: {t: t.csv}\naa: true\n", "target t: target .*t.csv: unknown kind '.csv'"),
    ("targets: {t: empty.jsonl}\naa: true\n", "target t: target .*empty.jsonl holds no text"),
])
def test_a_file_with_nothing_to_compare_a_key_twice_or_an_unreadable_target_is_refused(tmp_path, text, match):
    (tmp_path / "t.csv").write_text("a,b\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "ablation.yaml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_spec(tmp_path / "ablation.yaml")


def test_a_folder_is_no_ablation_file(tmp_path):
    with pytest.raises(ConfigError, match="is a folder; give the YAML file"):
        load_spec(tmp_path)


def test_an_unknown_metric_is_refused_before_any_work(tmp_path):
    from flows.ablation_spec import check_metrics

    path = write(tmp_path, {"until": "evaluate", "metrics": {"grpo.nosuchthing.whatever": "lower"}})
    with pytest.raises(ConfigError, match=r"metrics \['grpo.nosuchthing.whatever'\] are no keys of the evaluation"):
        check_metrics(load_spec(path), path)
    check_metrics(load_spec(path), path, tasks=["nosuchthing"])  # an eval.tasks task's: known once lm-eval ran it


def test_a_variants_own_value_wins_over_the_command_line(tmp_path):
    spec = load_spec(write(tmp_path, {"variants": {"v": {"pretrain.steps": 7}}, "targets": {"t": "t.jsonl"},
                                      "proxy": {"pretrain.steps": 5}}))
    sets = variant_overrides(spec, ["pretrain.steps=3"])
    assert list(sets) == ["baseline", "v"]
    assert sets["baseline"] == ["pretrain.steps=3", "pretrain.steps=5"] and sets["v"][-1] == "pretrain.steps=7"


def test_metrics_get_their_direction_from_the_name_or_the_file(tmp_path):
    spec = load_spec(write(tmp_path, {"until": "evaluate", "metrics": ["grpo.answer.accuracy",
                                                                       "grpo.answer.hallucination_rate"]}))
    assert spec.metrics == {"grpo.answer.accuracy": "higher", "grpo.answer.hallucination_rate": "lower"}
    spec = load_spec(write(tmp_path, {"until": "evaluate", "metrics": {"grpo.answer.abstention_rate": "lower"}}))
    assert spec.metrics == {"grpo.answer.abstention_rate": "lower"}


def test_with_no_targets_every_variant_holds_out_the_same_slice(tmp_path):
    spec = load_spec(write(tmp_path, {"variants": {"v": {"data.near.enabled": False}}, "holdout": 0.2}))
    sets = variant_overrides(spec, ["data.holdout.fraction=0.3"])
    assert sets["baseline"][:2] == ["data.holdout.fraction=0.2", "data.holdout.fraction=0.3"]  # the command line wins
    assert sets["v"][:2] == sets["baseline"] and sets["v"][-1] == "data.near.enabled=false"
    assert variant_overrides(load_spec(write(tmp_path, {"targets": {"t": "t.jsonl"}})), [])["baseline"] == []


def test_every_metric_a_file_may_name_is_a_key_of_the_evaluation():
    from flows.ablation_spec import HIGHER, LOWER
    from tasks.eval.evaluate import metric_names

    lasts = {k.rsplit(".", 1)[-1] for k in metric_names()}
    assert (HIGHER | LOWER) <= lasts, (HIGHER | LOWER) - lasts


def test_the_built_in_ablation_is_a_valid_file():
    from flows.ablation_spec import BUILTIN

    spec = load_spec(BUILTIN)
    assert set(spec.variants) == {"quality_off", "near_off", "code_heavy"} and spec.aa and not spec.targets


def test_a_named_tokenizer_is_read_relative_to_the_file(tmp_path):
    (tmp_path / "tok.json").write_text("{}")
    spec = load_spec(write(tmp_path, {"targets": {"t": "t.jsonl"}, "tokenizer": "tok.json"}))
    assert spec.tokenizer == (tmp_path / "tok.json").resolve()
    with pytest.raises(ConfigError, match="tokenizer .* not found"):
        load_spec(write(tmp_path, {"targets": {"t": "t.jsonl"}, "tokenizer": "missing.json"}))
