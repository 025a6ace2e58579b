"""The scaling flow's own logic from the measured points on: fits, prediction.json written before the predicted run
is trained, then its measured bits per byte, the report and the sweep's MLflow run. Training is replaced by a
known law (the real launch, data and MLflow children: tests/integration/test_scale_flow.py)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import flows.scale_flow as scale_flow_module
from flows.config import load_pipeline_config
from flows.tokens import TokenizedData
from infra.run_queue import RunQueue
from models.flops import num_params
from models.llama import ModelConfig
from models.scaling import LossLaw
from tasks.training.scaling.fit_record import SweepFit

TRUTH = LossLaw(E=0.8, A=20.0, B=30.0, alpha=0.30, beta=0.32)  # bracketed by the tiny family at these budgets
TRAIN_TOKENS = 10**7


@pytest.mark.slow  # ~200 s on the busy 2-core machine: 12 points' bootstrap, figures, an MLflow store
def test_fit_then_prediction_written_before_the_run_then_measured(tmp_path, monkeypatch):
    # The family and budgets TRUTH is bracketed by (the tiny preset's sweep before it took its own vocabulary and batch).
    config = load_pipeline_config("tiny", {"scale.budgets": [1e12, 2e12, 4e12], "scale.resamples": 20,
                                           "scale.aspect_ratio": 32, "scale.head_dim": 32, "scale.tokens_per_param": 20,
                                           "scale.vocab_size": None, "scale.micro_batch_size": None})
    trained: list[tuple[int, bool]] = []  # (tokens, whether prediction.json existed when it was trained)

    def fake_run(stage, ws, tokens, tokenizer):
        cfg = stage.config
        n = num_params(ModelConfig(vocab_size=4096, **cfg.model_overrides))
        d = cfg.steps * cfg.batch.tokens_per_step(1)
        trained.append((d, any(Path(ws.root, "scale").glob("*/prediction.json"))))
        # The sweep's runs scatter about the law (0.3%, seeded); the predicted run measures the law itself.
        noise = 0.0 if len(trained) == 13 else np.random.default_rng(len(trained)).normal(0.0, 0.003)
        bpb = float(TRUTH.loss(n, d) * np.exp(noise))
        return SimpleNamespace(final_val_bpb=bpb, final_val_loss=bpb * 2, mlflow_run_id=None, out_dir=tmp_path / f"run{len(trained)}")

    monkeypatch.setattr(RunQueue, "run", lambda queue, items: [fake_run(i.stage, queue.ws, **i.inputs) for i in items])
    monkeypatch.setattr(scale_flow_module, "data_flow", lambda *a, **kw: SimpleNamespace(manifest=tmp_path / "m.json"))
    monkeypatch.setattr(scale_flow_module, "tokenized",
                        lambda *a: TokenizedData(tokenizer=tmp_path / "tok.json", tokens=tmp_path / "tokens"))
    monkeypatch.setattr(scale_flow_module, "load_tokenizer", lambda path: SimpleNamespace(get_vocab_size=lambda: 4096))
    monkeypatch.setattr(scale_flow_module, "load_token_index", lambda path: SimpleNamespace(
        tokens=lambda s: TRAIN_TOKENS, tokenizer_sha256="t" * 64, manifest_sha256="m" * 64))

    result = scale_flow_module.scale_flow.fn(config, workdir=str(tmp_path / "work"))

    assert len(result.points) == 12 and len(trained) == 13
    assert not any(seen for _, seen in trained[:12]) and trained[12][1]  # predicted before the 13th run
    pred = result.prediction
    data = json.loads((result.folder / "prediction.json").read_text())
    assert data["measured_bpb"] == pytest.approx(TRUTH.loss(pred.n_params, pred.tokens))
    assert data["flops"] == pytest.approx(4 * 4e12, rel=0.01) and trained[12][0] == data["tokens"]
    assert data["interval"][0] <= data["measured_bpb"] <= data["interval"][1]
    fit = SweepFit.model_validate_json((result.folder / "fit.json").read_text())  # for later runs' Chinchilla line
    assert fit.bootstrap.law.loss(pred.n_params, pred.tokens) == pytest.approx(pred.predicted_bpb)
    assert fit.manifest_sha256 == "m" * 64 and fit.tokenizer_sha256 == "t" * 64
    ratio = fit.optimal_ratio(pred.budget)
    assert ratio.low <= ratio.estimate <= ratio.high
    report = result.report.read_text()
    assert "## Predicted, then trained" in report and "| yes |" in report
    for png in ("isoflop.png", "frontier.png", "contours.png"):
        assert (result.folder / png).stat().st_size > 5000

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    sweep = client.get_run(result.mlflow_run_id)
    assert sweep.data.tags["llmforge.stage"] == "scale"
    for key in ("predicted_bpb", "predicted_bpb_low", "predicted_bpb_high", "measured_bpb", "fit_alpha",
                "fit_tokens_per_param"):
        assert key in sweep.data.metrics, key
    assert sweep.data.metrics["measured_bpb"] == pytest.approx(data["measured_bpb"])
    artifacts = {a.path for a in client.list_artifacts(result.mlflow_run_id, "scale")}
    assert {"scale/prediction.json", "scale/report.md", "scale/contours.png"} <= artifacts
