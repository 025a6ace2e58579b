"""The data a run read, as MLflow dataset inputs (infra/tracking/datasets.py) against a real SQLite store: the shards
named and digested by their manifest, held-out targets by their bytes, each with its context; logging one again
changes nothing; and a pretraining run finds its shards through the record of the tokens it read."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from pydantic import BaseModel

from infra.stages import Stage, recorded_inputs, run
from infra.tracking.datasets import SHARDS, log_shards_input, log_target_inputs
from infra.tracking.runs import stage_run
from infra.workspace.paths import Workspace


def _inputs(run_id: str) -> dict[str, tuple[str, str, dict[str, str]]]:
    """name -> (digest, source URI, input tags) of the run's dataset inputs."""
    from mlflow.tracking import MlflowClient

    found = MlflowClient().get_run(run_id).inputs.dataset_inputs
    return {d.dataset.name: (d.dataset.digest, json.loads(d.dataset.source)["uri"], {t.key: t.value for t in d.tags})
            for d in found}


def _manifest(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "manifest.json"
    path.write_text(json.dumps({"shards": [{"file": "shard-00000.parquet", "rows": 3}], "stats": {"rows": 3}}))
    return path


def test_the_shards_are_named_and_digested_by_their_manifest_and_logged_once(ws, tmp_path) -> None:
    manifest = _manifest(tmp_path / "shards")
    with stage_run(ws, "pretrain") as mlflow_run:
        log_shards_input(mlflow_run.info.run_id, manifest, tags={"rows": "3"})
        log_shards_input(mlflow_run.info.run_id, manifest, tags={"rows": "3"})  # a rerun's: nothing new
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
    assert _inputs(mlflow_run.info.run_id) == {
        SHARDS: (digest, manifest.resolve().as_uri(), {"mlflow.data.context": "training", "rows": "3"})}


def test_targets_are_evaluation_inputs_digested_by_their_bytes_even_on_an_ended_run(ws, tmp_path) -> None:
    targets = {"news": tmp_path / "news.txt", "code": tmp_path / "code.jsonl"}
    targets["news"].write_text("held-out news text\n")
    targets["code"].write_text('{"text": "def f(): pass"}\n')
    with stage_run(ws, "pretrain") as mlflow_run:
        pass
    log_target_inputs(mlflow_run.info.run_id, targets)  # the ablation scores its proxies after they ended
    log_target_inputs(mlflow_run.info.run_id, targets)
    assert _inputs(mlflow_run.info.run_id) == {
        name: (hashlib.sha256(path.read_bytes()).hexdigest()[:16], path.resolve().as_uri(),
               {"mlflow.data.context": "evaluation"})
        for name, path in targets.items()}


class Shards(Stage):
    name, store, Config, Result = "write_shards", "data/shards", int, Path

    def compute(self, inputs: dict, out_dir: Path) -> Path:
        return _manifest(out_dir)


class Tokens(BaseModel):
    folder: Path


class Tokenize(Stage):
    name, store, Config, Result = "tokenize_shards", "tokens", int, Tokens
    inputs = ("manifest", "tokenizer")

    def compute(self, inputs: dict, out_dir: Path) -> Tokens:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "train.bin").write_bytes(inputs["manifest"].read_bytes())
        return Tokens(folder=out_dir)


def test_a_pretraining_run_logs_the_shards_its_tokens_were_made_from(ws, tmp_path, capsys) -> None:
    from tasks.training.pretrain.stage import log_data_input

    tokenizer = tmp_path / "outside" / "tokenizer.json"
    tokenizer.parent.mkdir()
    tokenizer.write_text("{}")
    manifest = run(Shards(1), ws)
    tokens = run(Tokenize(1), ws, manifest=manifest, tokenizer=tokenizer).folder
    # Inside the workspace relative to the folder, so a moved workspace still finds it; outside it absolute.
    assert recorded_inputs(tokens) == {"manifest": manifest, "tokenizer": tokenizer.resolve()}

    moved = Workspace(tmp_path / "moved")
    shutil.copytree(ws.root, moved.root, symlinks=True)
    there = moved.root / tokens.relative_to(ws.root)
    assert recorded_inputs(there)["manifest"] == moved.root / manifest.relative_to(ws.root)
    with stage_run(moved, "pretrain") as mlflow_run:
        log_data_input(there)
    (name, (digest, uri, tags)), = _inputs(mlflow_run.info.run_id).items()
    assert (name, uri, tags) == (SHARDS, (moved.root / manifest.relative_to(ws.root)).as_uri(),
                                 {"mlflow.data.context": "training"})
    assert digest == hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]

    # Tokens no stage wrote (a test's, a hand-made folder) name no manifest: a line, and no input.
    with stage_run(moved, "pretrain") as plain:
        log_data_input(tmp_path / "outside")
    assert _inputs(plain.info.run_id) == {}
    assert "names no data manifest it was tokenized from" in capsys.readouterr().out
