"""`llmforge runs` as text: the workspace's runs grouped by pipeline run, and `--diff` of two runs' config.

A pipeline run comes first, its stage runs indented under it in the order they ran (MLflow's
`mlflow.parentRunId` tag); pipeline runs newest first. Each line: id, start, status, wall
time, name, what varied (the run name's override suffix, else its description) and the
headline metric, then the output folders it names and their size on disk.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from infra.tracking.index import NOTE_TAG, RunSummary, run_params, summaries
from infra.workspace.paths import Workspace, mlflow_command

INDENT = "    "
VARIED_CHARS = 48


def _tree(runs: list[RunSummary]) -> Iterator[tuple[int, RunSummary]]:
    """(depth, run) depth first: top-level runs newest first, each one's children oldest first."""
    ids = {r.run_id for r in runs}
    children: dict[str, list[RunSummary]] = {}
    for run in runs:
        if run.parent_id in ids:
            children.setdefault(run.parent_id, []).append(run)

    def walk(run: RunSummary, depth: int) -> Iterator[tuple[int, RunSummary]]:
        yield depth, run
        for child in sorted(children.get(run.run_id, []), key=lambda r: r.start_ms or 0):
            yield from walk(child, depth + 1)

    for run in runs:  # newest first already
        if run.parent_id not in ids:
            yield from walk(run, 0)


def what_varied(run: RunSummary) -> str:
    """The run name's override suffix (`pipeline near.threshold=0.7` -> `near.threshold=0.7`), else its description."""
    stage = run.tags.get("llmforge.stage")
    head, _, suffix = run.name.partition(" ")
    if suffix and (stage is None or head == stage):
        return suffix
    if run.tags.get("llmforge.repeat_of"):
        return f"repeat of {run.tags['llmforge.repeat_of'][:12]}"
    # The description's first sentence says the preset and what differs (infra/tracking/identity.py); the commit
    # and machine after it are not what varied, and cut at the column's width they read as noise.
    note = " ".join(run.tags.get(NOTE_TAG, "").split()).partition(". Commit ")[0]
    return note[:VARIED_CHARS] + ("..." if len(note) > VARIED_CHARS else "")


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ms / 1000)) if ms else "-"


def _took(run: RunSummary) -> str:
    if not run.start_ms or not run.end_ms:
        return "-"
    minutes = (run.end_ms - run.start_ms) / 60_000
    return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


class FolderSizes:
    """Bytes of each output folder, each measured once: many runs name the same folder."""

    def __init__(self, root: Path) -> None:
        self.root, self.known = root, {}

    def __call__(self, rel: str) -> int | None:
        if rel not in self.known:
            folder = self.root / rel
            self.known[rel] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()) \
                if folder.is_dir() else None
        return self.known[rel]


def run_line(run: RunSummary, depth: int, sizes: FolderSizes, varied_width: int = VARIED_CHARS) -> str:
    headline = run.headline
    cols = [f"{INDENT * depth}{run.run_id[:12]}", _when(run.start_ms), f"{run.status:<8}", f"{_took(run):>9}",
            f"{run.name.partition(' ')[0]:<14}", f"{what_varied(run):<{varied_width}}",
            f"{headline[0]} {headline[1]:.4g}" if headline else ""]
    if run.outputs:
        found = [s for s in map(sizes, run.outputs) if s is not None]
        size = f"{_mb(sum(found))}" + (f", {len(run.outputs) - len(found)} removed" if len(found) < len(run.outputs) else "")
        cols.append(f"[{len(run.outputs)} output(s), {size}]")
    return "  ".join(cols).rstrip()


def render_runs(ws: Workspace, show_outputs: bool = False) -> list[str]:
    """The listing's lines: a header, the runs (a blank line between pipeline runs), a footer."""
    runs = summaries(ws)
    sizes = FolderSizes(ws.root)
    width = max((len(what_varied(r)) for r in runs), default=0)
    lines = [f"runs of workspace {ws.root}, newest first (stage runs indented under their pipeline run):"]
    for depth, run in _tree(runs):
        if depth == 0 and len(lines) > 1:
            lines.append("")
        lines.append(run_line(run, depth, sizes, width))
        for rel in run.outputs if show_outputs else []:
            lines.append(f"{INDENT * (depth + 1)}{ws.root / rel}{'' if sizes(rel) is not None else '  (removed)'}")
    lines.append(f"{len(runs)} run(s); `llmforge runs --diff A B` compares two runs' config; see them in the MLflow UI: "
                 f"{mlflow_command()} ui --backend-store-uri {_store_uri(ws)}")
    return lines


def _store_uri(ws: Workspace) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def render_diff(ws: Workspace, run_a: str, run_b: str) -> list[str]:
    """`key: a -> b` for every config key that differs between two runs (ids or unique prefixes)."""
    (a, pa), (b, pb) = run_params(ws, run_a), run_params(ws, run_b)
    unset = "(not set)"
    keys, apart = set(pa) | set(pb), []
    stage_a, stage_b = (r.tags.get("llmforge.stage") or r.name.partition(" ")[0] for r in (a, b))
    if stage_a != stage_b:
        # A pipeline run against one of its stages (or two stages): the keys only one of them has belong to the other
        # stages, not to a difference between the runs; compare the keys both have.
        keys = set(pa) & set(pb)
        apart = [f"{len(p) - len(keys)} key(s) only the {stage} run has, not compared"
                 for stage, p in ((stage_a, pa), (stage_b, pb)) if len(p) > len(keys)]
    rows = [f"{k}: {pa.get(k, unset)} -> {pb.get(k, unset)}" for k in sorted(keys) if pa.get(k) != pb.get(k)]
    return [f"{a.run_id[:12]} ({a.name}) -> {b.run_id[:12]} ({b.name})", *rows, *apart,
            f"{len(rows)} config key(s) differ"]
