"""Register the pipeline's final model in the MLflow model registry, with its lineage.

The transformers export of the model (safetensors, never a pickle) is logged under the
pipeline run with MLflow's transformers flavor, as a text-generation pipeline that wraps a
plain question in the chat template; a model version points at it, tagged with the data
manifest hash, tokenizer hash, config hash and the runs that made it, and the alias
`champion` moves to it. Anyone can then load it with MLflow or transformers alone:

    mlflow.pyfunc.load_model("models:/llmforge-tiny@champion").predict(["What is 3 + 4?"])
"""
from __future__ import annotations

from pathlib import Path

from infra.tracking import active_run
from models.chat_template import PROMPT_TEMPLATE
from tasks.data.manifest import sha256_file

DESCRIPTION = "Final model of the llmforge pipeline (transformers LlamaForCausalLM, chat template, text-generation)"
INPUT_EXAMPLE = "What is 3 + 4?"
CHAMPION = "champion"  # the registry alias that always names the newest registered version
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
    alias: str = CHAMPION,
) -> str:
    """Log the transformers folder `hf_dir` to the active run as an MLflow transformers model
    (a text-generation pipeline), register it as a new version of `name` and point `alias` at it.

    `prompt_template` (str.format with `prompt`) turns a plain question into the model's chat
    prompt, so `mlflow.pyfunc.load_model("models:/<name>@<alias>").predict(["..."])` answers
    without the caller knowing the template. The registered model is created on first use;
    returns the new version number.
    """
    from importlib.metadata import version

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
        pip_requirements=[f"{pkg}=={version(pkg)}" for pkg in _SERVING_PACKAGES],
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
    client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def register_final_model(hf_dir: Path | None, name: str, lineage: dict[str, str], what: str = "") -> str:
    """Log the transformers folder `hf_dir` to the active (pipeline) run and register it as the new `champion` version
    of `name`, its description saying `what` the run was; returns the version."""
    active_run()
    if hf_dir is None:
        raise ValueError(
            "the final model has no transformers export to register: run GRPO with grpo.export_hf=true "
            "(the default), which writes <grpo out_dir>/hf"
        )
    return register_model(
        Path(hf_dir), name, tags=lineage, description=f"{DESCRIPTION}. {what}".strip(), artifact_path="final_model",
        prompt_template=PROMPT_TEMPLATE, input_example=INPUT_EXAMPLE,
    )
