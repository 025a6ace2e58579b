"""`llmforge mix`: the mix chosen by the models it makes. Proxies on sampled mixes, a mixing law fitted on them, the
mix it predicts best written down, then trained over seeds against the catalog's own mix.

    the catalog's mix → its data, a tokenizer every proxy shares, the targets (named, else each source's held-out
      slice, weighted equally), each source's cap: the largest share every run the proposal is trained by (the
      preset's pretraining, the proxy, the --confirm-scale runs) can read it at within its max_epochs
    M mixes drawn from a Dirichlet around the catalog's weights (within the floor and the caps), each its own data
      (the stages before the mix are shared, content-addressed)
    → a proxy per mix at seed 0, and the catalog's mix at every seed, through the run queue, each scored on the targets
    → a mixing law of the targets' mean bits per byte on the shares (models/mixing_law.py): log-linear, or the
      quadratic where it predicts left-out proxies better; its leave-one-out Spearman
    → the proposal: the shares the law predicts lowest, within the floor, the caps and each source's range among
      the proxies; its data made, then mix.json written with the predicted bits per byte at the shares it
      achieved and a 95% interval, before it is trained
    → the proposal over the same seeds; measured against predicted, and catalog - proposed paired by seed and window
    → with mix.confirm_scale k (--confirm-scale): both mixes again at k x the proxy's parameters and tokens: does
      the ranking hold?
    → mix.json, report.md, mix.png and preset.yaml (the preset with the proposal, for `llmforge run --preset`)
      in work/mix/<key>/

One MLflow parent run `mix` with every proxy's pretraining nested under it, tagged `role` (swarm, catalog,
proposal, and confirm-* for the larger runs), `seed` and `mix` (the shares).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from mlflow.tracking import MlflowClient
from prefect import flow
from pydantic import BaseModel

from flows.config import PipelineConfig, resolve_pipeline_config
from flows.data_flow import DataResult, data_flow
from flows.proxies import held_out_targets, proxy_config, scores_of
from flows.tokens import tokens_of
from infra.config import ConfigError
from infra.run_queue import Queued, flow_of_runs
from infra.stages import run
from infra.tracking.datasets import log_target_inputs
from infra.tracking.runs import describe_overrides, log_metrics, tag_active_run
from infra.workspace.atomic import write_json_atomic, write_text_atomic
from infra.workspace.cache import flow_key
from infra.workspace.paths import Workspace, point_latest
from models.flops import num_params
from models.llama import model_config
from models.mixing_law import choose_model, prediction_interval, propose_mix, proxy_span, sample_mixes
from tasks.data.catalog import load_catalog
from tasks.data.collect import source_inputs
from tasks.data.manifest import load_manifest
from tasks.eval.seed_differences import Difference, bits_per_byte, mean_bpb, mean_bpb_difference
from tasks.reports.mix import publish_mix_report, uninformative
from tasks.tokenizer.tokenize_shards import load_token_index
from tasks.tokenizer.train import TrainTokenizer, load_tokenizer
from tasks.training.config import PretrainConfig
from tasks.training.mix_search import SCALED_KEYS, mix_caps, mix_targets, proxy_count, scaled_shape
from tasks.training.pretrain.stage import Pretrain

STORE = "mix"
ROUND = 4  # decimals of a sampled or proposed share: a readable data.mix.weights, a stable cache key


class MixArm(BaseModel):
    """A mix trained over seeds: its shares (asked, and as the mix stage achieved them), runs and scores."""

    weights: dict[str, float]
    achieved: dict[str, float] = {}
    seeds: list[int] = []
    runs: list[str | None] = []
    bpb: list[float] = []  # the targets' mean bits per byte, per seed
    by_target: dict[str, list[float]] = {}  # target -> bits per byte per seed


class MixResult(BaseModel):
    mlflow_run_id: str
    folder: Path
    document: dict[str, Any]
    report: Path
    preset: Path  # the preset with the proposal: `llmforge run --preset <it>`


def search_config(config: PipelineConfig, named: dict[str, Path]) -> PipelineConfig:
    """The config the search trains on: with no target named, the preset's data with mix.holdout of every source
    held out (unless data.holdout already holds some out)."""
    if named or config.data.holdout.fraction > 0:
        return config
    holdout = config.data.holdout.model_copy(update={"fraction": config.mix.holdout})
    return config.model_copy(update={"data": config.data.model_copy(update={"holdout": holdout})})


def mix_report_of(data: DataResult) -> dict[str, Any]:
    """The mix stage's report in a data result's manifest: each source's available, sampled and achieved share."""
    return load_manifest(data.manifest).mix


def units_per_token(mix_report: dict[str, Any], tokens: Path) -> float:
    """The mix's units (characters or tokens) per token of its shards: what turns a run's tokens into the mix's unit."""
    if mix_report["unit"] == "tokens":
        return 1.0
    index = load_token_index(tokens)
    sampled = sum(s["sampled"] for s in mix_report["sources"].values())
    return sampled / max(1, index.tokens("train") + index.tokens("val"))


def run_units(pretrain: PretrainConfig, per_token: float) -> float:
    """How much of the mix (in its unit) `pretrain` reads: its tokens at `per_token` units each."""
    return pretrain.steps * pretrain.batch.tokens_per_step(pretrain.launch.num_procs) * per_token


def scaled_proxy(proxy: PretrainConfig, vocab_size: int, k: float) -> PretrainConfig:
    """The proxy at about k x its parameters (depth and width, models/flops.num_params) and k x its tokens (steps)."""
    base = model_config(proxy.model, vocab_size, **proxy.model_overrides)
    shape = scaled_shape({key: getattr(base, key) for key in SCALED_KEYS}, k,
                         lambda s: num_params(base.model_copy(update=s)))
    data = proxy.model_dump()
    data["model_overrides"] = {**proxy.model_overrides, **shape}
    data["steps"] = max(1, round(proxy.steps * k))
    data["optim"]["warmup_steps"] = round(proxy.optim.warmup_steps * k)
    return PretrainConfig.model_validate(data)


@flow(name="mix", log_prints=True)
def mix_flow(config: PipelineConfig | None = None, workdir: str | None = None, preset: str = "tiny",
             overrides: list[str] | None = None) -> MixResult:
    """The mix search of `config`'s `mix` section, else `preset`'s, plus `overrides` ("mix.per_source=6",
    "mix.targets.news=/data/news.jsonl", "mix.confirm_scale=4")."""
    config = resolve_pipeline_config(config, preset, overrides, workdir)
    chosen = config  # what the proposal is for: preset.yaml is this config with the proposal's shares
    named = mix_targets(config.mix.targets)
    config = search_config(config, named)
    search, k = config.mix, config.mix.confirm_scale
    catalog = load_catalog(config.data.catalog, only=config.data.sources)
    names = [s.name for s in catalog.sources]
    if len(names) < 2:
        raise ConfigError(f"the catalog {catalog.root} has one source ({names}): a mix needs two or more")
    weights = catalog.weights(config.data.mix.weights)
    max_epochs = {s.name: s.max_epochs for s in catalog.sources}
    proxy = config.mix_proxy()
    ws = Workspace.locate(workdir).ensure_writable()
    root = str(ws.root)
    what = {"data": config.data.outputs_identity(), "tokenizer": config.tokenizer, "tokenize": config.tokenize,
            "proxy": proxy, "pretrain": config.pretrain, "search": search.model_copy(update={"targets": named})}
    with flow_of_runs(ws, "mix", what, config.runs, run_name=f"mix {describe_overrides(overrides or [])}".strip(),
                      run_key=flow_key("mix", __name__, what, {s.name: source_inputs(catalog, s)
                                                               for s in catalog.sources})) as (parent, queue):
        data_sets = [o for o in overrides or [] if o.startswith("data.")]
        base = data_flow(config.data, workdir=root, overrides=data_sets)
        goal = named or held_out_targets(base, "no mix target is named")
        tokenizer = run(TrainTokenizer(config.tokenizer), ws, manifest=base.manifest)
        vocab_size = load_tokenizer(tokenizer).get_vocab_size()
        big = scaled_proxy(proxy, vocab_size, k) if k is not None else None  # a bad shape fails before any training
        folder = ws.output(STORE, flow_key("mix", __name__, what, {"tokenizer": tokenizer, "targets": goal}))
        folder.mkdir(parents=True, exist_ok=True)
        tag_active_run(f"llmforge.out.{STORE}.{folder.name}", f"{STORE}/{folder.name}")
        report = mix_report_of(base)
        base_tokens = tokens_of(ws, base.manifest, tokenizer, config.tokenize)
        # The caps hold for every run a proposal is trained by: the preset's pretraining, the proxy, the larger runs.
        per_token = units_per_token(report, base_tokens)
        units = max(run_units(p, per_token) for p in (config.pretrain, proxy, big) if p is not None)
        caps = mix_caps({s: report["sources"][s]["available"] for s in names}, max_epochs, units)
        m = proxy_count(search, len(names))
        drawn = sample_mixes([weights[s] for s in names], m, [caps[s] for s in names], search.floor, search.seed,
                             search.concentration)
        print(f"{m} proxies on mixes drawn around the catalog's {rounded(weights)} (caps {capped(caps)}, floor "
              f"{search.floor}); the catalog's mix over {search.seeds} seeds; targets {sorted(goal)}"
              f"{'' if named else ' (the held-out slice of every source, weighted equally)'}")

        def data_of(shares: dict[str, float]) -> tuple[DataResult, Path]:
            """A mix's data (the stages before the mix shared) and its token shards on the shared tokenizer."""
            mix = config.data.mix.model_copy(update={"weights": shares})
            made = data_flow(config.data.model_copy(update={"mix": mix}), workdir=root,
                             overrides=data_sets + [f"data.mix.weights={json.dumps(shares)}"])
            return made, tokens_of(ws, made.manifest, tokenizer, config.tokenize)

        def achieved(mix: dict[str, Any]) -> dict[str, float]:
            """The shares a mix stage achieved, from its report."""
            return {s: mix["sources"][s]["achieved"] for s in names}

        scores: dict[int, list[dict[str, np.ndarray]]] = {}  # id(arm) -> per seed, target -> its windows' scores

        def train(arms: list[tuple[str, MixArm, Path]], pretrain: PretrainConfig) -> None:
            """Each arm's seeds through the queue, then scored on the targets; the runs tagged."""
            items = [(label, arm, shards, seed) for label, arm, shards in arms for seed in arm.seeds]
            results = queue.run([Queued(Pretrain(c := proxy_config(pretrain, seed)),
                                        {"tokens": shards, "tokenizer": tokenizer}, f"{label} seed {seed}", c.steps)
                                 for label, _, shards, seed in items])
            client = MlflowClient()
            for (label, arm, _, seed), made in zip(items, results):
                scored = scores_of(ws, made.model_dir, tokenizer, goal, pretrain.batch.seq_len).arrays()
                arm.runs.append(made.mlflow_run_id)
                arm.bpb.append(mean_bpb(scored))
                for target, values in scored.items():
                    arm.by_target.setdefault(target, []).append(bits_per_byte(values))
                scores.setdefault(id(arm), []).append(scored)
                if made.mlflow_run_id:
                    log_target_inputs(made.mlflow_run_id, goal)
                    for key, value in (("role", label.split(" ")[0]), ("seed", str(seed)),
                                       ("mix", json.dumps(arm.weights))):
                        client.set_tag(made.mlflow_run_id, key, value)

        def compare(catalog_arm: MixArm, proposed_arm: MixArm) -> Difference:
            """Catalog - proposed, paired by seed and window: above 0, the proposal is better."""
            return mean_bpb_difference(scores[id(catalog_arm)], scores[id(proposed_arm)])

        seeds = list(range(search.seeds))
        catalog_arm = MixArm(weights=rounded(weights), achieved=achieved(report), seeds=seeds)
        swarm: list[tuple[str, MixArm, Path]] = []
        for i, row in enumerate(drawn, start=1):
            shares = rounded(dict(zip(names, row.tolist())))
            made, shards = data_of(shares)
            swarm.append((f"swarm {i}/{m}", MixArm(weights=shares, achieved=achieved(mix_report_of(made)), seeds=[0]),
                          shards))
        train(swarm + [("catalog", catalog_arm, base_tokens)], proxy)

        # The law: every seed-0 run, the catalog's included, on the shares the mix stage achieved.
        points = [arm for _, arm, _ in swarm] + [catalog_arm]
        x = np.array([[arm.achieved[s] for s in names] for arm in points])
        y = np.array([arm.bpb[0] for arm in points])
        choice = choose_model(x, y)
        proposal = rounded(dict(zip(names, propose_mix(choice.model, [caps[s] for s in names], search.floor,
                                                         span=proxy_span(x), seed=search.seed).tolist())))
        made, shards = data_of(proposal)  # its data before the prediction: the law is read at the achieved shares
        proposed_arm = MixArm(weights=proposal, achieved=achieved(mix_report_of(made)), seeds=seeds)
        at = [proposed_arm.achieved[s] for s in names]
        # The swarm trains seed 0 only, so the law predicts a seed-0 run; the proposal is measured as the mean over
        # the seeds. The catalog's mean over them minus its seed 0 (the shift) carries the seeds' common effect
        # over. What the shift's own estimate misses is one run's noise away from it, about what the interval's
        # extra residual draw adds (docs/mix.md "What it does").
        shift = float(np.mean(catalog_arm.bpb) - catalog_arm.bpb[0])
        signal = informative(y, catalog_arm.bpb, choice.loo_spearman)
        predicted = float(choice.model.predict(at)[0]) + shift
        lo, hi = (v + shift for v in prediction_interval(x, y, at, choice.name, seed=search.seed))
        document: dict[str, Any] = {
            "sources": names, "proposed": proposal, "catalog": catalog_arm.weights,
            "predicted_bpb": predicted, "interval": [lo, hi],
            "measured_bpb": None, "catalog_bpb": float(np.mean(catalog_arm.bpb)), "diff_ci": None,
            "fit": {"model": choice.name, "loo_spearman": choice.loo_spearman, "loo_spearmans": choice.loo_spearmans,
                    "loo_mse": choice.loo_mse, "law": choice.model.model_dump(), "seed_shift": shift, **signal},
            "targets": {t: str(p) for t, p in sorted(goal.items())}, "held_out": not named,
            "caps": capped(caps), "floor": search.floor, "seeds": seeds, "proposed_achieved": proposed_arm.achieved,
            "proxy": {"steps": proxy.steps, "model_overrides": proxy.model_overrides},
            "proxies": [{"weights": arm.weights, "achieved": arm.achieved, "bpb": arm.bpb[0], "loo_predicted": p,
                         "run": arm.runs[0]} for arm, p in zip(points, choice.loo_predictions)],
            "preset": str(folder / "preset.yaml"),
        }
        write_json_atomic(folder / "mix.json", document)  # the proposal, written down before it is trained
        log_metrics({"loo_spearman": choice.loo_spearman, "predicted_bpb": predicted, "predicted_bpb_low": lo,
                     "predicted_bpb_high": hi, "catalog_bpb": document["catalog_bpb"]})
        if note := uninformative({**signal, "loo_spearman": choice.loo_spearman}):
            print(f"WARNING: {note}")
        print(f"fit: {choice.name}, leave-one-out Spearman {choice.loo_spearman:.3f} over {len(points)} proxies; "
              f"proposal {proposal}: predicted {predicted:.4f} bits/byte, 95% interval [{lo:.4f}, {hi:.4f}] "
              f"({folder / 'mix.json'})")

        train([("proposal", proposed_arm, shards)], proxy)
        diff = compare(catalog_arm, proposed_arm)
        measured = float(np.mean(proposed_arm.bpb))
        document.update(measured_bpb=measured, diff_ci=list(diff.ci), diff=diff.diff, inside=bool(lo <= measured <= hi),
                        arms={"catalog": catalog_arm.model_dump(mode="json"),
                              "proposal": proposed_arm.model_dump(mode="json")})
        print(f"proposal measured {measured:.4f} bits/byte over {len(seeds)} seeds (predicted {predicted:.4f}, "
              f"{'inside' if document['inside'] else 'OUTSIDE'} the interval); catalog {document['catalog_bpb']:.4f}; "
              f"catalog - proposed {diff.diff:+.4f} [{diff.ci[0]:+.4f}, {diff.ci[1]:+.4f}]")
        if big is not None:
            arms = {"catalog": MixArm(weights=catalog_arm.weights, achieved=catalog_arm.achieved, seeds=seeds),
                    "proposal": MixArm(weights=proposal, achieved=proposed_arm.achieved, seeds=seeds)}
            train([(f"confirm-{n}", arm, s) for (n, arm), s in zip(arms.items(), (base_tokens, shards))], big)
            at_k = compare(arms["catalog"], arms["proposal"])
            document["confirm"] = {
                "factor": k, "steps": big.steps, "model_overrides": big.model_overrides,
                "n_params": {"proxy": num_params(model_config(proxy.model, vocab_size, **proxy.model_overrides)),
                             "confirm": num_params(model_config(big.model, vocab_size, **big.model_overrides))},
                "catalog_bpb": float(np.mean(arms["catalog"].bpb)), "measured_bpb": float(np.mean(arms["proposal"].bpb)),
                "diff": at_k.diff, "diff_ci": list(at_k.ci), "ranking": ranking(diff, at_k),
                "arms": {n: a.model_dump(mode="json") for n, a in arms.items()}}
            print(f"at {k:g}x: catalog - proposed {at_k.diff:+.4f} [{at_k.ci[0]:+.4f}, {at_k.ci[1]:+.4f}]: the ranking "
                  f"{document['confirm']['ranking']}")
        write_json_atomic(folder / "mix.json", document)
        preset_file = write_preset(folder / "preset.yaml", chosen, proposal)
        log_metrics({"measured_bpb": measured, "diff": diff.diff, "diff_low": diff.ci[0], "diff_high": diff.ci[1]})
        report = publish_mix_report(folder, document)
        point_latest(ws.latest(STORE), folder)
        print(report.markdown)
        return MixResult(mlflow_run_id=parent.info.run_id, folder=folder, document=document, report=report.path,
                         preset=preset_file)


MIN_SPEARMAN = 0.5  # below it, the law ranks mixes it did not see little better than chance


def informative(swarm: np.ndarray, catalog_seeds: list[float], rho: float) -> dict[str, Any]:
    """Whether the proxies' measures differ by more than one mix's seeds do, and the law ranks left-out proxies
    (Spearman at least MIN_SPEARMAN): else its proposal is noise, and the report says so."""
    swarm_sd, seed_sd = float(np.std(swarm, ddof=1)), float(np.std(catalog_seeds, ddof=1))
    return {"swarm_sd": swarm_sd, "seed_sd": seed_sd,
            "informative": bool(swarm_sd > seed_sd and np.isfinite(rho) and rho >= MIN_SPEARMAN)}


def ranking(proxy: Difference, larger: Difference) -> str:
    """Whether the larger runs keep the proxies' ranking: `holds` when both intervals exclude 0 on the same side,
    `reversed` when they exclude it on opposite sides, else `inconclusive` (one of them cannot tell)."""
    def side(d: Difference) -> int:
        return 1 if d.ci[0] > 0 else -1 if d.ci[1] < 0 else 0
    a, b = side(proxy), side(larger)
    return "holds" if a and a == b else "reversed" if a and b else "inconclusive"


def rounded(shares: dict[str, float]) -> dict[str, float]:
    """Shares at ROUND decimals, still summing to 1 (the largest takes the rounding)."""
    out = {s: round(float(v), ROUND) for s, v in shares.items()}
    top = max(out, key=out.get)
    out[top] = round(out[top] + 1.0 - sum(out.values()), ROUND)
    return out


def capped(caps: dict[str, float]) -> dict[str, float]:
    """Caps at ROUND decimals (each its own: they need not sum to 1)."""
    return {s: round(v, ROUND) for s, v in caps.items()}


def write_preset(path: Path, config: PipelineConfig, proposal: dict[str, float]) -> Path:
    """The config the search started from with data.mix.weights the proposal: a preset `llmforge run` takes."""
    data = config.model_dump(mode="json")
    data["data"]["mix"]["weights"] = proposal
    head = ("# llmforge mix's proposal on this preset: train on it with\n"
            f"#   llmforge run --preset {path}\n"
            f"# or, on your own preset, --set 'data.mix.weights={json.dumps(proposal)}'\n")
    write_text_atomic(path, head + yaml.safe_dump(data, sort_keys=False))
    return path
