"""How far one model's evaluation is: a progress line per part, with an ETA.

A line per part (tokens, answers, choices) at most every `every_s` seconds, with the part's batches
done and an ETA, so minutes of evaluation are never silent.

    progress = EvalProgress("sft", ["tokens", "answers", "choices"])
    token_metrics(..., progress=progress.part("tokens"))      # called as (batches done, batches in all)

The ETA is the part's own (its batches so far, extrapolated): the parts differ too much in cost per
batch (a forward pass, a greedy generation, a teacher-forced option) for one rate to cover them all,
so the line names the parts still to come instead.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from infra.lifecycle.clock import clock_text

Tracker = Callable[[int, int], None]  # (done, total), after each batch


class EvalProgress:
    """The progress lines of one model's evaluation (`label`: its name in the eval flow)."""

    def __init__(self, label: str, parts: list[str], every_s: float = 15.0, out: Callable[[str], Any] = print,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.parts, self.every_s, self.out, self.clock = label, list(parts), every_s, out, clock
        self.started = clock()
        self.out(f"evaluate {label}: {', '.join(self.parts)}")

    def part(self, name: str) -> Tracker:
        """The tracker of part `name`: prints when `every_s` passed since the last line, and when the part ends."""
        began = last = self.clock()
        later = self.parts[self.parts.index(name) + 1:] if name in self.parts else []

        def track(done: int, total: int) -> None:
            nonlocal last
            now = self.clock()
            if done >= total:
                self.out(f"evaluate {self.label}: {name} done ({total} batches in {clock_text(now - began)})"
                         + (f"; next: {', '.join(later)}" if later else ""))
                return
            if now - last < self.every_s or done <= 0:
                return
            last = now
            left = (now - began) / done * (total - done)
            self.out(f"evaluate {self.label}: {name} {done}/{total} batches ({100 * done // total}%), "
                     f"ETA {clock_text(left)} for {name}" + (f", then {', '.join(later)}" if later else ""))

        return track

    def done(self) -> None:
        self.out(f"evaluate {self.label}: finished in {clock_text(self.clock() - self.started)}")
