"""The data funnel: where every collected document ended, per source.

collected = kept + rejected + exact_duplicates + near_duplicates + filtered (each rule),
checked here so a lost or double-counted document fails the run.
"""
from __future__ import annotations

from tasks.data.step import StageResult

FIXED = ("collected", "rejected", "exact_duplicates", "near_duplicates", "filtered", "kept", "sampled_docs", "sampled_rows")


def build_funnel(
    collect: StageResult, exact: StageResult, near: StageResult, quality: StageResult, mix: StageResult
) -> dict[str, dict[str, int]]:
    """Per-source funnel counts from the stage results, with per-rule filter counts."""
    funnel: dict[str, dict[str, int]] = {}
    for source, c in collect.counts.items():
        e, n, q, m = (r.counts.get(source, {}) for r in (exact, near, quality, mix))
        row = {
            "collected": c.get("in", 0),
            "rejected": collect.removed_total(source),
            "exact_duplicates": e.get("exact_duplicate", 0),
            "near_duplicates": n.get("near_duplicate", 0),
        }
        # Anything else a dedup stage removed (e.g. empty after normalisation) is a filter.
        rules = {k: v for k, v in e.items() if k not in ("in", "out", "exact_duplicate")}
        rules.update({k: v for k, v in n.items() if k not in ("in", "out", "near_duplicate")})
        rules.update({k: v for k, v in q.items() if k not in ("in", "out")})
        row["filtered"] = sum(rules.values())
        row["kept"] = q.get("out", 0)
        row["sampled_docs"] = m.get("out", 0)
        row["sampled_rows"] = int(mix.stats.get(f"rows:{source}", 0))
        row.update({f"filtered:{k}": v for k, v in sorted(rules.items())})
        for name, rej in sorted(collect.counts[source].items()):
            if name not in ("in", "out"):
                row[f"rejected:{name}"] = rej
        check_conservation(source, row)
        funnel[source] = row
    return funnel


def check_conservation(source: str, row: dict[str, int]) -> None:
    ended = row["kept"] + row["rejected"] + row["exact_duplicates"] + row["near_duplicates"] + row["filtered"]
    if ended != row["collected"]:
        raise AssertionError(f"source {source}: {row['collected']} collected but {ended} accounted for: {row}")


def funnel_totals(funnel: dict[str, dict[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in funnel.values():
        for k, v in row.items():
            totals[k] = totals.get(k, 0) + v
    return totals


def funnel_markdown(funnel: dict[str, dict[str, int]]) -> str:
    """The funnel as a Markdown table (one row per source plus a total), then per-rule counts."""
    cols = list(FIXED)
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
