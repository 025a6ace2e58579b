"""The whole pipeline: data → pretrain → SFT → GRPO → evaluation, each a subflow.

One MLflow parent run with a nested run per stage; a stage whose inputs and config are
unchanged is skipped on rerun, so a failed run resumes from the stage that failed.
"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow
from pydantic import BaseModel

from flows.config import PipelineConfig, preset_differences, resolve_pipeline_config
from flows.data_flow import DataResult, data_flow
from flows.eval_flow import eval_flow
from flows.tokens import TokenizedData, tokenized
from infra.config import config_hash
from infra.lifecycle.clock import RunClock
from infra.lifecycle.signals import stop_on_cancel
from infra.stages import run
from infra.tracking.identity import RunIdentity
from infra.tracking.runs import describe_overrides, describe_run, stage_run
from infra.workspace.cache import flow_key
from infra.workspace.lock import workspace_lock
from infra.workspace.paths import Workspace
from tasks.data.catalog import load_catalog
from tasks.data.collect import source_inputs
from tasks.eval.evaluate import EvalResult
from tasks.reports.card import publish_pipeline_report, record_attempt
from tasks.reports.pretrain import log_pretrain_report
from tasks.training.grpo.stage import Grpo, GrpoResult
from tasks.training.pretrain.stage import Pretrain, PretrainResult
from tasks.training.sft.stage import Sft, SftResult


class PipelineResult(BaseModel):
    """What one pipeline run made: each stage's result, the report card and the registered model version."""

    mlflow_run_id: str
    data: DataResult
    tokenized: TokenizedData
    pretrain: PretrainResult
    sft: SftResult
    grpo: GrpoResult
    evals: dict[str, EvalResult]
    report: Path
    registered_version: str


@flow(name="pipeline", log_prints=True)
def pipeline_flow(config: PipelineConfig | None = None, workdir: str | None = None, preset: str = "tiny",
                  overrides: list[str] | None = None) -> PipelineResult:
    """Run every stage with `config`, else `preset` (infra/presets/<name>.yaml) plus `overrides` ("key=value");
    with a `config`, `overrides` are those already applied to it, naming the runs.

    `workdir` None is the workspace of `Workspace.locate`: `$LLMFORGE_HOME`, else ./work.
    """
    config = resolve_pipeline_config(config, preset, overrides, workdir)
    identity = RunIdentity.here(preset, overrides, preset_differences(config, preset, workdir))
    started = time.time()
    ws = Workspace.locate(workdir).ensure_writable()
    record_attempt(ws, config, started)  # the report sums the attempts of this config
    root = str(ws.root)
    catalog = load_catalog(config.data.catalog, only=config.data.sources)
    sources = {s.name: source_inputs(catalog, s) for s in catalog.sources}
    with stop_on_cancel(), workspace_lock(ws), stage_run(
        ws, "pipeline", config, tags={"llmforge.config_hash": config_hash(config), **identity.tags()},
        run_name=f"pipeline {describe_overrides(overrides or [])}".strip(),
        run_key=flow_key("pipeline", __name__, config, sources),
    ) as pipeline_run:
        describe_run(pipeline_run, identity)
        clock = RunClock(config.expected_minutes)
        with clock.stage("data", "collect, dedup, filter, mix, shard"):
            data = data_flow(config.data, workdir=root,
                             overrides=[o for o in overrides or [] if o.startswith("data.")])
        with clock.stage("pretrain", "tokenizer, token shards, DeepSpeed pretraining"):
            tok = tokenized(ws, data.manifest, config.tokenizer, config.tokenize)
            base = run(Pretrain(config.pretrain), ws, tokens=tok.tokens, tokenizer=tok.tokenizer)
            print(log_pretrain_report(base, tok.tokens, ws.run_reports(pipeline_run.info.run_id)))
        with clock.stage("sft", "supervised fine-tuning"):
            sft = run(Sft(config.sft), ws, base=base.model_dir, tokenizer=tok.tokenizer, tokens=tok.tokens,
                      task=config.arithmetic)
        with clock.stage("grpo", "reinforcement learning with verifiable rewards"):
            grpo = run(Grpo(config.grpo), ws, sft=sft.model_dir, tokenizer=tok.tokenizer, task=config.arithmetic)
        with clock.stage("evaluate", "calibration of base, SFT and GRPO; report card"):
            models = {"base": str(base.model_dir), "sft": str(sft.model_dir), "grpo": str(grpo.model_dir)}
            evals = eval_flow(config.eval, models, tokens=str(tok.tokens), tokenizer=str(tok.tokenizer),
                              task=config.arithmetic, workdir=root,
                              contaminated=str(data.contaminated) if data.contaminated else None)
        report = publish_pipeline_report(ws, config, data, tok, base, sft, grpo, evals, time.time() - started, identity)
        print(report.markdown)
        return PipelineResult(
            mlflow_run_id=pipeline_run.info.run_id, data=data, tokenized=tok, pretrain=base, sft=sft, grpo=grpo,
            evals=evals, report=report.path, registered_version=report.model_version,
        )
