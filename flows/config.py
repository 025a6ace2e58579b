"""Typed configs of the flows, composed from each stage's own config class.

A preset is a YAML file in `infra/presets/`; `load_pipeline_config` validates it (unknown
keys are errors naming the file and the key) and applies dotted overrides, given as
`key=value` strings by the CLI's `--set` and by the flows' `overrides` parameter alike.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from infra.config import ConfigError, StrictModel, load_config, parse_config, set_dotted
from tasks.eval.evaluate import EvalConfig
from tasks.data.exact_dedup import ExactDedupConfig
from tasks.training.grpo.stage import GrpoStageConfig
from tasks.data.minhash_dedup import NearDedupConfig
from tasks.data.mix import MixConfig
from tasks.data.pii_redact import PiiConfig
from tasks.training.pretrain.stage import PretrainConfig
from tasks.training.sft.stage import SftConfig
from tasks.data.shards import ShardConfig
from tasks.tokenizer.tokenize_shards import TokenizeConfig
from tasks.tokenizer.train import TokenizerConfig

PRESETS_DIR = Path(__file__).resolve().parents[1] / "infra" / "presets"


class DataConfig(StrictModel):
    catalog: Path = Path("data_catalog")
    sources: list[str] | None = None  # only these catalog sources; None = all
    exact: ExactDedupConfig = Field(default_factory=ExactDedupConfig)
    near: NearDedupConfig = Field(default_factory=NearDedupConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    mix: MixConfig = Field(default_factory=MixConfig)
    shards: ShardConfig = Field(default_factory=ShardConfig)


class PretrainStageConfig(StrictModel):
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    train: PretrainConfig = Field(default_factory=PretrainConfig)


class PipelineConfig(StrictModel):
    name: str = "llmforge"
    data: DataConfig = Field(default_factory=DataConfig)
    pretrain: PretrainStageConfig = Field(default_factory=PretrainStageConfig)
    sft: SftConfig = Field(default_factory=SftConfig)
    grpo: GrpoStageConfig = Field(default_factory=GrpoStageConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    registered_model: str = "llmforge-tiny"  # MLflow model registry name of the final model


def preset_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return path
    found = PRESETS_DIR / f"{name}.yaml"
    if not found.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown preset '{name}'; known presets: {known} (or give a path to a YAML file)")
    return found


def load_pipeline_config(preset: str, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    return load_config(PipelineConfig, preset_path(preset), overrides)


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["data.near.threshold=0.7"]` -> `{"data.near.threshold": 0.7}`; values are YAML ("[a, b]" is a list)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{pair}': expected key=value (e.g. data.near.threshold=0.7)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{pair}': value is not valid YAML: {exc}") from None
    return out


def resolve_pipeline_config(config: PipelineConfig | None, preset: str, overrides: list[str] | None) -> PipelineConfig:
    """`config`, else the preset, with `overrides` (`key=value` strings, as `llmforge --set`) applied on top."""
    parsed = parse_overrides(overrides or [])
    if config is None:
        return load_pipeline_config(preset, parsed)
    if not parsed:
        return config
    data = config.model_dump(mode="json")
    for dotted, value in parsed.items():
        set_dotted(data, dotted, value)
    return parse_config(PipelineConfig, data, "overrides")


def resolve_data_config(config: DataConfig | None, preset: str, overrides: list[str] | None) -> DataConfig:
    """The data section of `resolve_pipeline_config`; overrides name pipeline keys (`data.near.threshold=0.7`)."""
    outside = [o for o in overrides or [] if not o.strip().startswith("data.")]
    if outside:
        raise ConfigError(f"overrides {outside}: the data flow only reads keys under 'data.' (e.g. data.near.threshold=0.7)")
    whole = None if config is None else PipelineConfig(data=config)
    return resolve_pipeline_config(whole, preset, overrides).data
