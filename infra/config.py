"""The one config system: pydantic models that reject unknown keys, loaded from YAML.

Every stage defines its own config class (in its module) on top of `StrictModel`;
`flows.config` composes them. Errors name the file and the key.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound="StrictModel")


class ConfigError(ValueError):
    """A config or catalog file is wrong; the message names the file and the key."""


class StrictModel(BaseModel):
    """Base for every typed config: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def format_validation_error(err: ValidationError, origin: str) -> str:
    """Pydantic's error as lines naming `origin` and each wrong key."""
    lines = [f"{origin}: invalid configuration"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  key '{key}': {e['msg']}")
    return "\n".join(lines)


def _read_mapping(path: Path, parse: Callable[[str], Any], errors: tuple[type[Exception], ...], kind: str) -> dict[str, Any]:
    """Parse `path` with `parse`; a ConfigError naming the file when it is missing, not valid `kind`, or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except errors as exc:
        raise ConfigError(f"{path}: not valid {kind}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, with an error naming the file when it is not one."""
    return _read_mapping(path, yaml.safe_load, (yaml.YAMLError,), "YAML")


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, with an error naming the file when it is not one."""
    return _read_mapping(path, json.loads, (json.JSONDecodeError,), "JSON")


def parse_config(cls: type[T], data: dict[str, Any], origin: str) -> T:
    """Validate `data` as `cls`, turning pydantic's error into a ConfigError naming `origin`."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, origin)) from None


def load_config(cls: type[T], path: Path, overrides: dict[str, Any] | None = None) -> T:
    """Load a YAML file as `cls`, applying dotted-key overrides (e.g. {"dedup.threshold": 0.7})."""
    data = read_yaml(path)
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return parse_config(cls, data, str(path))


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `data["a"]["b"] = value` for `dotted` "a.b", creating sections on the way."""
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
    node[parts[-1]] = value


def config_hash(cfg: BaseModel) -> str:
    """A stable short hash of a config, used in cache keys and lineage."""
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:16]


def flatten_params(cfg: BaseModel | dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config into dotted keys for MLflow params."""
    data = cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_params(value, f"{name}."))
        else:
            out[name] = str(value)
    return out
