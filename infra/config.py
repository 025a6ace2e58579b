"""The one config system: pydantic models that reject unknown keys, loaded from YAML.

Every stage defines its own config class (in its module) on top of `StrictModel`;
`flows.config` composes them. Errors name the file and the key.

YAML is read without anchors and aliases (`&name`, `*name`): a few hundred bytes of nested
aliases expand into billions of values ("billion laughs"), and config files have no need of them.
"""
from __future__ import annotations

import difflib
import re
import hashlib
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
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
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a name a user gives (a variant, a target): also a file name


def check_names(names: typing.Iterable[str], what: str) -> None:
    """A ValueError naming the `what` names that NAME refuses."""
    bad = [n for n in names if not NAME.match(n)]
    if bad:
        raise ValueError(f"{what} names {bad}: use letters, digits, '_', '-' or '.'")


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
    """A YAML anchor or alias, or a key given twice, which config files may not have."""


class _SafeNoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases as the parser meets them, before anything is built, and a mapping
    that names a key twice (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise YamlAliasRefused(f"line {key_node.start_mark.line + 1}: key '{str(key)[:SHOWN_CHARS]}' is given "
                                       "twice in one mapping; keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)

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


def config_keys(cls: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Every dotted key of a config class, sections included, each with its kind: "section" (a config class),
    "mapping" (free keys below it, e.g. grpo.rewards.<name>) or "value"."""
    keys: dict[str, str] = {}
    for name, info in cls.model_fields.items():
        dotted = f"{prefix}{name}"
        section = _config_class(info.annotation)
        keys[dotted] = "section" if section else "mapping" if _is_mapping(info.annotation) else "value"
        if section is not None:
            keys.update(config_keys(section, f"{dotted}."))
    return keys


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _config_class(annotation: Any) -> type[BaseModel] | None:
    """The config class of a field typed `Cls` or `Cls | None`, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_config_class, typing.get_args(annotation))), None) if _is_union(annotation) else None


def _is_mapping(annotation: Any) -> bool:
    if annotation is dict or typing.get_origin(annotation) in (dict, Mapping):
        return True
    return _is_union(annotation) and any(map(_is_mapping, typing.get_args(annotation)))


def unknown_key_error(cls: type[BaseModel], keys: Sequence[str], what: str = "key") -> None:
    """A ConfigError for the first dotted key `cls` does not have, naming the closest keys it has (difflib)."""
    known = config_keys(cls)
    for key in keys:
        parts = key.split(".")
        # Keys below a mapping are the mapping's own (grpo.rewards.<name>): its validator checks them.
        if key in known or any(known.get(".".join(parts[:i])) == "mapping" for i in range(1, len(parts))):
            continue
        close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else "`llmforge show-config` prints every key"
        raise ConfigError(f"{what} '{key[:SHOWN_CHARS]}' is not a config key; {hint}")


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
