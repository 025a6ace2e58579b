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

from infra.tracking import active_run, register_model
from models.chat_template import PROMPT_TEMPLATE
from tasks.data.manifest import sha256_file

DESCRIPTION = "Final model of the llmforge pipeline (transformers LlamaForCausalLM, chat template, text-generation)"
INPUT_EXAMPLE = "What is 3 + 4?"


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


def register_final_model(hf_dir: Path | None, name: str, lineage: dict[str, str]) -> str:
    """Log the transformers folder `hf_dir` to the active (pipeline) run and register it as the new `champion` version of `name`; returns the version."""
    active_run()
    if hf_dir is None:
        raise ValueError(
            "the final model has no transformers export to register: run GRPO with grpo.export_hf=true "
            "(the default), which writes <grpo out_dir>/hf"
        )
    return register_model(
        Path(hf_dir), name, tags=lineage, description=DESCRIPTION, artifact_path="final_model",
        prompt_template=PROMPT_TEMPLATE, input_example=INPUT_EXAMPLE,
    )
