"""A sweep's fit.json is found by runs on the same data and tokenizer, and their Chinchilla line uses its ratio."""
from __future__ import annotations

import json
import logging
import os

import pytest

from models.flops import CHINCHILLA_TOKENS_PER_PARAM, chinchilla
from models.scaling import six_n
from models.scaling_bootstrap import bootstrap
from tasks.tokenizer.tokenize_shards import TokenShards
from tasks.training.scaling.fit_record import find_fit, write_fit
from tests.helpers.scaling_sweeps import BUDGETS, TRUTH, sweep


def _shards(folder, manifest="m" * 64):
    folder.mkdir(parents=True)
    index = TokenShards(dtype="uint16", vocab_size=1024, eos_id=2, val_fraction=0.05, tokenizer_sha256="t" * 64,
                        manifest_sha256=manifest, sources={},
                        files={"train": {"file": "train.bin", "tokens": 1_000_000, "bytes": 2_000_000, "sha256": "0" * 64}})
    (folder / "index.json").write_text(index.model_dump_json())
    return index


@pytest.fixture(scope="module")
def small_bootstrap():
    c, n, d, loss = sweep(sizes_per_budget=4, noise=0.002, seed=3, budgets=BUDGETS[:3])
    return bootstrap(c, n, d, loss, flops_per_token=six_n, resamples=10, seed=0)


def test_the_newest_fit_on_the_same_shards_is_found_and_another_datas_is_not(tmp_path, small_bootstrap):
    ws = tmp_path / "work"
    index = _shards(ws / "tokens" / "aaaa")
    other = _shards(ws / "tokens" / "bbbb", manifest="x" * 64)
    assert find_fit(ws / "tokens" / "aaaa") is None  # no sweep yet
    old, new = ws / "scale" / "old", ws / "scale" / "new"
    for folder in (old, new):
        folder.mkdir(parents=True)
        write_fit(folder, small_bootstrap, index)
    os.utime(old / "fit.json", (1, 1))
    (ws / "scale" / "broken").mkdir()
    (ws / "scale" / "broken" / "fit.json").write_text("{")  # an unfinished write is passed over
    fit = find_fit(ws / "tokens" / "aaaa")
    assert fit is not None and fit.folder == str(new)
    assert find_fit(ws / "tokens" / "bbbb") is None and other.manifest_sha256 != index.manifest_sha256

    compute = 4 * BUDGETS[2]
    ratio = fit.optimal_ratio(compute)
    assert ratio.estimate == pytest.approx(small_bootstrap.law.optimum(compute).tokens_per_param)
    assert ratio.estimate == pytest.approx(TRUTH.optimum(compute).tokens_per_param, rel=0.3)
    assert ratio.low <= ratio.estimate <= ratio.high


def test_an_edited_fit_is_never_read_and_the_next_write_restores_it(tmp_path, small_bootstrap, caplog):
    """fit.json carries its sha256 beside it (SHA256SUMS.json): a valid-JSON edit is passed over, named (issue 52)."""
    ws = tmp_path / "work"
    index = _shards(ws / "tokens" / "aaaa")
    folder = ws / "scale" / "sweep"
    folder.mkdir(parents=True)
    path = write_fit(folder, small_bootstrap, index)
    assert find_fit(ws / "tokens" / "aaaa") is not None
    edited = json.loads(path.read_text())
    edited["folder"] = "elsewhere"  # still valid JSON, still a SweepFit
    path.write_text(json.dumps(edited))
    with caplog.at_level(logging.WARNING):
        assert find_fit(ws / "tokens" / "aaaa") is None
    assert "edited or damaged" in caplog.text and "passed over" in caplog.text
    write_fit(folder, small_bootstrap, index)  # what the next `llmforge scale` of the sweep does
    assert find_fit(ws / "tokens" / "aaaa") is not None


def test_the_chinchilla_line_names_the_fitted_ratio_and_moves_its_band_with_it():
    n, d = 2_000_000, 40_000_000  # 20 tokens per parameter: Chinchilla-optimal
    assert chinchilla(n_params=n, tokens=d).warning is None
    # A sweep that measured 200 tokens per parameter optimal calls 20 undertrained (below 200 / 4).
    fitted = chinchilla(n_params=n, tokens=d, optimal_ratio=200.0, ratio_source="fitted by the sweep in work/scale/x")
    assert "undertrained" in fitted.warning and "(< 50)" in fitted.warning
    assert "optimal ~200, fitted by the sweep in work/scale/x" in fitted.summary()
    assert fitted.optimal_params == pytest.approx((6 * n * d / (6 * 200)) ** 0.5, rel=1e-6)
    line = chinchilla(n_params=20_528, tokens=1_353_728).summary()
    assert "params 20.5k" in line and "tokens 1.35M" in line and f"optimal ~{CHINCHILLA_TOKENS_PER_PARAM:.3g}" in line


def test_the_pretraining_chinchilla_view_uses_the_sweeps_ratio_on_the_same_shards(tmp_path, small_bootstrap,
                                                                                     monkeypatch):
    from types import SimpleNamespace

    import tasks.training.pretrain.stage as pretrain_stage
    from models.flops import num_params
    from models.llama import model_config

    cfg = model_config("demo", 1024)
    monkeypatch.setattr(pretrain_stage, "load_config", lambda folder: cfg)
    ws = tmp_path / "work"
    index = _shards(ws / "tokens" / "k")
    result = SimpleNamespace(model_dir=tmp_path / "model", tokens_seen=2_000_000)

    def view():
        return pretrain_stage.chinchilla_view(result, ws / "tokens" / "k")

    assert "(optimal ~20, Chinchilla)" in view().summary() and view().optimal_ratio == 20
    (ws / "scale" / "s").mkdir(parents=True)
    write_fit(ws / "scale" / "s", small_bootstrap, index)
    fitted = small_bootstrap.law.optimum(6.0 * num_params(cfg) * 2_000_000).tokens_per_param
    assert f"fitted at this compute by the sweep in {ws / 'scale' / 's'}, 95% interval [" in view().summary()
    assert view().optimal_ratio == pytest.approx(fitted)
    assert view().tokens_per_param == pytest.approx(2_000_000 / num_params(cfg))  # all parameters, as Chinchilla
