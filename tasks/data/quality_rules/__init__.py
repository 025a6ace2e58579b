"""Quality rules, grouped into families and named filter sets, configured per source.

A source's catalog entry holds a `FilterSpec`:

    filters:
      filter_set: prose            # prose | code | none
      params:
        gopher_word_count: {min_words: 20}
      disable: [c4_curly_brace]

Rules run in order and the first one that fails removes the document, with the rule's
name as the reason and its measured value as the detail.
"""
from __future__ import annotations

from pydantic import Field, ValidationError

from infra.config import ConfigError, StrictModel, format_validation_error
from tasks.data.quality_rules.c4 import C4
from tasks.data.quality_rules.code import CODE
from tasks.data.quality_rules.fineweb import FINEWEB
from tasks.data.quality_rules.gopher import GOPHER_QUALITY, GOPHER_REPETITION
from tasks.data.quality_rules.rule import Rule, TextView

FAMILIES: dict[str, list[type[Rule]]] = {
    "gopher_quality": GOPHER_QUALITY,
    "gopher_repetition": GOPHER_REPETITION,
    "c4": C4,
    "fineweb": FINEWEB,
    "code": CODE,
}
FILTER_SETS: dict[str, list[str]] = {
    "prose": ["gopher_quality", "gopher_repetition", "c4", "fineweb"],
    "code": ["code"],
    "none": [],
}
RULES: dict[str, type[Rule]] = {cls.name: cls for family in FAMILIES.values() for cls in family}

Verdict = tuple[str, str] | None  # (rule name, detail) of the first failing rule
ParamValue = float | int | bool | str | list[str]

__all__ = [
    "FAMILIES", "FILTER_SETS", "RULES", "FilterSpec", "Rule", "TextView",
    "Verdict", "build_rules", "first_failure", "judge_batch", "rule_names", "validate_filter_spec",
]


class FilterSpec(StrictModel):
    """Which rules a source's documents must pass, with per-rule parameter overrides."""

    filter_set: str = "prose"
    params: dict[str, dict[str, ParamValue]] = Field(default_factory=dict)
    disable: list[str] = Field(default_factory=list)


def rule_names(filter_set: str) -> list[str]:
    """The rule names of a filter set, in the order they run."""
    return [cls.name for family in FILTER_SETS[filter_set] for cls in FAMILIES[family]]


def validate_filter_spec(spec: FilterSpec, origin: str) -> None:
    """Raise ConfigError naming `origin` and the bad key: unknown set, rule or parameter, or a bad value."""
    if spec.filter_set not in FILTER_SETS:
        raise ConfigError(
            f"{origin}: key 'filter_set': unknown filter set '{spec.filter_set}'; known: {sorted(FILTER_SETS)}"
        )
    in_set = rule_names(spec.filter_set)
    for key, names in (("disable", spec.disable), ("params", list(spec.params))):
        for name in names:
            if name not in RULES:
                raise ConfigError(f"{origin}: key '{key}': unknown rule '{name}'; known rules: {sorted(RULES)}")
            if name not in in_set:
                raise ConfigError(
                    f"{origin}: key '{key}': rule '{name}' is not in filter set '{spec.filter_set}' "
                    f"(its rules: {in_set})"
                )
    for name, overrides in spec.params.items():
        try:
            RULES[name].Params.model_validate(overrides)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, f"{origin}: key 'params.{name}'")) from None


def build_rules(spec: FilterSpec) -> list[Rule]:
    """The configured rules of `spec`, in order, with disabled ones left out."""
    validate_filter_spec(spec, "filter spec")
    disabled = set(spec.disable)
    return [
        RULES[name](RULES[name].Params.model_validate(spec.params.get(name, {})))
        for name in rule_names(spec.filter_set)
        if name not in disabled
    ]


def first_failure(rules: list[Rule], text: str) -> Verdict:
    """(rule name, detail) of the first rule `text` fails, or None when it passes them all."""
    view = TextView(text)
    for rule in rules:
        detail = rule.check_view(view)
        if detail is not None:
            return rule.name, detail
    return None


def judge_batch(specs: dict[str, FilterSpec], sources: list[str], texts: list[str]) -> list[Verdict]:
    """The verdict of each document under its source's spec (FilterSpec() for a source without one).

    A plain function of picklable arguments, so worker processes can run it.
    """
    rules: dict[str, list[Rule]] = {}
    out: list[Verdict] = []
    for source, text in zip(sources, texts):
        if source not in rules:
            rules[source] = build_rules(specs.get(source, FilterSpec()))
        out.append(first_failure(rules[source], text))
    return out
