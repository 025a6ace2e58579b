"""Quality rules, grouped into families and named filter sets, configured per source.

A source's catalog entry holds a `FilterSpec`:

    filters:
      filter_set: prose            # prose | code | none
      params:
        gopher_word_count: {min_words: 20}
      disable: [c4_curly_brace]
      c4_mode: judge               # judge | lines (C4 as published: delete lines, then judge)

Rules run in order and the first one that fails removes the document, with the rule's
name as the reason and its measured value as the detail. A rule with a `clean` method
(C4LineFilter) rewrites the documents it keeps, and the rules after it judge the new text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, ValidationError

from infra.config import ConfigError, StrictModel, format_validation_error
from tasks.data.quality_rules.batch import Batch
from tasks.data.quality_rules.c4 import C4, C4_LINES
from tasks.data.quality_rules.code import CODE
from tasks.data.quality_rules.fineweb import FINEWEB
from tasks.data.quality_rules.gopher import GOPHER_QUALITY, GOPHER_REPETITION
from tasks.data.quality_rules.rule import Rule
from tasks.data.quality_rules.text import TextView

FAMILIES: dict[str, list[type[Rule]]] = {
    "gopher_quality": GOPHER_QUALITY,
    "gopher_repetition": GOPHER_REPETITION,
    "c4": C4,
    "c4_lines": C4_LINES,
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
    "FAMILIES", "FILTER_SETS", "RULES", "Batch", "FilterSpec", "Judgement", "Rule", "TextView",
    "Verdict", "build_rules", "first_failure", "judge_batch", "judge_texts", "rule_names", "validate_filter_spec",
]


class FilterSpec(StrictModel):
    """Which rules a source's documents must pass, with per-rule parameter overrides."""

    filter_set: str = "prose"
    params: dict[str, dict[str, ParamValue]] = Field(default_factory=dict)
    disable: list[str] = Field(default_factory=list)
    # How the C4 family runs (tasks/data/quality_rules/c4.py says why judge is the default).
    c4_mode: Literal["judge", "lines"] = "judge"


def families(filter_set: str, c4_mode: str = "judge") -> list[str]:
    """The rule families of a filter set, with C4 in the given mode."""
    swap = {"c4": "c4_lines"} if c4_mode == "lines" else {}
    return [swap.get(f, f) for f in FILTER_SETS[filter_set]]


def rule_names(filter_set: str, c4_mode: str = "judge") -> list[str]:
    """The rule names of a filter set, in the order they run."""
    return [cls.name for family in families(filter_set, c4_mode) for cls in FAMILIES[family]]


def validate_filter_spec(spec: FilterSpec, origin: str) -> None:
    """Raise ConfigError naming `origin` and the bad key: unknown set, rule or parameter, or a bad value."""
    if spec.filter_set not in FILTER_SETS:
        raise ConfigError(
            f"{origin}: key 'filter_set': unknown filter set '{spec.filter_set}'; known: {sorted(FILTER_SETS)}"
        )
    in_set = rule_names(spec.filter_set, spec.c4_mode)
    for key, names in (("disable", spec.disable), ("params", list(spec.params))):
        for name in names:
            if name not in RULES:
                raise ConfigError(f"{origin}: key '{key}': unknown rule '{name}'; known rules: {sorted(RULES)}")
            if name not in in_set:
                raise ConfigError(
                    f"{origin}: key '{key}': rule '{name}' is not in filter set '{spec.filter_set}' "
                    f"(its rules with c4_mode '{spec.c4_mode}': {in_set})"
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
        for name in rule_names(spec.filter_set, spec.c4_mode)
        if name not in disabled
    ]


@dataclass
class Judgement:
    """The verdicts of a batch, and the new text of each document a rule rewrote and kept."""

    verdicts: list[Verdict]
    rewritten: dict[int, str] = field(default_factory=dict)  # index -> new text (kept documents only)
    chars_removed: dict[int, dict[str, int]] = field(default_factory=dict)  # index -> {line rule: chars}


def judge_texts(rules: list[Rule], texts: list[str]) -> Judgement:
    """Judge `texts` under `rules`: each document's first failing rule, batch-wide rule by rule.

    Each rule sees only the documents every earlier rule passed, so a document's verdict is
    that of running the rules one by one, in order, on it alone.
    """
    verdicts: list[Verdict] = [None] * len(texts)
    current = list(texts)
    batch = Batch(current)
    todo = list(range(len(texts)))
    changed: dict[int, dict[str, int]] = {}
    for rule in rules:
        if not todo:
            break
        clean = getattr(rule, "clean", None)
        if clean is None:
            failed = rule.check_batch(batch, todo)
            for i, detail in failed.items():
                verdicts[i] = (rule.name, detail)
            todo = [i for i in todo if i not in failed]
            continue
        rewrote = False
        passed = []
        for i in todo:
            cleaned = clean(current[i])
            if cleaned.text is None:
                verdicts[i] = (cleaned.reason, cleaned.detail)
                continue
            passed.append(i)
            if cleaned.text != current[i]:
                current[i] = cleaned.text
                changed[i] = _add(changed.get(i, {}), cleaned.chars_removed)
                rewrote = True
        todo = passed
        if rewrote:  # later rules judge the rewritten text
            batch.release()
            batch = Batch(current)
    batch.release()
    kept = set(todo)
    return Judgement(
        verdicts,
        {i: current[i] for i in changed if i in kept},
        {i: c for i, c in changed.items() if i in kept},
    )


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}


def first_failure(rules: list[Rule], text: str) -> Verdict:
    """(rule name, detail) of the first rule `text` fails, or None when it passes them all."""
    return judge_texts(rules, [text]).verdicts[0]


def judge_batch(specs: dict[str, FilterSpec], sources: list[str], texts: list[str]) -> Judgement:
    """The judgement of each document under its source's spec (FilterSpec() for a source without one).

    A plain function of picklable arguments, so worker processes can run it.
    """
    by_source: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        by_source.setdefault(source, []).append(i)
    out = Judgement([None] * len(texts))
    for source, idx in by_source.items():
        part = judge_texts(build_rules(specs.get(source, FilterSpec())), [texts[i] for i in idx])
        for j, i in enumerate(idx):
            out.verdicts[i] = part.verdicts[j]
        out.rewritten.update({idx[j]: t for j, t in part.rewritten.items()})
        out.chars_removed.update({idx[j]: c for j, c in part.chars_removed.items()})
    return out
