"""tp 2 and pp 2 end to end through the pretraining stage: the launcher, checkpoints, an exact resume, the export,
and the losses of one process (bench/parallel.py's model, data and batch; fewer steps)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.helpers.shared import shared_once

STEPS = 4


def _run(name: str, work: Path, inputs: tuple[Path, Path], every: int = 0):
    import mlflow

    from infra.stages import in_run
    from infra.tracking.store import tracking_uri
    from infra.workspace.paths import Workspace
    from tasks.training.pretrain.stage import Pretrain

    parallel = _bench()
    cfg = parallel.layout_config(name, STEPS)
    cfg = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"every": every})})
    ws = Workspace.locate(work / "ws")
    tokenizer, tokens = inputs
    result = in_run(Pretrain(cfg), ws, work / name, log=lambda line: None, tokens=tokens, tokenizer=tokenizer)
    history = mlflow.tracking.MlflowClient(tracking_uri(ws)).get_metric_history(result.mlflow_run_id, "loss")
    return result, [m.value for m in sorted(history, key=lambda m: m.step)]


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_parallel", ROOT / "bench" / "parallel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from models.export import load_model

    return load_model(model_dir).state_dict()


def _build_one_process(work: Path) -> None:
    """The inputs, and one process's run on them with its per-step losses (losses.json)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("PYTHONPATH", str(ROOT))  # the ranks import this checkout
        inputs = _bench().write_inputs(work)
        _, losses = _run("single", work, inputs)
    (work / "inputs.json").write_text(json.dumps([str(p) for p in inputs]))
    (work / "losses.json").write_text(json.dumps(losses))


@pytest.fixture(scope="session")
def one_process(tmp_path_factory):
    """The inputs, and one process's result and per-step losses on them (what both layouts are checked against):
    run once per test run, whichever worker gets tp2 or pp2 first (tests/helpers/shared.py)."""
    from infra.stages import read_result
    from tasks.training.pretrain.stage import Pretrain

    work = shared_once(tmp_path_factory, "parallel-one-process", _build_one_process)
    inputs = tuple(Path(p) for p in json.loads((work / "inputs.json").read_text()))
    losses = json.loads((work / "losses.json").read_text())
    single = read_result(Pretrain(_bench().layout_config("single", STEPS)), work / "single")
    assert len(losses) == STEPS
    return inputs, single, losses


@pytest.mark.slow
@pytest.mark.timeout(1800)  # three launches of DeepSpeed, each a minute or more on a busy 2-core machine
@pytest.mark.parametrize("name", ["tp2", "pp2"])
def test_layout_trains_like_one_process_resumes_exactly_and_exports(name, one_process, tmp_path, monkeypatch):
    inputs, single, single_losses = one_process
    work = tmp_path  # this layout's runs and MLflow store; the inputs and one process's run are shared
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result, losses = _run(name, work, inputs, every=2)
    assert result.world_size == 2 and result.layout == {"tp2": "dp1_tp2_pp1", "pp2": "dp1_tp1_pp2"}[name]
    assert len(result.peak_bytes_per_rank) == 2 and result.plan_bytes_per_device > 0
    assert len(losses) == STEPS
    for step, (a, b) in enumerate(zip(losses, single_losses), start=1):
        assert abs(a - b) <= 1e-4 * abs(b), f"{name} step {step}: loss {a} vs one process's {b}"
    # The same whole model as one process's, in the same folders and keys.
    whole, alone = _weights(result.model_dir), _weights(single.model_dir)
    assert set(whole) == set(alone)
    for key in whole:
        torch.testing.assert_close(whole[key], alone[key], rtol=1e-4, atol=1e-5)
    assert json.loads((result.hf_dir / "config.json").read_text()) == json.loads(
        (single.hf_dir / "config.json").read_text())

    # Interrupted after step 2: the step-4 checkpoint and the outputs gone, a rerun resumes from step 2.
    out = work / name
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == ["step00000002", "step00000004"]
    shutil.rmtree(ckpts / "step00000004")
    (ckpts / "latest").write_text("step00000002")
    for done in ("model", "hf", "result.json"):
        path = out / done
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    resumed, _ = _run(name, work, inputs, every=2)
    assert resumed.final_train_loss == pytest.approx(result.final_train_loss, rel=1e-6)
    again = _weights(resumed.model_dir)
    for key in whole:
        torch.testing.assert_close(again[key], whole[key], rtol=1e-6, atol=1e-7)
