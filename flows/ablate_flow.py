"""`llmforge ablate FILE`: one proxy model per data variant and seed, scored on held-out targets, and which variants
differ from the baseline beyond seed noise.

    variants (FILE's `variants`, plus `baseline` with no overrides; `--preset`/`--set` apply to all)
      → each variant's data flow (stages they share are cached once)
      → one tokenizer, trained on the baseline's shards; every variant's shards tokenized with it
      → a proxy pretraining per variant x seed (the preset's pretraining plus FILE's `proxy`), through the run queue
      → each proxy scored on every target, window by window (tasks/eval/score_targets.py)
      → variant - baseline per target, paired by seed and window, a 95% interval and a verdict
        (tasks/eval/seed_differences.py); with `aa: true` the baseline again on disjoint seeds
      → ablation.json, report.md and ablation.png in work/ablate/<key>/

One MLflow parent run `ablate` with each proxy's pretraining run nested under it, tagged `variant`, `seed` and
`overrides`. Every variant trains the same model for the same steps on the same tokenizer: only the data, or the
setting it names, differs. Seed i of every variant starts from the same weights.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.tracking import MlflowClient
from prefect import flow
from pydantic import BaseModel

from flows.ablation_spec import AA, BASELINE, as_overrides, load_spec, variant_overrides
from flows.config import PipelineConfig, resolve_pipeline_config
from flows.data_flow import data_flow
from flows.tokens import tokens_of
from infra.run_queue import Queued, flow_of_runs
from infra.stages import run
from infra.tracking.runs import log_metrics, tag_active_run
from infra.workspace.atomic import write_json_atomic
from infra.workspace.cache import flow_key
from infra.workspace.paths import Workspace, point_latest
from tasks.eval.score_targets import ScoreTargets, ScoreTargetsConfig
from tasks.eval.seed_differences import Difference, bits_per_byte, bpb_difference
from tasks.reports.ablation import publish_ablation_report
from tasks.tokenizer.train import TrainTokenizer
from tasks.training.config import PretrainConfig
from tasks.training.pretrain.stage import Pretrain

STORE = "ablate"
def proxy_config(config: PipelineConfig, seed: int) -> PretrainConfig:
    """A variant's pretraining as a proxy: its seed, no export for transformers, one checkpoint at the end."""
    data = config.pretrain.model_dump()
    data.update(seed=seed, export_hf=False)
    data["checkpoint"]["every"] = 0
    data["log"]["eval_every"] = 0
    return PretrainConfig.model_validate(data)


class Arm(BaseModel):
    """One variant (or the A/A baseline) over its seeds: its proxies' runs and scores."""

    name: str
    overrides: dict[str, Any]
    seeds: list[int]
    runs: list[str | None] = []  # MLflow run ids
    models: list[str] = []
    values: dict[str, list[float]] = {}  # target -> bits per byte per seed
    vs_baseline: dict[str, Difference] = {}


class AblationResult(BaseModel):
    mlflow_run_id: str
    folder: Path
    arms: dict[str, Arm]
    report: Path


@flow(name="ablate", log_prints=True)
def ablate_flow(file: str, workdir: str | None = None, preset: str = "tiny",
                overrides: list[str] | None = None) -> AblationResult:
    """The ablation FILE names, on `preset` plus `overrides` (for every variant; a variant's own keys win)."""
    spec = load_spec(Path(file))
    named = {BASELINE: {}, **spec.variants}
    configs = {n: resolve_pipeline_config(None, preset, sets, workdir)
               for n, sets in variant_overrides(spec, list(overrides or [])).items()}
    base = configs[BASELINE]
    ws = Workspace.locate(workdir).ensure_writable()
    root = str(ws.root)
    what = {"spec": spec.model_dump(mode="json"), "configs": {n: c.model_dump(mode="json") for n, c in configs.items()}}
    with flow_of_runs(ws, "ablate", what, base.runs, run_name=f"ablate {Path(file).stem}",
                      run_key=flow_key("ablate", __name__, what, {"targets": spec.targets})) as (parent, queue):
        # Each variant's data: the stages two variants share run once (content-addressed).
        manifests = {n: Path(data_flow(c.data, workdir=root, overrides=as_overrides(
            {k: v for k, v in named[n].items() if k.startswith("data.")})).manifest) for n, c in configs.items()}
        tokenizer = run(TrainTokenizer(base.tokenizer), ws, manifest=manifests[BASELINE])
        tokens = {n: tokens_of(ws, manifests[n], tokenizer, c.tokenize) for n, c in configs.items()}
        seeds = list(range(spec.seeds))
        arms = {n: Arm(name=n, overrides=named[n], seeds=seeds) for n in named}
        if spec.aa:
            arms[AA] = Arm(name=AA, overrides={}, seeds=[spec.seeds + s for s in seeds])
        queued, order = [], []
        for arm in arms.values():
            config = configs[BASELINE if arm.name == AA else arm.name]
            for seed in arm.seeds:
                cfg = proxy_config(config, seed)
                queued.append(Queued(Pretrain(cfg), {"tokens": tokens[BASELINE if arm.name == AA else arm.name],
                                                     "tokenizer": tokenizer}, f"{arm.name} seed {seed}", cfg.steps))
                order.append((arm.name, seed))
        print(f"{len(queued)} proxies: {len(named)} variant(s){' + A/A' if spec.aa else ''} x {spec.seeds} seed(s); "
              f"targets {sorted(spec.targets)}")
        results = queue.run(queued)
        client = MlflowClient()
        scoring = ScoreTargets(ScoreTargetsConfig(seq_len=base.pretrain.batch.seq_len))
        scores: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        for (name, seed), result in zip(order, results):
            arm = arms[name]
            arm.runs.append(result.mlflow_run_id)
            arm.models.append(str(result.model_dir))
            if result.mlflow_run_id:
                for key, value in (("variant", name), ("seed", str(seed)), ("overrides", json.dumps(arm.overrides))):
                    client.set_tag(result.mlflow_run_id, key, value)
            scored = run(scoring, ws, model=result.model_dir, tokenizer=tokenizer, targets=dict(spec.targets))
            scores[name, seed] = {t: np.load(f) for t, f in scored.files.items()}
            for target, values in scores[name, seed].items():
                arm.values.setdefault(target, []).append(bits_per_byte(values))
        baseline = [scores[BASELINE, s] for s in arms[BASELINE].seeds]
        for arm in arms.values():
            if arm.name == BASELINE:
                continue
            mine = [scores[arm.name, s] for s in arm.seeds]
            for target in spec.targets:
                arm.vs_baseline[target] = bpb_difference([m[target] for m in mine], [b[target] for b in baseline])
        folder = ws.output(STORE, flow_key("ablate", __name__, what, {"tokenizer": tokenizer, "tokens": tokens,
                                                                      "targets": spec.targets}))
        folder.mkdir(parents=True, exist_ok=True)
        tag_active_run(f"llmforge.out.{STORE}.{folder.name}", f"{STORE}/{folder.name}")
        document = ablation_document(arms, sorted(spec.targets))
        write_json_atomic(folder / "ablation.json", document)
        report = publish_ablation_report(folder, document)  # report.md, ablation.png, ablation.json as artifacts
        log_metrics({f"{a.name}.{t}.diff": d.diff for a in arms.values() for t, d in a.vs_baseline.items()})
        point_latest(ws.latest(STORE), folder)
        print(report.markdown)
        return AblationResult(mlflow_run_id=parent.info.run_id, folder=folder, arms=arms, report=report.path)


def ablation_document(arms: dict[str, Arm], targets: list[str]) -> dict[str, Any]:
    """ablation.json: the baseline's name, the targets, each variant's seeds, values and verdicts, the A/A check."""
    def shape(arm: Arm) -> dict[str, Any]:
        return {"overrides": arm.overrides, "seeds": arm.seeds, "runs": arm.runs, "values": arm.values,
                "vs_baseline": {t: d.model_dump(mode="json") for t, d in arm.vs_baseline.items()}}
    return {"baseline": BASELINE, "targets": targets, "lower_is_better": True, "metric": "bits per byte",
            "variants": {n: shape(a) for n, a in arms.items() if n != AA},
            "aa": shape(arms[AA]) if AA in arms else None}
