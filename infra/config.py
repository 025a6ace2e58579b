"""The one config system: pydantic models that reject unknown keys, loaded from YAML.

Every stage defines its own config class (in its module) on top of `StrictModel`;
`flows.config` composes them. Errors name the file and the key.

YAML is read without anchors and aliases (`&name`, `*name`): a few hundred bytes of nested
aliases expand into billions of values ("billion laughs"), and config files have no need of them.
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
    """Base for every typed config: unknown keys are errors, every float is finite, values are validated on assignment."""

    # allow_inf_nan=False: `lr: 1e400` or `.nan` would otherwise pass as inf/nan and fail hours later.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


SHOWN_CHARS = 80  # of a wrong key or value in an error message


def _shown(value: Any) -> str | None:
    """A short printable form of a scalar input for an error message; None for anything else."""
    if isinstance(value, str):
        return repr(value[:SHOWN_CHARS]) + ("..." if len(value) > SHOWN_CHARS else "")
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):  # a huge int has no repr (sys.set_int_max_str_digits)
        return repr(value) if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
    return None  # containers and models: their repr can be huge, so only the key is named


def format_validation_error(err: ValidationError, origin: str) -> str:
    """Pydantic's error as lines naming `origin`, each wrong key and (shortened) the value it got."""
    lines = [f"{origin}: invalid configuration"]
    for e in err.errors():
        key = ".".join(str(p)[:SHOWN_CHARS] for p in e["loc"]) or "<root>"
        value = e.get("input")
        got = _shown(value) if e["type"] != "missing" else None
        if isinstance(value, str) and value in e["msg"]:
            got = None  # the message already shows it
        lines.append(f"  key '{key}': {e['msg']}" + (f" (got {got})" if got is not None else ""))
    return "\n".join(lines)


class YamlAliasRefused(yaml.YAMLError):
    """A YAML anchor or alias, which config files may not use."""


class _SafeNoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases as the parser meets them, before anything is built."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            sign, what = ("*", "alias") if isinstance(event, yaml.AliasEvent) else ("&", "anchor")
            raise YamlAliasRefused(
                f"line {event.start_mark.line + 1}: YAML {what} '{sign}{anchor[:SHOWN_CHARS]}' is not accepted "
                "(anchors and aliases are refused in config files); write the values out in full"
            )
        return super().compose_node(parent, index)


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load` without anchors and aliases (YamlAliasRefused, naming the line)."""
    return yaml.load(text, Loader=_SafeNoAliasLoader)  # a SafeLoader subclass


def _read_mapping(path: Path, parse: Callable[[str], Any], errors: tuple[type[Exception], ...], kind: str) -> dict[str, Any]:
    """Parse `path` with `parse`; a ConfigError naming the file when it is missing, not valid `kind`, or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except YamlAliasRefused as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:  # a binary file, or another encoding
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8 {kind}") from None
    except errors as exc:
        raise ConfigError(f"{path}: not valid {kind}: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, with an error naming the file when it is not one."""
    return _read_mapping(path, parse_yaml, (yaml.YAMLError,), "YAML")


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
