"""Typed configs of the flows, composed from each stage's own config class.

A preset is a YAML file in `infra/presets/`; `load_pipeline_config` validates it (unknown
keys are errors naming the file and the key) and applies dotted overrides, given as
`key=value` strings by the CLI's `--set` and by the flows' `overrides` parameter alike.
A flow's `preset` parameter (set in a deployment, the UI or the API) may only name a preset
or a YAML file inside the checkout or the workspace; the CLI's `--preset` may name any YAML file.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from infra.config import (ConfigError, StrictModel, YamlAliasRefused, flatten_params, format_validation_error,
                          parse_yaml, read_yaml, set_dotted, unknown_key_error)
from infra.run_queue import RunsConfig
from infra.workspace.paths import Workspace
from tasks.data.catalog import load_catalog
from tasks.data.decontaminate import DecontaminateConfig
from tasks.data.exact_dedup import ExactDedupConfig
from tasks.data.holdout import HoldoutConfig
from tasks.data.mix import MixConfig
from tasks.data.near_dedup import NearDedupConfig
from tasks.data.pii_redact import PiiConfig
from tasks.data.shards import ShardConfig
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.config import EvalConfig
from tasks.eval.items import ARITHMETIC, EvalItemsConfig
from tasks.tokenizer.tokenize_shards import TokenizeConfig
from tasks.tokenizer.train import TokenizerConfig
from tasks.training.config import (RENAMED, ArithmeticSftOptions, GrpoConfig, PretrainConfig, SftConfig,
                                   layout_problem, seq_len_problem)
from tasks.training.mix_search import MixSearchConfig
from tasks.training.scaling.config import ScaleConfig

CHECKOUT = Path(__file__).resolve().parents[1]
PRESETS_DIR = CHECKOUT / "infra" / "presets"
PRESET_NAME = re.compile(r"[A-Za-z0-9_-]+")


class QualityConfig(StrictModel):
    enabled: bool = True  # False: the catalog's quality filters are left out (an ablation's "quality off")


class DataConfig(StrictModel):
    catalog: Path = Path("data_catalog")
    sources: list[str] | None = None  # only these catalog sources; None = all
    decontaminate: DecontaminateConfig = Field(default_factory=DecontaminateConfig)
    # What the decontamination matches against: set from eval.tasks, eval.task_paths, arithmetic and
    # data.decontaminate.files when the pipeline's config is read (`eval_items_of`), never by hand
    eval_items: EvalItemsConfig = Field(default_factory=EvalItemsConfig)
    exact: ExactDedupConfig = Field(default_factory=ExactDedupConfig)
    holdout: HoldoutConfig = Field(default_factory=HoldoutConfig)  # a slice of every source set aside, unseen
    near: NearDedupConfig = Field(default_factory=NearDedupConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    mix: MixConfig = Field(default_factory=MixConfig)
    shards: ShardConfig = Field(default_factory=ShardConfig)
    # Where the stages run: "local" (this process, its worker pool) or "ray" (each stage a Ray task,
    # batch jobs spread over the cluster; infra/launch/ray_cluster.py). Outputs are the same either way.
    executor: Literal["local", "ray"] = "local"
    # With executor=ray: None starts a local Ray with this machine's cores; "auto" joins the cluster
    # this machine is part of; "ray://host:10001" (Ray Client) or "host:6379" joins a remote one.
    ray_address: str | None = None

    def outputs_identity(self) -> "DataConfig":
        """This config with the executor fields at their defaults: what the outputs depend on."""
        return self.model_copy(update={"executor": "local", "ray_address": None})


class RegistryConfig(StrictModel):
    """`@champion` moves to a new version only when it beats the champion on `metric` (a metric of the
    pipeline run, e.g. `evaluate/grpo.answer.accuracy`: the final model on the held-out evaluation)."""

    metric: str = "evaluate/grpo.answer.accuracy"
    greater_is_better: bool = True

    @field_validator("metric")
    @classmethod
    def _of_a_stage(cls, metric: str) -> str:
        stages = [*EXPECTED_MINUTES, "pipeline"]  # the parent run's headline metrics (tasks/reports/headline.py)
        if "/" not in metric or metric.split("/", 1)[0] not in stages:
            raise ValueError(f"registry.metric {metric!r} must be <stage>/<metric>, a headline metric of the "
                             f"pipeline run with a stage of {stages}, e.g. evaluate/grpo.answer.accuracy")
        return metric


# The stages of `llmforge run` in order, and their expected minutes on the preset's reference machine, an idle 2-core
# AVX2 machine training in fp32 (BENCHMARKS.md "The first run's time"). SFT's is that machine's time for 600 steps of
# 18 rows scaled to the preset's 400 steps of 36 rows
# (docs/experiments/2026-12-06-dynamic-sampling-and-sft-length.md).
EXPECTED_MINUTES = {"data": 0.2, "pretrain": 4.2, "sft": 2.7, "grpo": 1.5, "evaluate": 0.8}


class PipelineConfig(StrictModel):
    name: str = "llmforge"
    data: DataConfig = Field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    # The arithmetic task SFT, GRPO and the evaluation share: its ops, trained range, abstention range and outer range.
    arithmetic: ArithmeticTask = Field(default_factory=ArithmeticTask)
    sft: SftConfig = Field(default_factory=SftConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)  # `llmforge scale`: the IsoFLOP sweep (flows/scale_flow.py)
    # `llmforge mix`: proxies on sampled mixes, a mixing law, a proposed mix checked over seeds (flows/mix_flow.py); the
    # shares each run trains on are data.mix's
    mix: MixSearchConfig = Field(default_factory=MixSearchConfig)
    runs: RunsConfig = Field(default_factory=RunsConfig)  # how a flow of many runs places them (infra/run_queue.py)
    registered_model: str = "llmforge-tiny"  # MLflow model registry name of the final model
    registry: RegistryConfig = Field(default_factory=RegistryConfig)  # when `@champion` moves
    # Each stage's minutes on the machine the preset was measured on: the run's ETA scales them by this
    # machine's pace as measured so far (infra/lifecycle/clock.py). An estimate only; nothing waits on it.
    expected_minutes: dict[str, float] = Field(default_factory=lambda: dict(EXPECTED_MINUTES))

    @model_validator(mode="after")
    def _the_task_has_what_the_stages_ask(self) -> "PipelineConfig":
        """The sums SFT and GRPO ask of the arithmetic task exist in its ranges, checked before any stage runs."""
        data = self.sft.data
        if data.arithmetic is not None:
            data.arithmetic.check(self.arithmetic)
        elif data.catalog is None and "arithmetic" in data.builtin:
            ArithmeticSftOptions().check(self.arithmetic, "the built-in arithmetic SFT set")
        self.grpo.check_task(self.arithmetic)
        self.data.eval_items = eval_items_of(self)
        for stage in ("sft", "grpo"):  # post-training trains the pretrained model: its shape
            problem = layout_problem(getattr(self, stage).launch, self.pretrain.shape(), stage)
            if problem:
                raise ValueError(problem)
        problem = seq_len_problem(self.sft.batch.seq_len, self.pretrain.shape(), "sft")
        if problem:
            raise ValueError(problem)
        return self

    @field_validator("registered_model")
    @classmethod
    def _a_registry_name(cls, name: str) -> str:
        if not name.strip() or any(c in name for c in "/:%\\") or name != name.strip():
            raise ValueError(f"registered_model {name!r}: MLflow's registry takes a non-empty name without '/', ':', "
                             "'%' or '\\' and without spaces at either end, e.g. llmforge-tiny")
        return name

    @field_validator("mix")
    @classmethod
    def _proxy_is_a_pretraining(cls, mix: MixSearchConfig, info: ValidationInfo) -> MixSearchConfig:
        if "pretrain" in info.data:  # else the pretraining's own error is said
            proxy_pretraining(info.data["pretrain"], mix)
        return mix

    def mix_proxy(self) -> PretrainConfig:
        """The pretraining every `llmforge mix` proxy gets: this config's, with `mix.proxy` applied."""
        return proxy_pretraining(self.pretrain, self.mix)


def eval_items_of(cfg: PipelineConfig) -> EvalItemsConfig:
    """What the data flow decontaminates against: every task the evaluation runs, and the user's files."""
    if not cfg.data.decontaminate.enabled:
        return EvalItemsConfig()
    return EvalItemsConfig(arithmetic=cfg.arithmetic if ARITHMETIC in cfg.eval.tasks else None,
                           tasks=[t for t in cfg.eval.tasks if t != ARITHMETIC], task_paths=cfg.eval.task_paths,
                           files=cfg.data.decontaminate.files)


def proxy_pretraining(pretrain: PretrainConfig, mix: MixSearchConfig) -> PretrainConfig:
    """`pretrain` with `mix.proxy` applied, its keys and values checked as a pretraining's (a ValueError naming them)."""
    data = {"pretrain": pretrain.model_dump()}
    unknown_key_error(PipelineConfig, list(mix.proxy), "mix.proxy key")
    for dotted, value in mix.proxy.items():
        set_dotted(data, dotted, value)
    try:
        return PretrainConfig.model_validate(data["pretrain"])
    except ValidationError as err:
        raise ValueError(format_validation_error(err, f"mix.proxy {mix.proxy}").replace("key '", "key 'pretrain.")) from None


def known_presets() -> list[str]:
    """The preset names in infra/presets/."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml") if PRESET_NAME.fullmatch(p.stem))


def preset_roots(workdir: str | Path | None = None) -> list[Path]:
    """The folders a flow's preset file may lie in: the checkout and the workspace (`Workspace.locate(workdir)`)."""
    return [CHECKOUT, Workspace.locate(workdir).root]


def preset_path(name: str, within: Sequence[Path] | None = None) -> Path:
    """The YAML file of preset `name`: a name in infra/presets/, or a .yaml/.yml path (inside `within`, when given).

    Links are resolved before the check, so a link inside the folders that points outside them is refused.
    """
    name = str(name)
    if PRESET_NAME.fullmatch(name):
        path = PRESETS_DIR / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown preset '{name}'; known presets: {known_presets()} (or give a path to a .yaml file)")
    elif Path(name).suffix in (".yaml", ".yml"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"preset {name}: file not found (or not a regular file); known presets: {known_presets()}")
    else:
        shown = name[:80] + ("..." if len(name) > 80 else "")
        raise ConfigError(f"preset '{shown}' is neither a preset name ([A-Za-z0-9_-]+) nor a .yaml/.yml file; "
                          f"known presets: {known_presets()}")
    if within is not None:
        real, roots = path.resolve(), [Path(r).resolve() for r in within]
        if not any(real.is_relative_to(r) for r in roots):
            raise ConfigError(f"preset {name}: {real} is outside the checkout and the workspace "
                              f"({', '.join(map(str, roots))}); move it inside one of them, or use a preset name: "
                              f"{known_presets()}")
    return path


def load_pipeline_config(preset: str, overrides: dict[str, Any] | None = None,
                         within: Sequence[Path] | None = None) -> PipelineConfig:
    """The preset's config with `overrides` ({dotted key: value}) applied; `within`: see `preset_path`."""
    path = preset_path(preset, within)
    data = read_yaml(path)
    refuse_renamed(_dotted_keys(data), str(path))
    refuse_renamed(list(overrides or {}), "override")
    check_override_keys(list(overrides or {}))
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, _blame(err, path, overrides or {}))) from None


def _blame(err: ValidationError, path: Path, overrides: dict[str, Any]) -> str:
    """Where a validation error came from: the `--set`s when every wrong key is one of theirs, the preset file
    when none is, both when a section's own check failed on a section a `--set` changed (either may be at fault)."""
    blamed, all_theirs = [], True
    for error in err.errors():
        loc = ".".join(map(str, error["loc"]))
        under = [k for k in overrides if loc == k or loc.startswith(k + ".")]
        blamed += under + [k for k in overrides if k.startswith(loc + ".")]
        all_theirs = all_theirs and bool(under)
    sets = " ".join(f"--set {k}={overrides[k]}" for k in dict.fromkeys(blamed))[:300]
    return sets if sets and all_theirs else f"{path} with {sets}" if sets else str(path)


def check_override_keys(keys: Sequence[str]) -> None:
    """A ConfigError naming a `--set` key that PipelineConfig does not have, with the closest keys it has."""
    unknown_key_error(PipelineConfig, keys, "--set key")


def check_paths(cfg: PipelineConfig) -> None:
    """The catalog a config names exists and reads, with data.sources among its sources (a ConfigError naming the
    key otherwise): `llmforge show-config`, and `data`/`run`/`scale` before any work starts."""
    catalog = Path(cfg.data.catalog)
    if not catalog.is_dir():
        shipped = CHECKOUT / catalog
        hint = (f"a relative path is read from the current directory: run from the checkout ({CHECKOUT}) or give "
                f"--set data.catalog={shipped}" if not catalog.is_absolute() and shipped.is_dir() else
                "give the folder of the catalog's source YAML files (--set data.catalog=PATH, or data.catalog in "
                "the preset)")
        raise ConfigError(f"data.catalog {catalog}: no such folder ({catalog.resolve()}); {hint}")

    # Its YAML files valid, data.sources among them, data.mix.weights naming its sources.
    load_catalog(catalog, only=cfg.data.sources).weights(cfg.data.mix.weights)
    for key, paths, kind in (("eval.task_paths", cfg.eval.task_paths, "folder of lm-eval YAML tasks"),
                             ("data.decontaminate.files", cfg.data.decontaminate.files, "JSONL file of items")):
        for path in paths:
            if not (path.is_dir() if kind.startswith("folder") else path.is_file()):
                raise ConfigError(f"{key}: {path} is no {kind} ({Path(path).resolve()}); a relative path is read "
                                  "from the current directory")


# Older keys of the arithmetic task (one section now, which SFT, GRPO and the evaluation read), each with the key
# that replaces it: refused, naming it.
MOVED_TO_ARITHMETIC = {
    "sft.data.arithmetic.max_operand": "arithmetic.max_operand", "sft.data.arithmetic.ops": "arithmetic.ops",
    "sft.data.arithmetic.abstain_max_operand": "arithmetic.abstain_max_operand",
    "grpo.max_operand": "arithmetic.max_operand", "grpo.ops": "arithmetic.ops",
    "grpo.abstain_max_operand": "arithmetic.abstain_max_operand",
    "eval.train_max_operand": "arithmetic.max_operand", "eval.arithmetic_max_operand": "arithmetic.outer_max_operand",
    "eval.arithmetic_ops": "arithmetic.ops",
}
# A setting of one concept under one name in every stage: the evaluation's answer budget is named as GRPO's.
ONE_NAME = {"eval.max_answer_tokens": "eval.max_new_tokens"}


def renamed_key(dotted: str) -> tuple[str, str] | None:
    """Where a key of an older layout went (`sft.lr` -> `sft.optim.lr`, `grpo.max_operand` -> `arithmetic.max_operand`),
    and why; None for a key that was never renamed."""
    for table, why in ((RENAMED, "training configs are composed of batch, optim, launch, checkpoint and log"),
                       (MOVED_TO_ARITHMETIC, "the arithmetic task is one section, read by SFT, GRPO and the evaluation"),
                       (ONE_NAME, "one setting has one name in every stage")):
        for old, new in table.items():
            if dotted == old or dotted.startswith(old + "."):
                return new + dotted[len(old):], why
    if dotted == "pretrain.train" or dotted.startswith("pretrain.train."):
        return "pretrain" + dotted[len("pretrain.train"):], "training configs are composed of batch, optim, launch, checkpoint and log"
    return None


def refuse_renamed(keys: Sequence[str], origin: str) -> None:
    """A ConfigError naming the new key of an old one among `keys` (dotted), the deepest first: it says the most."""
    for dotted in sorted(keys, key=lambda k: -k.count(".")):
        moved = renamed_key(dotted)
        if moved is not None:
            new, why = moved
            raise ConfigError(f"{origin}: key '{dotted}' is now '{new}' ({why}; see infra/presets/tiny.yaml)")


def _dotted_keys(data: Any, prefix: str = "") -> list[str]:
    """Every key path of a nested mapping, leaves and sections alike: {"a": {"b": 1}} -> ["a", "a.b"]."""
    if not isinstance(data, dict):
        return []
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys += [dotted, *_dotted_keys(value, f"{dotted}.")]
    return keys


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["data.near.threshold=0.7"]` -> `{"data.near.threshold": 0.7}`; values are YAML ("[a, b]" is a list)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{pair}': expected key=value (e.g. data.near.threshold=0.7)")
        try:
            out[key.strip()] = parse_yaml(value)
        except YamlAliasRefused as exc:
            raise ConfigError(f"override '{pair}': {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{pair}': value is not valid YAML: {exc}") from None
    return out


def resolve_pipeline_config(config: PipelineConfig | None, preset: str, overrides: list[str] | None,
                            workdir: str | Path | None = None) -> PipelineConfig:
    """The config a flow runs: `config` as given, else the preset with `overrides` (`key=value` strings, as
    `llmforge --set`) applied, once.

    With a `config`, its caller has applied the overrides already (the CLI, the pipeline calling the data
    flow): they only name the MLflow runs, and are checked as keys, never applied a second time.
    `preset` comes from a flow's parameters, so a file must lie inside the checkout or the workspace at `workdir`.
    """
    parsed = parse_overrides(overrides or [])
    refuse_renamed(list(parsed), "override")
    if config is None:
        return load_pipeline_config(preset, parsed, within=preset_roots(workdir))
    check_override_keys(list(parsed))
    return config


# Keys outside `data.` that the data flow reads: what it decontaminates against (`eval_items_of`).
DATA_FLOW_KEYS = ("data.", "eval.tasks", "eval.task_paths", "arithmetic.")


def resolve_data_config(config: DataConfig | None, preset: str, overrides: list[str] | None,
                        workdir: str | Path | None = None) -> DataConfig:
    """The data section of `resolve_pipeline_config`; overrides name pipeline keys (`data.near.threshold=0.7`)."""
    outside = [o for o in overrides or [] if not o.strip().startswith(DATA_FLOW_KEYS)]
    if outside:
        raise ConfigError(f"overrides {outside}: the data flow only reads keys under 'data.' (e.g. "
                          "data.near.threshold=0.7), and eval.tasks, eval.task_paths and arithmetic.*, which it "
                          "decontaminates against")
    if config is not None:  # resolved already, its eval_items with it
        keys = list(parse_overrides(overrides or []))
        refuse_renamed(keys, "override")
        check_override_keys(keys)
        return config
    return resolve_pipeline_config(None, preset, overrides, workdir).data


def preset_differences(config: PipelineConfig, preset: str, workdir: str | Path | None = None) -> dict[str, tuple[str, str]]:
    """`{key: (the preset's value, config's)}` for every key where `config` differs from `preset`; empty when the
    preset cannot be read (a run given a whole config may name no preset of this checkout)."""
    try:
        base = flatten_params(load_pipeline_config(preset, within=preset_roots(workdir)))
    except ConfigError:
        return {}
    mine = flatten_params(config)
    return {k: (base.get(k, "(absent)"), mine.get(k, "(absent)")) for k in sorted(set(base) | set(mine))
            if base.get(k) != mine.get(k)}
