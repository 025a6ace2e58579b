"""The scaling flow: an IsoFLOP sweep of ordinary pretraining runs, its fits, and a larger run predicted, then trained.

    data → tokenizer → token shards (as the pipeline's: the same cached stages)
    for each budget C and each size N of the family: run(Pretrain(point), ...)   cached: a rerun trains only what is missing
    fit (Chinchilla approaches 2 and 3, bootstrap) → prediction.json at predict_factor x the largest C, fit.json
    run(Pretrain(the predicted run), ...) → prediction.json with measured_bpb → report

One MLflow parent run (`scale`) with each point's pretraining run nested under it, tagged with
`n_params`, `tokens`, `flops` and `depth` (params) beside the `final_val_bpb` and `final_val_loss` its
rank 0 logged: MLflow's chart view plots loss against size per budget. The points go through the flow's
RunQueue (infra/run_queue.py, the `runs:` section): a few DeepSpeed launches side by side, each training its
share of the points one after another, on this machine's cores or, with `runs.executor: ray`, on a Ray
cluster's nodes. Where they run changes no point's key or result.
"""
from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient
from prefect import flow
from pydantic import BaseModel

from flows.config import PipelineConfig, resolve_pipeline_config
from flows.data_flow import data_flow
from flows.tokens import tokenized
from infra.launch.ray_cluster import on_ray_task_runner, ray_task_runner
from infra.run_queue import Queued, flow_of_runs
from infra.tracking.runs import describe_overrides, log_metrics, tag_active_run
from infra.workspace.atomic import write_json_atomic
from infra.workspace.cache import flow_key
from infra.workspace.paths import Workspace, point_latest
from tasks.data.catalog import load_catalog
from tasks.data.collect import source_inputs
from tasks.reports.scaling import publish_scale_report
from tasks.tokenizer.tokenize_shards import load_token_index
from tasks.tokenizer.train import load_tokenizer
from tasks.training.pretrain.stage import Pretrain
from tasks.training.scaling.fit_record import SWEEPS, write_fit
from tasks.training.scaling.prediction import Prediction, fit_problem, fit_sweep, predict_run, write_prediction
from tasks.training.scaling.sweep import (MeasuredPoint, epoch_warnings, measured_point, plan_sweep, point_config,
                                          sweep_members, sweep_pretrain, sweep_tokenizer)

STORE = SWEEPS  # the workspace store of the sweeps, where later runs look for a fit.json


class ScaleResult(BaseModel):
    """What a sweep made: its measured points, the prediction (None when the sweep is too small to fit), the report."""

    mlflow_run_id: str
    folder: Path
    points: list[MeasuredPoint]
    prediction: Prediction | None
    report: Path


def record_point(run_id: str | None, point) -> None:
    """The sweep's params on a point's own pretraining run. Each is a function of the run's own config (its key), so
    a point reused by another sweep logs the same values again, which MLflow accepts; the budget label is left out
    for that reason (two budgets can round to the same steps)."""
    if run_id is None:
        return
    client = MlflowClient()
    for key, value in (("n_params", point.n_params), ("tokens", point.tokens), ("flops", f"{point.flops:.6g}"),
                       ("depth", point.depth)):
        client.log_param(run_id, key, value)


@flow(name="scale", log_prints=True)
def scale_flow(config: PipelineConfig | None = None, workdir: str | None = None, preset: str = "tiny",
               overrides: list[str] | None = None) -> ScaleResult:
    """The sweep of `config`'s `scale` section, else `preset`'s, plus `overrides` ("scale.budgets=[1e12,2e12]")."""
    config = resolve_pipeline_config(config, preset, overrides, workdir)
    if config.runs.executor == "ray" and not on_ray_task_runner():
        return scale_flow.with_options(task_runner=ray_task_runner(config.runs.ray_address))(
            config, workdir=workdir, preset=preset, overrides=overrides)
    ws = Workspace.locate(workdir).ensure_writable()
    root = str(ws.root)
    catalog = load_catalog(config.data.catalog, only=config.data.sources)
    sources = {s.name: source_inputs(catalog, s) for s in catalog.sources}
    tokenizer, pretrain = sweep_tokenizer(config.tokenizer, config.scale), sweep_pretrain(config.pretrain, config.scale)
    what = {"data": config.data.outputs_identity(), "tokenizer": tokenizer, "tokenize": config.tokenize,
            "pretrain": config.pretrain, "scale": config.scale}
    # How the runs are placed (config.runs) changes no run's key and no result: it is not in the sweep's key.
    with flow_of_runs(ws, "scale", what, config.runs, run_name=f"scale {describe_overrides(overrides or [])}".strip(),
                      run_key=flow_key("scale", __name__, what, sources)) as (sweep_run, queue):
        data = data_flow(config.data, workdir=root, overrides=[o for o in overrides or [] if o.startswith("data.")])
        tok = tokenized(ws, data.manifest, tokenizer, config.tokenize)
        vocab_size = load_tokenizer(tok.tokenizer).get_vocab_size()
        index = load_token_index(tok.tokens)
        train_tokens, val_tokens = index.tokens("train"), index.tokens("val")
        members = sweep_members(config.scale, pretrain, vocab_size)
        plan = plan_sweep(config.scale, pretrain, vocab_size)
        # The sweep's folder is keyed on what the sweep is, the data it trains on and this flow's code.
        folder = ws.output(STORE, flow_key("scale", __name__, what, {"tokens": tok.tokens, "tokenizer": tok.tokenizer}))
        folder.mkdir(parents=True, exist_ok=True)
        tag_active_run(f"llmforge.out.{STORE}.{folder.name}", f"{STORE}/{folder.name}")
        warnings = epoch_warnings(plan, train_tokens)
        unfit = fit_problem(plan)  # said before the points train, not after
        for line in warnings + ([unfit] if unfit else []):
            print(f"WARNING: {line}")

        def train(points: list, labels: list[str]) -> list[MeasuredPoint]:
            """The points' pretraining runs through the flow's queue (longest first: a point's time follows its steps
            more than its FLOPs at these sizes), each recorded on its MLflow run."""
            queued = []
            for point, label in zip(points, labels):
                print(f"{label}: depth {point.depth}, N={point.n_params:,}, D={point.tokens:,} tokens "
                      f"({point.tokens_per_param:.1f}/param, {point.tokens / train_tokens:.2f} epochs), C={point.flops:.3g}")
                queued.append(Queued(Pretrain(point_config(pretrain, point, config.scale, val_tokens)),
                                     {"tokens": tok.tokens, "tokenizer": tok.tokenizer}, label, point.steps))
            measured = [measured_point(p, r, train_tokens) for p, r in zip(points, queue.run(queued))]
            for m in measured:
                record_point(m.mlflow_run_id, m)
            return measured

        points = train(plan, [f"point {i}/{len(plan)} at C={p.budget:.3g}" for i, p in enumerate(plan, start=1)])
        write_json_atomic(folder / "points.json", [p.model_dump(mode="json") for p in points])

        sb = intervals = prediction = None
        note = fit_problem(points)
        if note is None:
            try:
                sb = fit_sweep(points, members, config.scale)
            except ValueError as exc:  # a budget whose curve has no minimum among its sizes, named
                note = str(exc)
        if sb is not None:
            budget = config.scale.predict_factor * max(config.scale.budgets)
            prediction = predict_run(sb, members, budget, pretrain, config.scale)
            intervals = sb.intervals(budget)
            write_prediction(folder, prediction)  # written down before the run exists
            write_fit(folder, sb, index)  # the predicted run's report (and later runs on these shards) read its ratio
            for line in epoch_warnings([prediction.point()], train_tokens):
                print(f"WARNING: {line}")
                warnings.append(line)
            log_metrics({"predicted_bpb": prediction.predicted_bpb, "predicted_bpb_low": prediction.interval[0],
                         "predicted_bpb_high": prediction.interval[1], "predicted_n_params": prediction.n_params,
                         "predicted_tokens": prediction.tokens})
            print(f"prediction at C={budget:.3g}: depth {prediction.depth}, N={prediction.n_params:,}, "
                  f"D={prediction.tokens:,}: {prediction.predicted_bpb:.4f} bits/byte, 95% interval "
                  f"[{prediction.interval[0]:.4f}, {prediction.interval[1]:.4f}] ({folder / 'prediction.json'})")
            (measured,) = train([prediction.point()], [f"predicted run at C={budget:.3g}"])
            prediction = prediction.measured(measured)
            write_prediction(folder, prediction)
            log_metrics({"measured_bpb": prediction.measured_bpb, "prediction_error": prediction.error})
            print(f"predicted {prediction.predicted_bpb:.4f}, measured {prediction.measured_bpb:.4f} bits/byte "
                  f"({prediction.error:+.2%}; {'inside' if prediction.inside else 'OUTSIDE'} the 95% interval)")
        else:
            print(f"no fit: {note}")
        report = publish_scale_report(folder, points, train_tokens, sb, intervals, prediction, warnings, note)
        point_latest(ws.latest(STORE), folder)
        print(report.markdown)
        return ScaleResult(mlflow_run_id=sweep_run.info.run_id, folder=folder, points=points, prediction=prediction,
                           report=report.path)
