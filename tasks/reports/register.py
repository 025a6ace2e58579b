"""Register the pipeline's final model in the MLflow model registry, with its lineage.

The weights are logged as safetensors files (never a pickle) under the pipeline run, and a
model version points at them, tagged with the data manifest hash, tokenizer hash, config
hash and the runs that made it.
"""
from __future__ import annotations

from pathlib import Path

from infra.tracking import active_run, register_model
from tasks.data.manifest import sha256_file

DESCRIPTION = "Final model of the llmforge pipeline (safetensors + config.json)"


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


def register_final_model(model_dir: Path, name: str, lineage: dict[str, str]) -> str:
    """Log `model_dir` to the active (pipeline) run and register it as a new version of `name`; returns the version."""
    return register_model(Path(model_dir), name, tags=lineage, description=DESCRIPTION, artifact_path="final_model")
