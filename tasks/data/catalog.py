"""Source definitions: one YAML file per source in `data_catalog/`, validated before any work.

A mistaken catalog (unknown key, missing path, weights that don't make sense, a path that
escapes the data roots) fails here with an error naming the file and the key.
"""
from __future__ import annotations

import glob as globlib
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from infra.config import ConfigError, StrictModel, parse_config, read_yaml

SourceKind = Literal["jsonl", "parquet", "text_dir", "hf_dataset", "builtin"]
BUILTINS = ("python_docs", "python_stdlib")
# Per compressed file. A bomb costs CPU per inflated byte (about 4 s per GiB of blank lines,
# most of it zlib), so 1 GiB keeps one to seconds, while real shards are under it (published
# JSONL.gz shards are typically 0.1-1 GB inflated); a source with bigger ones raises it.
MAX_INFLATED_BYTES = 1 << 30


class HfDatasetOptions(StrictModel):
    """Arguments for `datasets.load_dataset`: a builder ("json", "parquet", "csv", "text") with
    local `data_files`, or a hub name where the network allows."""

    name: str
    data_files: str | list[str] | None = None
    config: str | None = None
    split: str = "train"
    revision: str | None = None


class SourceBase(StrictModel):
    """What every catalog source has, pretraining (`SourceConfig`) or SFT (`sft_*` kinds)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    path: str | None = None  # file, folder or glob, relative to the catalog folder
    licence: str
    hf: HfDatasetOptions | None = None  # kind *hf_dataset: what to load
    allow_outside_roots: bool = False  # files must lie under the data roots unless this is set


class SourceConfig(SourceBase):
    """One pretraining source of the catalog."""

    kind: SourceKind
    glob: str = "**/*.txt"  # text_dir: which files are documents
    text_field: str = "text"
    id_field: str | None = None  # use the record's own id in the locator when present
    weight: float = 1.0  # target share of the mix (normalised over sources)
    max_documents: int | None = Field(default=None, gt=0)
    max_epochs: float = Field(default=4.0, gt=0)  # cap on up-sampling repeats
    filters: dict[str, Any] = Field(default_factory=dict)  # a tasks.data.quality_rules.FilterSpec
    builtin: Literal["python_docs", "python_stdlib"] | None = None
    max_line_bytes: int = Field(default=8 << 20, gt=0)  # longer JSONL lines are quarantined
    # jsonl: a compressed file inflating past this quarantines its rest as one oversize_file record
    max_inflated_bytes: int = Field(default=MAX_INFLATED_BYTES, gt=0)
    # text_dir: a bigger file is quarantined (oversize_file) with its first 64 KiB and sha256, not read whole
    max_file_bytes: int = Field(default=10 << 20, gt=0)

    @field_validator("weight")
    @classmethod
    def _weight_positive(cls, v: float) -> float:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"must be a finite number > 0 (got {v}); remove the source to exclude it")
        return v

    @model_validator(mode="after")
    def _kind_fields(self) -> "SourceConfig":
        if self.kind == "builtin":
            if self.builtin is None:
                raise ValueError(f"kind 'builtin' needs key 'builtin' (one of {', '.join(BUILTINS)})")
        elif self.kind == "hf_dataset":
            if self.hf is None:
                raise ValueError("kind 'hf_dataset' needs key 'hf' (name, data_files, split)")
        elif not self.path:
            raise ValueError(f"kind '{self.kind}' needs key 'path'")
        return self


class Catalog(StrictModel):
    """The validated sources, with paths resolved against the catalog folder."""

    root: Path
    sources: list[SourceConfig]

    def by_name(self) -> dict[str, SourceConfig]:
        return {s.name: s for s in self.sources}

    def resolve(self, source: SourceConfig) -> Path:
        return (self.root / source.path).resolve() if source.path else self.root

    def weights(self) -> dict[str, float]:
        total = sum(s.weight for s in self.sources)
        return {s.name: s.weight / total for s in self.sources}

    def filter_specs(self) -> dict[str, Any]:
        from tasks.data.quality_rules import FilterSpec

        return {s.name: FilterSpec.model_validate(s.filters) for s in self.sources}


def is_within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def has_glob(pattern: str | None) -> bool:
    return any(ch in (pattern or "") for ch in "*?[")


def match_files(root: Path, pattern: str, folder_glob: str) -> list[Path]:
    """The files `pattern` names under `root`, sorted so every run sees the same order: a glob
    (matched against `root` as given), every `folder_glob` file of a folder, else the path itself."""
    if has_glob(pattern):
        return sorted(Path(p) for p in globlib.glob(str(root / pattern), recursive=True) if Path(p).is_file())
    base = (root / pattern).resolve()
    if base.is_dir():
        return sorted(p for p in base.glob(folder_glob) if p.is_file())
    return [base]


def folder_glob(kind: str) -> str:
    """Which files of a folder a file-based source of `kind` reads."""
    return "**/*.parquet" if kind.endswith("parquet") else "**/*.jsonl*"


def source_files(catalog: Catalog, source: SourceConfig) -> list[Path]:
    """The files a file-based source reads, sorted so every run sees the same order."""
    if source.kind == "text_dir":
        return sorted(p for p in catalog.resolve(source).glob(source.glob) if p.is_file())
    return match_files(catalog.root, source.path or "", folder_glob(source.kind))


def _check_paths(catalog: Catalog, source: SourceConfig, origin: str, roots: list[Path]) -> None:
    if source.kind in ("builtin", "hf_dataset") and not source.path:
        if source.hf and source.hf.data_files:
            files = [source.hf.data_files] if isinstance(source.hf.data_files, str) else source.hf.data_files
            for f in files:
                p = (catalog.root / f).resolve()
                if not globlib.glob(str(p)):
                    raise ConfigError(f"{origin}: key 'hf.data_files': {f} matches no file (looked in {catalog.root})")
                if not source.allow_outside_roots and not is_within(p, roots):
                    raise ConfigError(f"{origin}: key 'hf.data_files': {f} is outside the data roots; set allow_outside_roots: true to allow it")
        return
    base = catalog.resolve(source)
    globbed = has_glob(source.path)
    if not globbed and not base.exists():
        raise ConfigError(f"{origin}: key 'path': {source.path} does not exist (resolved to {base})")
    if source.kind == "text_dir" and not base.is_dir():
        raise ConfigError(f"{origin}: key 'path': {source.path} must be a folder for kind 'text_dir'")
    files = source_files(catalog, source)
    if globbed and not files:
        raise ConfigError(f"{origin}: key 'path': glob {source.path} matches no file")
    if not source.allow_outside_roots:
        # Links are resolved, so a symlink pointing outside the roots is caught too.
        for p in [base, *files] if not globbed else files:
            if not is_within(p.resolve(), roots):
                raise ConfigError(
                    f"{origin}: key 'path': {p} resolves outside the data roots ({', '.join(map(str, roots))}); "
                    "set allow_outside_roots: true in this source to allow it"
                )


def load_catalog(
    catalog_dir: Path,
    only: list[str] | None = None,
    data_roots: list[Path] | None = None,
) -> Catalog:
    """Read and validate every `*.yaml` source in `catalog_dir` (not its sub-folders)."""
    catalog_dir = Path(catalog_dir).resolve()
    if not catalog_dir.is_dir():
        raise ConfigError(f"{catalog_dir}: catalog folder not found")
    files = sorted(list(catalog_dir.glob("*.yaml")) + list(catalog_dir.glob("*.yml")))
    if not files:
        raise ConfigError(f"{catalog_dir}: no source definitions (*.yaml) found")
    roots = [r.resolve() for r in (data_roots or [catalog_dir, catalog_dir.parent])]
    sources: list[SourceConfig] = []
    origins: dict[str, str] = {}
    for f in files:
        source = parse_config(SourceConfig, read_yaml(f), str(f))
        if source.name in origins:
            raise ConfigError(f"{f}: key 'name': '{source.name}' is also defined in {origins[source.name]}")
        origins[source.name] = str(f)
        sources.append(source)
    if only:
        unknown = sorted(set(only) - set(origins))
        if unknown:
            raise ConfigError(f"{catalog_dir}: unknown source(s) {unknown}; known: {sorted(origins)}")
        sources = [s for s in sources if s.name in only]
    catalog = Catalog(root=catalog_dir, sources=sources)
    for s in sources:
        _check_paths(catalog, s, origins[s.name], roots)
        _check_filters(s, origins[s.name])
    return catalog


def _check_filters(source: SourceConfig, origin: str) -> None:
    from tasks.data.quality_rules import FilterSpec, validate_filter_spec

    try:
        spec = FilterSpec.model_validate(source.filters)
    except Exception as exc:  # pydantic ValidationError
        raise ConfigError(f"{origin}: key 'filters': {exc}") from None
    validate_filter_spec(spec, f"{origin}: key 'filters'")
