"""`llmforge ablate [FILE]`: one proxy model per data variant and seed, scored on held-out targets, and which variants
differ from the baseline beyond seed noise. No FILE: the built-in ablation (flows/ablation_spec.py BUILTIN).

    variants (FILE's `variants`, plus `baseline` with no overrides; `--preset`/`--set` apply to all)
      → each variant's data flow (stages they share are cached once); no `targets`: each source's held-out slice
      → one tokenizer, FILE's `tokenizer` or one trained on the baseline's shards; every variant's shards tokenized
        with it
      → a proxy pretraining per variant x seed (the preset's pretraining plus FILE's `proxy`), through the run queue
      → with `until`: its SFT, then GRPO, through the run queue; with `until: evaluate`, the evaluation's metrics
      → each proxy scored on every target, window by window (tasks/eval/score_targets.py)
      → variant - baseline per target (paired by seed and window) and per metric (paired by seed), a 95% interval
        and a verdict (tasks/eval/seed_differences.py); with `aa: true` the baseline again on disjoint seeds
      → ablation.json, report.md and ablation.png in work/ablate/<key>/

One MLflow parent run `ablate` with each proxy's runs nested under it, tagged `variant`, `seed` and `overrides`.
Every variant trains the same model for the same steps on the same tokenizer: only the data, or the setting it
names, differs. Seed i of every variant starts from the same weights.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.tracking import MlflowClient
from prefect import flow
from pydantic import BaseModel

from flows.ablation_spec import AA, BASELINE, BUILTIN, as_overrides, check_metrics, load_spec, variant_overrides
from flows.config import resolve_pipeline_config
from flows.data_flow import data_flow
from flows.eval_flow import eval_flow
from flows.proxies import held_out_targets, proxy_config, scores_of
from flows.tokens import tokens_of
from infra.run_queue import Queued, flow_of_runs
from infra.stages import run
from infra.tracking.datasets import log_target_inputs
from infra.tracking.runs import log_metrics, tag_active_run
from infra.workspace.atomic import write_json_atomic
from infra.workspace.cache import flow_key
from infra.workspace.paths import Workspace, point_latest
from tasks.eval.seed_differences import Difference, bits_per_byte, bpb_difference, value_difference
from tasks.reports.ablation import publish_ablation_report
from tasks.tokenizer.train import TrainTokenizer
from tasks.training.config import TrainingConfig
from tasks.training.grpo.stage import Grpo
from tasks.training.pretrain.stage import Pretrain
from tasks.training.sft.stage import Sft

STORE = "ablate"
STAGES = ("pretrain", "sft", "grpo", "evaluate")  # what `until` may name, in order
class Arm(BaseModel):
    """One variant (or the A/A baseline) over its seeds: its proxies' runs and scores."""

    name: str
    overrides: dict[str, Any]
    seeds: list[int]
    runs: list[str | None] = []  # MLflow run ids
    models: list[str] = []
    values: dict[str, list[float]] = {}  # target -> bits per byte per seed; metric -> its value per seed
    scores: dict[str, list[str]] = {}  # target -> per seed, its windows' (nats, bytes) (.npy, ScoreTargets')
    vs_baseline: dict[str, Difference] = {}


class AblationResult(BaseModel):
    mlflow_run_id: str
    folder: Path
    arms: dict[str, Arm]
    report: Path


@flow(name="ablate", log_prints=True)
def ablate_flow(file: str | None = None, workdir: str | None = None, preset: str = "tiny",
                overrides: list[str] | None = None) -> AblationResult:
    """The ablation FILE names (None: the built-in one), on `preset` plus `overrides` (for every variant; a variant's
    own keys win)."""
    file = file or str(BUILTIN)
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
        data = {n: data_flow(c.data, workdir=root, overrides=as_overrides(
            {k: v for k, v in named[n].items() if k.startswith("data.")})) for n, c in configs.items()}
        manifests = {n: Path(d.manifest) for n, d in data.items()}
        targets = dict(spec.targets) or held_out_targets(data[BASELINE])
        tokenizer = spec.tokenizer or run(TrainTokenizer(base.tokenizer), ws, manifest=manifests[BASELINE])
        tokens = {n: tokens_of(ws, manifests[n], tokenizer, c.tokenize) for n, c in configs.items()}
        seeds = list(range(spec.seeds))
        arms = {n: Arm(name=n, overrides=named[n], seeds=seeds) for n in named}
        if spec.aa:
            arms[AA] = Arm(name=AA, overrides={}, seeds=[spec.seeds + s for s in seeds])
        check_metrics(spec, file, base.eval.tasks)  # before any training (the CLI checked it too, before the services)
        order = [(arm.name, seed) for arm in arms.values() for seed in arm.seeds]
        config_of = {(n, s): configs[BASELINE if n == AA else n] for n, s in order}
        data_of = {(n, s): BASELINE if n == AA else n for n, s in order}
        print(f"{len(order)} proxies: {len(named)} variant(s){' + A/A' if spec.aa else ''} x {spec.seeds} seed(s), "
              f"until {spec.until}; targets {sorted(targets)}"
              f"{'' if spec.targets else ' (the held-out slice of every source)'}")
        results = queue.run([Queued(Pretrain(c := proxy_config(config_of[k].pretrain, k[1])),
                                    {"tokens": tokens[data_of[k]], "tokenizer": tokenizer}, f"{k[0]} seed {k[1]}",
                                    c.steps) for k in order])
        trained = {k: {"base": r} for k, r in zip(order, results)}
        if reaches(spec.until, "sft"):
            sfts = queue.run([Queued(Sft(c := seeded(config_of[k].sft, k[1])), {
                "base": trained[k]["base"].model_dir, "tokenizer": tokenizer, "tokens": tokens[data_of[k]],
                "task": config_of[k].arithmetic}, f"SFT of {k[0]} seed {k[1]}", c.steps) for k in order])
            for k, r in zip(order, sfts):
                trained[k]["sft"] = r
        if reaches(spec.until, "grpo"):
            grpos = queue.run([Queued(Grpo(c := seeded(config_of[k].grpo, k[1])), {
                "sft": trained[k]["sft"].model_dir, "tokenizer": tokenizer, "task": config_of[k].arithmetic},
                f"GRPO of {k[0]} seed {k[1]}", c.steps) for k in order])
            for k, r in zip(order, grpos):
                trained[k]["grpo"] = r
        client = MlflowClient()
        scores: dict[tuple[str, int], dict[str, np.ndarray]] = {}
        arms_of: dict[str, tuple[int, list[str]]] = {}  # MLflow run -> its seed and the arms it serves
        for (name, seed), made in trained.items():
            arm = arms[name]
            arm.runs.append(made["base"].mlflow_run_id)
            arm.models.append(str(made["base"].model_dir))
            for result in made.values():
                if result.mlflow_run_id:
                    arms_of.setdefault(result.mlflow_run_id, (seed, []))[1].append(name)
            scored = scores_of(ws, made["base"].model_dir, tokenizer, targets, base.pretrain.batch.seq_len)
            if made["base"].mlflow_run_id:
                log_target_inputs(made["base"].mlflow_run_id, targets)
            scores[name, seed] = scored.arrays()
            for target, file in scored.files.items():
                arm.scores.setdefault(target, []).append(str(file))
            for target, values in scores[name, seed].items():
                arm.values.setdefault(target, []).append(bits_per_byte(values))
            if spec.until == "evaluate":
                config = config_of[name, seed]
                evals = eval_flow(config.eval, {m: str(r.model_dir) for m, r in made.items()},
                                  tokens=str(tokens[data_of[name, seed]]), tokenizer=str(tokenizer),
                                  task=config.arithmetic, workdir=root)
                for key in spec.metrics:
                    model, _, metric = key.partition(".")
                    measured = evals[model].metrics()
                    if metric not in measured:  # e.g. answer calibration where no response stated an answer
                        print(f"metric '{key}': the evaluation of {name} seed {seed}'s {model} model did not compute "
                              "it; that seed pair is left out of its comparison")
                    arm.values.setdefault(key, []).append(measured.get(metric, math.nan))
        for run_id, (seed, names) in arms_of.items():  # a run two variants share (their pretraining) names both
            overrides = {n: arms[n].overrides for n in names}
            for key, value in (("variant", ",".join(names)), ("seed", str(seed)),
                               ("overrides", json.dumps(overrides[names[0]] if len(names) == 1 else overrides))):
                client.set_tag(run_id, key, value)
        baseline = [scores[BASELINE, s] for s in arms[BASELINE].seeds]
        for arm in arms.values():
            if arm.name == BASELINE:
                continue
            mine = [scores[arm.name, s] for s in arm.seeds]
            for target in targets:
                arm.vs_baseline[target] = bpb_difference([m[target] for m in mine], [b[target] for b in baseline])
            for key, better in spec.metrics.items():  # paired by seed: seed i of every variant starts alike
                arm.vs_baseline[key] = value_difference(arm.values[key], arms[BASELINE].values[key],
                                                        higher_is_better=better == "higher")
        folder = ws.output(STORE, flow_key("ablate", __name__, what, {"tokenizer": tokenizer, "tokens": tokens,
                                                                      "targets": targets}))
        folder.mkdir(parents=True, exist_ok=True)
        tag_active_run(f"llmforge.out.{STORE}.{folder.name}", f"{STORE}/{folder.name}")
        document = ablation_document(arms, sorted(targets), spec.metrics)
        write_json_atomic(folder / "ablation.json", document)
        report = publish_ablation_report(folder, document)  # report.md, ablation.png, ablation.json as artifacts
        log_metrics({f"{a.name}.{t}.diff": d.diff for a in arms.values() for t, d in a.vs_baseline.items()
                     if not math.isnan(d.diff)})
        point_latest(ws.latest(STORE), folder)
        print(report.markdown)
        return AblationResult(mlflow_run_id=parent.info.run_id, folder=folder, arms=arms, report=report.path)


def reaches(until: str, stage: str) -> bool:
    """Whether a variant that runs until `until` runs `stage`."""
    return STAGES.index(until) >= STAGES.index(stage)


def seeded(config: TrainingConfig, seed: int) -> TrainingConfig:
    """A post-training stage's config with the arm's seed: seed i of every variant alike."""
    return config.model_copy(update={"seed": seed})


def ablation_document(arms: dict[str, Arm], targets: list[str],
                      metrics: dict[str, str] | None = None) -> dict[str, Any]:
    """ablation.json: the baseline's name, the targets (bits per byte, lower is better), the metrics with which way
    is better, each variant's seeds, values and verdicts, the A/A check."""
    def shape(arm: Arm) -> dict[str, Any]:
        return {"overrides": arm.overrides, "seeds": arm.seeds, "runs": arm.runs, "models": arm.models,
                "values": arm.values, "scores": arm.scores,
                "vs_baseline": {t: d.model_dump(mode="json") for t, d in arm.vs_baseline.items()}}
    return finite({"baseline": BASELINE, "targets": targets, "lower_is_better": True, "metric": "bits per byte",
            "metrics": dict(metrics or {}),
            "variants": {n: shape(a) for n, a in arms.items() if n != AA},
            "aa": shape(arms[AA]) if AA in arms else None})


def finite(data: Any) -> Any:
    """`data` with every NaN (a metric a seed's evaluation did not compute) as None: JSON that any reader takes."""
    if isinstance(data, float) and math.isnan(data):
        return None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data
