"""The data a run read, as its MLflow dataset inputs: the shards it trained on, the held-out texts it was scored on.

MLflow's Datasets column and filter then say which data made which model. A dataset is logged by where it lies
and a digest of what identifies its content, never loaded: the shards by their manifest (the sha256 of
manifest.json, which lists every shard's sha256), a held-out text by the sha256 of its bytes. MLflow keeps one
dataset per name and digest in an experiment, so the data run and every run trained on its shards point at the
same dataset, and logging a dataset again to a run that has it changes nothing.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from infra.workspace.record import sha256_file

# mlflow is imported inside the functions that use it: a rank that never logs, a data worker and `llmforge --help`
# do not pay for its import.

SHARDS = "pretraining-shards"  # the shards' dataset name; their manifest's digest tells one set from another
TRAINING, EVALUATION = "training", "evaluation"  # the contexts MLflow shows beside a run's dataset
DIGEST_CHARS = 16  # of the sha256: what MLflow shows as the dataset's digest


def log_shards_input(run_id: str, manifest: Path, tags: dict[str, str] | None = None) -> None:
    """The shards listed by `manifest` (a manifest.json) as the "training" input of run `run_id`."""
    log_dataset_input(run_id, manifest, SHARDS, sha256_file(manifest)[:DIGEST_CHARS], TRAINING, tags)


def log_target_inputs(run_id: str, targets: dict[str, Path]) -> None:
    """Each held-out target text (name -> file) as an "evaluation" input of run `run_id`, named by its target."""
    for name, path in sorted(targets.items()):
        log_dataset_input(run_id, path, name, sha256_file(path)[:DIGEST_CHARS], EVALUATION)


def log_dataset_input(run_id: str, path: Path, name: str, digest: str, context: str,
                      tags: dict[str, str] | None = None) -> None:
    """Record the file at `path` (by its URI and `digest`, not its contents) as a `context` input of run `run_id`."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    with warnings.catch_warnings():
        # MLflow registers the local-file source under two schemes and warns that they are ambiguous.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(Path(path).resolve().as_uri())
    dataset = MetaDataset(source=source, name=name, digest=digest)._to_mlflow_entity()
    input_tags = [InputTag(MLFLOW_DATASET_CONTEXT, context)] + [InputTag(k, v) for k, v in (tags or {}).items()]
    MlflowClient().log_inputs(run_id, datasets=[DatasetInput(dataset, input_tags)])
