"""An ablation file (`llmforge ablate FILE`): its variants, seeds, targets and proxy, checked before any work.

Torch- and Prefect-free, so that the CLI refuses a bad file at once (flows/cli.py)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from infra.config import ConfigError, StrictModel, check_names, format_validation_error, read_yaml
from tasks.eval.target_files import check_target_file

BASELINE, AA = "baseline", "aa"
# `llmforge ablate` with no FILE: quality filters off, near dedup off and a code-heavy mix against the baseline, on
# the held-out slice of every source, with the A/A check (docs/ablations.md "The built-in ablation").
BUILTIN = Path(__file__).resolve().parents[1] / "infra" / "presets" / "ablations" / "builtin.yaml"


class AblationSpec(StrictModel):
    """An ablation file: the variants, the seeds, what every proxy is scored on."""

    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)  # name -> {dotted key: value}, as --set
    seeds: int = Field(3, ge=1)
    until: Literal["pretrain", "sft", "grpo", "evaluate"] = "pretrain"  # the last stage each variant runs
    # With until: evaluate, keys of the evaluation to compare, `<model>.<metric>` (grpo.answer.accuracy), as a list
    # (the direction known from the metric's name) or a mapping to `higher` or `lower` (which is better)
    metrics: dict[str, Literal["higher", "lower"]] = Field(default_factory=dict)
    # name -> a .jsonl (`text` per line) or .txt, read raw; none: the held-out slice of every source (`holdout`)
    targets: dict[str, Path] = Field(default_factory=dict)
    holdout: float = Field(0.05, gt=0.0, le=0.5)  # with no targets: the share of every source held out and scored
    proxy: dict[str, Any] = Field(default_factory=dict)  # overrides every variant's pretraining gets (model, steps)
    tokenizer: Path | None = None  # a tokenizer.json every variant uses; None: one trained on the baseline's shards
    aa: bool = False  # the baseline again on disjoint seeds: what noise alone does

    @field_validator("variants")
    @classmethod
    def _names(cls, variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, sets in variants.items():
            if name in (BASELINE, AA):
                raise ValueError(f"variant name '{name}' is reserved: the baseline (no overrides) and the A/A check "
                                 "are always there; name your variant otherwise")
            check_names([name], "variant")
            if not isinstance(sets, dict):
                raise ValueError(f"variant '{name}' must map dotted keys to values, e.g. {{data.near.threshold: 0.7}}")
        return variants

    @field_validator("metrics", mode="before")
    @classmethod
    def _directions(cls, metrics: Any) -> Any:
        if isinstance(metrics, list):
            unknown = [m for m in metrics if not isinstance(m, str) or metric_direction(m) is None]
            if unknown:
                raise ValueError(f"metrics {unknown}: which way is better is not known from the name; give a "
                                 f"mapping, e.g. {{{unknown[0]}: lower}}")
            return {m: metric_direction(m) for m in metrics}
        return metrics

    @model_validator(mode="after")
    def _metrics_need_evaluate(self) -> "AblationSpec":
        for key in self.metrics:
            model, _, metric = key.partition(".")
            if model not in MODELS or not metric:
                raise ValueError(f"metric '{key}': name a model ({', '.join(MODELS)}) and a key of its evaluation, "
                                 "e.g. grpo.answer.accuracy")
        if self.metrics and self.until != "evaluate":
            raise ValueError(f"metrics {list(self.metrics)} are the evaluation's: set `until: evaluate`")
        return self

    @field_validator("targets")
    @classmethod
    def _target_names(cls, targets: dict[str, Path]) -> dict[str, Path]:
        check_names(targets, "target")
        return targets

    @model_validator(mode="after")
    def _something_to_compare(self) -> "AblationSpec":
        if not self.variants and not self.aa:
            raise ValueError("no variants and no A/A check: nothing to compare with the baseline; name a variant "
                             "under `variants:` or set `aa: true`")
        return self


MODELS = ("base", "sft", "grpo")  # the evaluation's models, a metric's first part
HIGHER = {"accuracy", "answered_accuracy", "accuracy_at_target", "coverage_at_target", "correct"}
LOWER = {"hallucination_rate", "ece", "ece_equal_mass", "ece_heldout", "ece_after_temperature", "mce", "brier", "nll",
         "aurc", "e_aurc", "val_loss", "val_ppl", "bpb"}


def metric_direction(key: str) -> Literal["higher", "lower"] | None:
    """Which way a metric is better, from its last part; None where the name does not say (abstention_rate)."""
    last = key.rsplit(".", 1)[-1]
    return "higher" if last in HIGHER else "lower" if last in LOWER else None


def load_spec(path: Path) -> AblationSpec:
    """FILE read and checked (a ConfigError saying what to fix); target paths relative to FILE made absolute and
    checked to exist."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"ablation file {path} is a folder; give the YAML file of the variants (docs/ablations.md)")
    if not path.is_file():
        raise ConfigError(f"ablation file {path} does not exist")
    data = read_yaml(path)  # anchors, aliases and keys given twice refused, naming the line
    if not data:
        raise ConfigError(f"{path}: the ablation file is empty; name its variants (docs/ablations.md)")
    try:
        spec = AblationSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, str(path))) from None
    targets = {n: (p if p.is_absolute() else (path.parent / p)).resolve() for n, p in spec.targets.items()}
    missing = [f"{n}: {p}" for n, p in targets.items() if not p.is_file()]
    if missing:
        raise ConfigError(f"{path}: target file(s) not found ({'; '.join(missing)}); paths are absolute or "
                          "relative to the ablation file")
    for name, target in targets.items():
        check_target_file(target, f"{path}: target {name}")
    tokenizer = None
    if spec.tokenizer is not None:
        tokenizer = (spec.tokenizer if spec.tokenizer.is_absolute() else path.parent / spec.tokenizer).resolve()
        if not tokenizer.is_file():
            raise ConfigError(f"{path}: tokenizer {tokenizer} not found; give a tokenizer.json (absolute, or relative "
                              "to the ablation file), or leave `tokenizer` out to train one on the baseline's shards")
    return spec.model_copy(update={"targets": targets, "tokenizer": tokenizer})


def check_metrics(spec: AblationSpec, file: str | Path, tasks: Sequence[str] = ()) -> None:
    """A ConfigError naming the `metrics` the evaluation has no key for; a key under one of eval.tasks `tasks`
    (`grpo.arithmetic.accuracy`) is the task's, known only once lm-eval ran it."""
    if not spec.metrics:
        return
    from tasks.eval.evaluate import metric_names  # torch: only for a file that names metrics

    known = metric_names()
    unknown = sorted(k for k in spec.metrics if k.partition(".")[2] not in known
                     and k.partition(".")[2].partition(".")[0] not in tasks)
    if unknown:
        raise ConfigError(f"{file}: metrics {unknown} are no keys of the evaluation (e.g. grpo.answer.accuracy, "
                          "grpo.answer.hallucination_rate, sft.token.ece; docs/ablations.md)")


def as_overrides(sets: dict[str, Any]) -> list[str]:
    """{key: value} as `--set` strings (values as JSON, which YAML reads back)."""
    import json

    return [f"{k}={json.dumps(v if not isinstance(v, Path) else str(v))}" for k, v in sets.items()]


def variant_overrides(spec: AblationSpec, common: list[str]) -> dict[str, list[str]]:
    """Each variant's `--set` strings, the baseline's first: the hold-out (no targets named), `common` (the command
    line's), the proxy's, its own (later keys win, so a variant's own value beats the command line's)."""
    held = [] if spec.targets else as_overrides({"data.holdout.fraction": spec.holdout})  # the command line's wins
    shared = held + list(common) + as_overrides(spec.proxy)
    return {name: shared + as_overrides(sets) for name, sets in {BASELINE: {}, **spec.variants}.items()}
