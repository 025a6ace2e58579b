"""`llmforge mix`'s planning rules: how many proxies, each source's cap, the larger shape of --confirm-scale, the
targets named, and the `mix:` section refused early where it is wrong."""
from __future__ import annotations

import pytest

from flows.config import load_pipeline_config
from infra.config import ConfigError
from models.flops import num_params
from models.llama import model_config
from tasks.training.mix_search import MixSearchConfig, mix_caps, mix_targets, proxy_count, scaled_shape


def test_proxies_follow_the_sources_and_never_fall_below_the_laws_terms():
    assert proxy_count(MixSearchConfig(), 2) == 8
    assert proxy_count(MixSearchConfig(per_source=4), 3) == 12
    assert proxy_count(MixSearchConfig(proxies=3), 3) == 5  # c and three slopes, and one to leave out
    assert proxy_count(MixSearchConfig(proxies=9), 2) == 9


def test_a_source_is_capped_where_the_run_would_repeat_it_past_max_epochs():
    caps = mix_caps({"small": 100.0, "large": 10_000.0}, {"small": 4.0, "large": 1.0}, units=1_000.0)
    assert caps == {"small": pytest.approx(0.4), "large": 1.0}
    with pytest.raises(ValueError):
        mix_caps({"a": 1.0}, {"a": 1.0}, units=0)


@pytest.mark.parametrize("k", [2.0, 4.0, 8.0])
def test_the_confirm_shape_has_about_k_times_the_parameters(k):
    base = model_config("demo", 4096, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192)
    shape = scaled_shape({key: getattr(base, key) for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden")},
                         k, lambda s: num_params(base.model_copy(update=s)))
    grown = base.model_copy(update=shape)
    assert num_params(grown) / num_params(base) == pytest.approx(k, rel=0.2)
    assert shape["dim"] // shape["n_heads"] == 16 and shape["n_heads"] // shape["n_kv_heads"] == 2
    assert shape["n_layers"] >= 2 and shape["dim"] >= 64  # never smaller than the proxy
    small_vocab = model_config("demo", 1024, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192)
    grown = scaled_shape({key: getattr(small_vocab, key) for key in ("dim", "n_layers", "n_heads", "n_kv_heads",
                                                                     "ffn_hidden")},
                         2.0, lambda s: num_params(small_vocab.model_copy(update=s)))
    assert grown["n_layers"] >= 2 and grown["n_heads"] >= 4


def test_targets_are_named_files(tmp_path):
    text = tmp_path / "news.jsonl"
    text.write_text('{"text": "a"}\n')
    assert mix_targets({"news": text}) == {"news": text.resolve()}
    with pytest.raises(ConfigError, match="not found"):
        mix_targets({"news": tmp_path / "missing.jsonl"})
    with pytest.raises(ValueError, match="names"):
        MixSearchConfig(targets={"bad name": text})


def test_the_mix_section_is_checked_with_the_preset():
    config = load_pipeline_config("tiny", {"mix.per_source": 2})
    assert config.mix_proxy().steps == 200 and config.mix_proxy().model_overrides["dim"] == 64
    assert config.pretrain.steps == 400  # the proxy's keys change the proxy only
    with pytest.raises(ConfigError, match="pretrain.steps"):
        load_pipeline_config("tiny", {"mix.proxy": {"pretrain.stepz": 3}})
    with pytest.raises(ConfigError, match="pretrain.steps"):
        load_pipeline_config("tiny", {"mix.proxy": {"pretrain.steps": -3}})
    with pytest.raises(ConfigError, match="a proxy is a pretraining"):
        load_pipeline_config("tiny", {"mix.proxy": {"sft.steps": 3}})
    with pytest.raises(ConfigError, match="mix.seeds"):
        load_pipeline_config("tiny", {"mix.seeds": 1})
