"""The report card's header: what the run was and what each stage took.

What the run was: infra/tracking/identity.py. What each stage took, reused stages with the wall time of
the run that did their work: infra/tracking/history.py.
"""
from __future__ import annotations

from collections.abc import Sequence

from infra.tracking.history import StageTime
from infra.tracking.identity import RunIdentity


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def identity_lines(identity: RunIdentity) -> list[str]:
    """A two-column table: preset, overrides, what differs from the preset, commit, machine, precision, packages."""
    return ["| this run | |", "|---|---|"] + [f"| {what} | {_cell(value)} |" for what, value in identity.rows()] + [""]


def _minutes(m: float | None) -> str:
    return "-" if m is None else f"{m:.1f} min"


def stage_lines(times: Sequence[StageTime]) -> list[str]:
    """One row per stage: its wall time and whether this run did it or reused an earlier run's output."""
    if not times:
        return []
    lines = ["| stage | wall time | this run |", "|---|---|---|"]
    for t in times:
        done = f"reused the output of run `{t.run_id[:12]}`" if t.reused else "ran"
        lines.append(f"| {t.stage} | {_minutes(t.minutes)} | {done} |")
    return lines + [""]


def wall_row(wall_seconds: float, all_attempts: tuple[float, int] | None, times: Sequence[StageTime] = ()) -> str:
    """The headline's wall time: this run's (all its attempts), and, when stages were reused, what their work took."""
    total, n = all_attempts or (wall_seconds, 1)
    if n <= 1:
        row = f"| pipeline wall time | {wall_seconds / 60:.1f} min"
    else:
        row = (f"| pipeline wall time, {n} attempts of this config (last attempt) | {total / 60:.1f} min "
               f"({wall_seconds / 60:.1f} min)")
    reused = [t for t in times if t.reused]
    if reused:
        work = sum(t.minutes or 0.0 for t in times)
        names = ", ".join(t.stage for t in reused)
        row += (f"; reused {len(reused)} of {len(times)} stages ({names}) from earlier runs: "
                f"the stages' own wall times sum to {work:.1f} min")
    return row + " |"
