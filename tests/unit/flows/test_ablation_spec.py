"""An ablation file is checked before any work: names, targets, and each variant's overrides in order."""
from __future__ import annotations

import json

import pytest

from flows.ablation_spec import load_spec, variant_overrides
from infra.config import ConfigError


def write(tmp_path, spec: dict, targets: tuple[str, ...] = ("t.jsonl",)):
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
    ({"variants": {}, "targets": {}}, "at least one held-out"),
    ({"variants": {}, "targets": {"t": "missing.jsonl"}}, "target file\\(s\\) not found"),
    ({"variants": {}, "targets": {"t": "t.jsonl"}, "seeds": 0}, "seeds"),
    ({"variants": {}, "targets": {"t": "t.jsonl"}, "until": "grpo"}, "until"),
    ({"variant": {}, "targets": {"t": "t.jsonl"}}, "variant"),
])
def test_a_bad_file_says_what_to_fix(tmp_path, spec, match):
    with pytest.raises(ConfigError, match=match):
        load_spec(write(tmp_path, spec))


def test_a_variants_own_value_wins_over_the_command_line(tmp_path):
    spec = load_spec(write(tmp_path, {"variants": {"v": {"pretrain.steps": 7}}, "targets": {"t": "t.jsonl"},
                                      "proxy": {"pretrain.steps": 5}}))
    sets = variant_overrides(spec, ["pretrain.steps=3"])
    assert list(sets) == ["baseline", "v"]
    assert sets["baseline"] == ["pretrain.steps=3", "pretrain.steps=5"] and sets["v"][-1] == "pretrain.steps=7"
