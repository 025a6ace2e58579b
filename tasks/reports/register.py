"""Register the pipeline's final model in the MLflow model registry, with its lineage.

The transformers export of the model (safetensors, never a pickle) is logged under the
pipeline run with MLflow's transformers flavor, as a text-generation pipeline that wraps a
plain question in the chat template; a model version points at it, tagged with the data
manifest hash, tokenizer hash, config hash, the runs that made it and the sha256 of its weights.

The registry promotes on merit: a run whose weights a version already holds registers nothing
new (a cached rerun, a repeated config), and the alias `champion` moves to a new version only
when it beats the champion on a declared metric (`registry.metric`, default the final model's
held-out evaluation accuracy); the version's description says which way it went and why.
Anyone can then load the champion with MLflow or transformers alone:

    mlflow.pyfunc.load_model("models:/llmforge-tiny@champion").predict(["What is 3 + 4?"])
"""
from __future__ import annotations

import hashlib
from importlib.metadata import version as package_version
from pathlib import Path

from infra.tracking.runs import active_run
from infra.workspace.record import sha256_file
from models.chat_template import PROMPT_TEMPLATE

# mlflow and its transformers flavor (transformers, huggingface_hub: seconds to import) load only when a model
# is registered, at the end of a pipeline run.

DESCRIPTION = "Final model of the llmforge pipeline (transformers LlamaForCausalLM, chat template, text-generation)"
INPUT_EXAMPLE = "What is 3 + 4?"
CHAMPION = "champion"  # the registry alias of the best version by the declared metric
WEIGHTS_TAG = "weights_sha256"  # a version's weights, so the same weights are never registered twice
METRIC_TAG = "champion_metric"  # the metric a version was judged on, and `metric.<name>` its value
_SERVING_PACKAGES = ("mlflow", "transformers", "torch", "tokenizers", "safetensors")


def lineage_tags(manifest: Path, tokenizer: Path, config_hash: str, stage_runs: dict[str, str | None]) -> dict[str, str]:
    """The tags that say where a model came from: input hashes, config hash, and the pipeline and stage run ids."""
    tags = {
        "manifest_sha256": sha256_file(Path(manifest)),
        "tokenizer_sha256": sha256_file(Path(tokenizer)),
        "config_hash": config_hash,
        "pipeline_run_id": active_run().info.run_id,
    }
    tags.update({f"{stage}_run_id": run_id or "" for stage, run_id in stage_runs.items()})
    return tags


def register_model(
    hf_dir: Path,
    name: str,
    tags: dict[str, str],
    description: str,
    artifact_path: str = "model",
    *,
    prompt_template: str,
    input_example: str,
    max_new_tokens: int = 64,
    alias: str | None = CHAMPION,
) -> str:
    """Log the transformers folder `hf_dir` to the active run as an MLflow transformers model
    (a text-generation pipeline), register it as a new version of `name` and point `alias` (if any) at it.

    `prompt_template` (str.format with `prompt`) turns a plain question into the model's chat
    prompt, so `mlflow.pyfunc.load_model("models:/<name>@<alias>").predict(["..."])` answers
    without the caller knowing the template. The registered model is created on first use;
    returns the new version number.
    """
    import mlflow
    import transformers
    from huggingface_hub import ModelCard
    from mlflow.exceptions import MlflowException
    from mlflow.models import ModelSignature
    from mlflow.tracking import MlflowClient
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    run = active_run()
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file() or not (hf_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{hf_dir} is not a transformers model folder with a tokenizer (config.json, tokenizer.json): "
            "pass the folder models.export.export_hf_llama wrote with tokenizer_json"
        )
    pipe = transformers.pipeline("text-generation", model=str(hf_dir), tokenizer=str(hf_dir), device="cpu")
    signature = ModelSignature(
        inputs=Schema([ColSpec("string")]),
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", max_new_tokens), ParamSpec("do_sample", "boolean", False)]),
    )
    info = mlflow.transformers.log_model(
        pipe,
        name=artifact_path,
        task="text-generation",
        signature=signature,
        input_example=[input_example],
        prompt_template=prompt_template,
        # No model_config: MLflow logs it as params of the run, where it would pass for pipeline configuration;
        # the signature's params carry the same defaults (greedy, max_new_tokens) to every predict.
        # A card of our own: MLflow would otherwise look the local folder up on the Hugging Face Hub.
        model_card=ModelCard(f"---\nlicense: other\n---\n{description}\n"),
        # Pinned here: MLflow's own default list asks for torchvision, which we do not install.
        pip_requirements=[f"{pkg}=={package_version(pkg)}" for pkg in _SERVING_PACKAGES],
    )
    client = MlflowClient()
    try:
        client.create_registered_model(name, description=description)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    version = client.create_model_version(
        name, source=info.model_uri, run_id=run.info.run_id, tags=tags, description=description
    )
    if alias is not None:
        client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def weights_sha256(hf_dir: Path) -> str:
    """sha256 over the folder's weight files (*.safetensors, by name): equal for the same weights, wherever they lie."""
    digest = hashlib.sha256()
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0" + sha256_file(path).encode())
    return digest.hexdigest()


def version_with_weights(name: str, weights: str) -> str | None:
    """The version of `name` that holds these weights, if any."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        found = MlflowClient().search_model_versions(f"name='{name}' and tags.{WEIGHTS_TAG}='{weights}'")
    except MlflowException:
        return None  # no such registered model yet
    return str(min(int(v.version) for v in found)) if found else None


def champion_verdict(name: str, metric: str, value: float | None, greater_is_better: bool) -> tuple[bool, str]:
    """(whether a new version with `value` of `metric` takes `@champion` from the current one, and why)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        champion = MlflowClient().get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return True, f"champion: the first version with {metric} = {value}"
    theirs = champion.tags.get(f"metric.{metric}")
    if value is None:
        return False, f"not champion: this run logged no {metric}; version {champion.version} stays champion"
    if theirs is None:
        return True, f"champion: {metric} = {value:.4g}; version {champion.version}, the champion, has no {metric} recorded"
    better = value > float(theirs) if greater_is_better else value < float(theirs)
    way = ">" if greater_is_better else "<"
    if better:
        return True, f"champion: {metric} = {value:.4g} {way} {float(theirs):.4g} of version {champion.version}"
    return False, (f"not champion: {metric} = {value:.4g}, not {way} {float(theirs):.4g} of version {champion.version} "
                   "(the champion)")


def register_final_model(hf_dir: Path | None, name: str, lineage: dict[str, str], what: str = "",
                         metric: tuple[str, float | None] | None = None, greater_is_better: bool = True) -> str:
    """Register the transformers folder `hf_dir` (logged to the active pipeline run) as a version of `name`, unless
    a version holds the same weights (that version is returned, nothing logged); `@champion` moves to it only when
    it beats the champion on `metric` ((name, this run's value); None: always). Returns the version."""
    active_run()
    if hf_dir is None:
        raise ValueError(
            "the final model has no transformers export to register: run GRPO with grpo.export_hf=true "
            "(the default), which writes <grpo out_dir>/hf"
        )
    weights = weights_sha256(Path(hf_dir))
    same = version_with_weights(name, weights)
    if same is not None:
        print(f"registry: {name} version {same} holds these weights already; nothing new registered")
        return same
    tags = {**lineage, WEIGHTS_TAG: weights}
    promote, why = True, "champion: no metric declared, the newest version"
    if metric is not None:
        promote, why = champion_verdict(name, metric[0], metric[1], greater_is_better)
        tags[METRIC_TAG] = metric[0]
        if metric[1] is not None:
            tags[f"metric.{metric[0]}"] = str(metric[1])
    version = register_model(
        Path(hf_dir), name, tags=tags, description=f"{DESCRIPTION}. {why}. {what}".strip(), artifact_path="final_model",
        prompt_template=PROMPT_TEMPLATE, input_example=INPUT_EXAMPLE, alias=CHAMPION if promote else None,
    )
    print(f"registry: {name} version {version}: {why}")
    return version
