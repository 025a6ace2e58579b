"""`key=value` overrides: one parser for the CLI's --set and the flows' `overrides` parameter."""
from __future__ import annotations

import re

import pytest

from flows.cli import main
from flows.config import load_pipeline_config, parse_overrides, resolve_data_config, resolve_pipeline_config
from infra.config import ConfigError


def test_parse_overrides_reads_values_as_yaml():
    assert parse_overrides(["data.near.threshold=0.7", "data.sources=[news, letters]", "name= a=b"]) == {
        "data.near.threshold": 0.7, "data.sources": ["news", "letters"], "name": "a=b",
    }


@pytest.mark.parametrize("bad", ["data.near.threshold", "=0.7", "data.sources=[a"])
def test_parse_overrides_names_the_bad_item(bad):
    with pytest.raises(ConfigError, match=re.escape(f"override '{bad}'")):
        parse_overrides([bad])


def test_overrides_apply_once_on_top_of_the_preset_and_a_given_config_is_used_as_is():
    tiny = load_pipeline_config("tiny")
    cfg = resolve_pipeline_config(None, "tiny", ["data.near.threshold=0.7"])
    assert cfg.data.near.threshold == 0.7
    assert cfg.model_copy(update={"data": tiny.data}) == tiny  # nothing else moved
    given = tiny.model_copy(update={"name": "mine"})
    # A given config already holds its overrides (the CLI applied them): they name its runs, never reapplied.
    assert resolve_pipeline_config(given, "ignored", ["pretrain.steps=3"]) is given
    assert resolve_pipeline_config(given, "ignored", None) is given
    data = resolve_data_config(None, "tiny", ["data.near.threshold=0.7"])
    assert data.near.threshold == 0.7 and data.mix == tiny.data.mix
    assert resolve_data_config(tiny.data, "tiny", ["data.near.num_perm=64"]) is tiny.data


def test_overrides_refuse_unknown_keys_like_the_cli(capsys):
    with pytest.raises(ConfigError, match="key 'data.near.treshold'"):
        resolve_pipeline_config(None, "tiny", ["data.near.treshold=0.7"])
    with pytest.raises(ConfigError, match="key 'data.near.treshold'"):
        resolve_data_config(load_pipeline_config("tiny").data, "tiny", ["data.near.treshold=0.7"])
    with pytest.raises(ConfigError, match="only reads keys under 'data.'"):
        resolve_data_config(None, "tiny", ["pretrain.steps=3"])
    assert main(["show-config", "--set", "data.near.treshold=0.7"]) == 2
    assert "key 'data.near.treshold'" in capsys.readouterr().err
    assert main(["show-config", "--set", "data.near.threshold"]) == 2
    assert "expected key=value" in capsys.readouterr().err
