"""Source definitions: one YAML file per source in `data_catalog/`, validated before any work.

A mistaken catalog (unknown key, missing path, weights that don't make sense, a path that
escapes the data roots) fails here with an error naming the file and the key.
"""
from __future__ import annotations

import logging
import math
import os
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from infra.config import ConfigError, StrictModel, parse_config, read_yaml
from tasks.data.input_files import file_kind
from tasks.data.quality_rules import FilterSpec, validate_filter_spec

log = logging.getLogger(__name__)
SourceKind = Literal["jsonl", "parquet", "text_dir", "hf_dataset", "builtin"]
BUILTINS = ("python_docs", "python_stdlib")
# Per compressed file. A bomb costs CPU per inflated byte (most of it zlib), so 1 GiB keeps
# one to seconds, while real shards are under it (published
# JSONL.gz shards are typically 0.1-1 GB inflated); a source with bigger ones raises it.
MAX_INFLATED_BYTES = 1 << 30


class HfDatasetOptions(StrictModel):
    """Arguments for `datasets.load_dataset`: a builder ("json", "parquet", "csv", "text") with
    local `data_files`, a local dataset folder (relative to the catalog folder), or, only with
    `from_hub: true`, a hub name (see hf_location)."""

    name: str
    data_files: str | list[str] | None = None
    config: str | None = None
    split: str = "train"
    revision: str | None = None
    from_hub: bool = False  # a name that is no local folder is fetched from the hub only when this is set


# datasets' packaged builders that read local `data_files` (datasets.packaged_modules).
HF_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas", "xml")


def hf_location(opts: HfDatasetOptions, root: Path) -> tuple[str, Path | str]:
    """Where an `hf` source's data is: ("builder", name) for a packaged builder over
    `data_files`, ("local", path) for a folder or file named relative to the catalog folder
    `root` (or absolute), ("hub", name) otherwise. A relative name is never looked up in the
    working directory: there a typo could turn into a hub download."""
    if opts.name in HF_BUILDERS:
        return "builder", opts.name
    local = (root / opts.name).resolve()  # an absolute name stays itself
    if Path(opts.name).is_absolute() or local.exists() or opts.name.startswith((".", "/", "~")) or not opts.from_hub:
        return "local", local
    return "hub", opts.name


def hf_data_files(opts: HfDatasetOptions, root: Path) -> list[Path]:
    """The files `data_files` names, resolved against `root`, globs expanded."""
    files = [opts.data_files] if isinstance(opts.data_files, str) else (opts.data_files or [])
    return [p for f in files for p in match_files(root, f, "**/*")[0]]


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
    # parquet, hf_dataset: a longer string cell is quarantined (cell_too_long) with its first 64 KiB and sha256
    max_cell_bytes: int = Field(default=8 << 20, gt=0)
    # parquet: a row group whose read columns decode past this is quarantined row by row, never read
    max_row_group_bytes: int = Field(default=1 << 30, gt=0)

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

    def weights(self, instead: dict[str, float] | None = None) -> dict[str, float]:
        """Each source's share of the mix: its catalog weight, or `instead`'s for the sources it names
        (`data.mix.weights`), normalised to sum to 1."""
        instead = instead or {}
        unknown = sorted(set(instead) - {s.name for s in self.sources})
        if unknown:
            raise ConfigError(f"data.mix.weights names {unknown}, not sources of the catalog {self.root} "
                             f"(its sources: {[s.name for s in self.sources]})")
        raw = {s.name: instead.get(s.name, s.weight) for s in self.sources}
        total = sum(raw.values())
        if total <= 0:
            raise ConfigError(f"data.mix.weights {instead} leaves every source at weight 0: give one a weight > 0")
        return {name: w / total for name, w in raw.items()}

    def filter_specs(self) -> dict[str, Any]:
        return {s.name: FilterSpec.model_validate(s.filters) for s in self.sources}


def is_within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def has_glob(pattern: str | None) -> bool:
    return any(ch in (pattern or "") for ch in "*?[")


def glob_paths(root: Path, pattern: str) -> list[Path]:
    """What `pattern` (relative to `root`, or absolute) matches. pathlib's `**` does not descend
    into linked folders, so a link to a parent cannot make a file match many times over or
    the walk never end (glob.glob's `**` does both)."""
    full = Path(os.path.expanduser(str(root / pattern)))
    parts = full.parts
    fixed = next(i for i, part in enumerate(parts) if has_glob(part))
    return list(Path(*parts[:fixed]).glob(str(Path(*parts[fixed:]))))


def regular_files(paths: list[Path]) -> tuple[list[Path], int]:
    """(the regular files among `paths`, each real file once, sorted; how many entries were
    skipped: FIFOs, devices, sockets, broken or looping links, second links to one file).
    Folders are not counted: a glob may match them."""
    files: dict[Path, Path] = {}
    skipped = 0
    for p in sorted(paths):
        try:
            mode = p.stat().st_mode  # follows links; a loop raises ELOOP
        except OSError:
            skipped += 1
            continue
        if stat.S_ISDIR(mode):
            continue
        real = p.resolve()
        if not stat.S_ISREG(mode) or real in files:
            skipped += 1
            continue
        files[real] = p
    return sorted(files.values()), skipped


def match_files(root: Path, pattern: str, folder_glob: str) -> tuple[list[Path], int]:
    """(the files `pattern` names under `root`, sorted so every run sees the same order; entries
    skipped, see regular_files): a glob, every `folder_glob` file of a folder, else the path itself."""
    if has_glob(pattern):
        return regular_files(glob_paths(root, pattern))
    base = (root / pattern).resolve()
    if base.is_dir():
        return regular_files(list(base.glob(folder_glob)))
    return [base], 0


def folder_glob(kind: str) -> str:
    """Which files of a folder a file-based source of `kind` reads."""
    return "**/*.parquet" if kind.endswith("parquet") else "**/*.jsonl*"


def source_files(catalog: Catalog, source: SourceConfig) -> list[Path]:
    """The files a file-based source reads, sorted so every run sees the same order."""
    return source_files_skipped(catalog, source)[0]


def source_files_skipped(catalog: Catalog, source: SourceConfig) -> tuple[list[Path], int]:
    """source_files, and how many matched entries were skipped (regular_files)."""
    if source.kind == "text_dir":
        return regular_files(list(catalog.resolve(source).glob(source.glob)))
    return match_files(catalog.root, source.path or "", folder_glob(source.kind))


def check_hf_paths(hf: HfDatasetOptions, root: Path, roots: list[Path], allow_outside: bool, origin: str) -> None:
    """Every path an `hf` block names exists and lies under `roots` (links resolved) unless
    `allow_outside`; a name that is neither a builder nor local needs `from_hub: true`."""
    kind, where = hf_location(hf, root)
    if kind == "builder" and not hf.data_files:
        raise ConfigError(f"{origin}: key 'hf.data_files': builder '{hf.name}' needs data_files (paths relative to {root})")
    if kind == "local":
        if not where.exists():
            raise ConfigError(f"{origin}: key 'hf.name': {hf.name} is no builder ({', '.join(HF_BUILDERS)}) and no local "
                              f"dataset (looked for {where}); set hf.from_hub: true to download it from the hub")
        _check_within(where, hf.name, "hf.name", roots, allow_outside, origin)
    files = [hf.data_files] if isinstance(hf.data_files, str) else (hf.data_files or [])
    for f in files:
        matched, _ = match_files(root, f, "**/*")
        if not matched or not matched[0].exists():
            raise ConfigError(f"{origin}: key 'hf.data_files': {f} matches no file (looked in {root})")
        for p in matched:
            _check_within(p, f, "hf.data_files", roots, allow_outside, origin)


def _check_within(path: Path, named: str, key: str, roots: list[Path], allow_outside: bool, origin: str) -> None:
    # Links are resolved, so a symlink pointing outside the roots is caught too.
    if not allow_outside and not is_within(path.resolve(), roots):
        raise ConfigError(f"{origin}: key '{key}': {named} resolves to {path.resolve()}, outside the data roots "
                          f"({', '.join(map(str, roots))}); set allow_outside_roots: true in this source to allow it")


def _check_paths(catalog: Catalog, source: SourceConfig, origin: str, roots: list[Path]) -> None:
    if source.kind == "builtin":
        return
    if source.kind == "hf_dataset":
        check_hf_paths(source.hf, catalog.root, roots, source.allow_outside_roots, origin)
        return
    base = catalog.resolve(source)
    globbed = has_glob(source.path)
    if not globbed and not base.exists():
        raise ConfigError(f"{origin}: key 'path': {source.path} does not exist (resolved to {base})")
    if source.kind == "text_dir" and not base.is_dir():
        raise ConfigError(f"{origin}: key 'path': {source.path} must be a folder for kind 'text_dir'")
    if not globbed and not base.is_dir() and not base.is_file():  # reading a FIFO would block, a device never end
        raise ConfigError(f"{origin}: key 'path': {source.path} is {file_kind(base.stat().st_mode)}, not a regular file; "
                          "point it at a file or folder")
    files, skipped = source_files_skipped(catalog, source)
    if globbed and not files:
        raise ConfigError(f"{origin}: key 'path': glob {source.path} matches no file")
    if skipped:
        log.warning("%s: key 'path': %s: skipped %d entries that are not regular files (FIFOs, devices, sockets, "
                    "broken or looping links, second links to one file)", origin, source.path, skipped)
    for p in [base, *files] if not globbed else files:
        _check_within(p, str(p), "path", roots, source.allow_outside_roots, origin)


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
    try:
        spec = FilterSpec.model_validate(source.filters)
    except Exception as exc:  # pydantic ValidationError
        raise ConfigError(f"{origin}: key 'filters': {exc}") from None
    validate_filter_spec(spec, f"{origin}: key 'filters'")
