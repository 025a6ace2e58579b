"""The data funnel: where every collected document ended, per source.

collected = kept + rejected + contaminated (each task) + held_out + exact_duplicates + near_duplicates
+ filtered (each rule),
checked here so a lost or double-counted document fails the run. The columns and reasons
come from the stage results, so a new rule or stage reason shows up without an edit here.
"""
from __future__ import annotations

from tasks.data.step import StageResult, check_conservation

PLACES = {"held_out": "held_out"}  # a place reason whose column is not its plural


def build_funnel(
    collect: StageResult, exact: StageResult, near: StageResult | None, quality: StageResult | None, mix: StageResult,
    holdout: StageResult | None = None, decontaminate: StageResult | None = None,
) -> dict[str, dict[str, int]]:
    """Per-source funnel counts from the stage results, with per-reason counts.

    The columns come from what the stages report: collect's removals are "rejected", a stage's place
    reason gets its own column ("held_out", "exact_duplicates", ...), the decontamination's removals are
    "contaminated", with one "contaminated:<task>" column per task, and every other removal of the dedup and
    filter stages is "filtered", with one "filtered:<reason>" column per reason. A stage the recipe turned off
    (near dedup, the quality filters) or left out (no hold-out, no task to decontaminate against) is None."""
    between = [s for s in (holdout, exact, near, quality) if s is not None]  # exact always runs: the last kept
    funnel: dict[str, dict[str, int]] = {}
    for source, c in collect.counts.items():
        row = {"collected": c.get("in", 0), "rejected": collect.removed_total(source)}
        if decontaminate is not None:
            tasks = decontaminate.reasons(source)
            row["contaminated"] = sum(tasks.values())
            row.update(sorted(tasks.items()))  # "contaminated:<task>": the reason as the stage gave it
        rules: dict[str, int] = {}
        for stage in between:
            reasons = stage.reasons(source)
            if stage.duplicate_reason is not None:
                reason = stage.duplicate_reason
                row[PLACES.get(reason, f"{reason}s")] = reasons.pop(reason, 0)
            rules.update(reasons)
        row["filtered"] = sum(rules.values())
        row["kept"] = between[-1].counts.get(source, {}).get("out", 0)
        row["sampled_docs"] = mix.counts.get(source, {}).get("out", 0)
        row["sampled_rows"] = int(mix.stats.get(f"rows:{source}", 0))
        row.update({f"filtered:{k}": v for k, v in sorted(rules.items())})
        row.update({f"rejected:{k}": v for k, v in sorted(collect.reasons(source).items())})
        if quality is not None:
            row.update(chars_removed(quality, source))
        shrunk = mix.report.get("shrunk_below_half", {}).get(source)
        if shrunk is not None:  # a detail column (it has a colon): not a place documents end in
            row["mix:shrunk_below_half"] = 1  # the share kept is in the mix report and the log line
        ended = [v for k, v in row.items() if ":" not in k and k not in ("collected", "sampled_docs", "sampled_rows")]
        check_conservation(f"source {source}", row["collected"], ended, row)
        funnel[source] = row
    return funnel


def chars_removed(quality: StageResult, source: str) -> dict[str, int]:
    """Characters that page-rewriting rules (C4 as published) deleted from `source`'s kept
    documents, per rule: {"chars_removed:<rule>": n}."""
    out = {}
    for key, n in quality.stats.items():
        parts = key.split(":")
        if len(parts) == 3 and parts[0] == "chars_removed" and parts[2] == source:
            out[f"chars_removed:{parts[1]}"] = int(n)
    return dict(sorted(out.items()))


def funnel_columns(funnel: dict[str, dict[str, int]]) -> list[str]:
    """The funnel's summary columns (not the per-reason detail), in order."""
    return list(dict.fromkeys(k for row in funnel.values() for k in row if ":" not in k))


def funnel_totals(funnel: dict[str, dict[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in funnel.values():
        for k, v in row.items():
            totals[k] = totals.get(k, 0) + v
    return totals


def funnel_markdown(funnel: dict[str, dict[str, int]]) -> str:
    """The funnel as a Markdown table (one row per source plus a total), then per-rule counts."""
    cols = funnel_columns(funnel)
    lines = ["| source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    rows = dict(funnel)
    rows["**total**"] = funnel_totals(funnel)
    for source, row in rows.items():
        lines.append(f"| {source} | " + " | ".join(str(row.get(c, 0)) for c in cols) + " |")
    detail = sorted({k for row in funnel.values() for k in row if ":" in k})
    if detail:
        lines += ["", "| reason | " + " | ".join(funnel) + " |", "|---" * (len(funnel) + 1) + "|"]
        for k in detail:
            lines.append(f"| {k} | " + " | ".join(str(funnel[s].get(k, 0)) for s in funnel) + " |")
    return "\n".join(lines)
