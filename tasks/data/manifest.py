"""The shard manifest: what the data stages produced, with checksums and the funnel.

Later stages (tokenizer, tokenize, pretrain) read shards only through `load_manifest`
and `shard_paths`, which verify every shard's sha256 so a corrupted or truncated shard
is never read silently.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra.workspace.atomic import write_text_atomic
from infra.workspace.record import sha256_file  # noqa: F401 (readers of shards import it from here)
from tasks.data.documents import SCHEMA_VERSION


class ShardInfo(BaseModel):
    file: str  # relative to the manifest's folder
    rows: int
    bytes: int
    sha256: str
    sources: dict[str, int] = Field(default_factory=dict)


class Manifest(BaseModel):
    schema_version: int = SCHEMA_VERSION
    config_hash: str = ""
    shards: list[ShardInfo] = Field(default_factory=list)
    funnel: dict[str, dict[str, int]] = Field(default_factory=dict)  # source -> counter -> n
    mix: dict[str, Any] = Field(default_factory=dict)  # target vs achieved weights
    # per evaluation task: its items, how many were found in the collected documents, what was removed or cut
    # (tasks/data/decontaminate.py); empty when the run matched against no task
    decontamination: dict[str, Any] = Field(default_factory=dict)
    removed_files: list[str] = Field(default_factory=list)  # quarantine Parquet files, relative
    stats: dict[str, Any] = Field(default_factory=dict)


class ChecksumError(RuntimeError):
    """A shard or checkpoint does not match its recorded checksum."""


def write_manifest(manifest: Manifest, path: Path) -> Path:
    """Write manifest.json atomically (it is the stage's completion marker)."""
    return write_text_atomic(path, manifest.model_dump_json(indent=2))


def load_manifest(path: Path) -> Manifest:
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no manifest; run the data flow first (`llmforge data`)")
    try:
        manifest = Manifest.model_validate(json.loads(path.read_text()))
    except ValueError as exc:  # JSONDecodeError and pydantic's ValidationError
        raise ValueError(f"{path}: not a valid manifest ({exc}); the file is truncated or corrupted, rerun the data flow") from None
    if manifest.schema_version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {manifest.schema_version}, expected {SCHEMA_VERSION}; rerun the data flow")
    return manifest


def shard_paths(manifest_path: Path, verify: bool = True) -> list[Path]:
    """Absolute shard paths of a manifest, each checked against its size and sha256."""
    manifest_path = Path(manifest_path)
    root = manifest_path if manifest_path.is_dir() else manifest_path.parent
    manifest = load_manifest(manifest_path)
    paths = []
    for shard in manifest.shards:
        p = root / shard.file
        if verify:
            verify_file(p, shard.sha256, shard.bytes)
        paths.append(p)
    return paths


def verify_file(path: Path, sha256: str, size: int | None = None) -> None:
    if not path.is_file():
        raise ChecksumError(f"{path}: listed in the manifest but missing")
    if size is not None and path.stat().st_size != size:
        raise ChecksumError(f"{path}: size {path.stat().st_size} != {size} recorded; the file is truncated or corrupted")
    actual = sha256_file(path)
    if actual != sha256:
        raise ChecksumError(f"{path}: sha256 {actual[:12]}… != {sha256[:12]}… recorded; the file is corrupted")
